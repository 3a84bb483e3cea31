"""A CPU device platform for verl 0.9.1, which ships only cuda, npu and rocm.

Registered under the platform name ``cpu`` through ``PlatformRegistry``. verl's auto-detection probes the
accelerator platforms first, so a machine with a GPU keeps getting CUDA; ``VERL_PLATFORM=cpu`` forces this one.

Training ranks are scheduled on a logical Ray resource named ``GPU`` (one "slot" per rank), because verl's
resource-pool check counts only GPU/NPU resources. ``verl_ext.main`` declares those slots when it starts a
local cluster; ``ray start --num-gpus=N`` does it for a cluster started by hand.
"""

import contextlib
import os
from types import ModuleType
from typing import Any, Optional

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

# Ray's logical resource that stands for one training rank on a CPU node.
CPU_SLOT_RESOURCE = "GPU"


def training_threads() -> int:
    """Torch threads for a training rank: the cores this process may run on, shared among the node's ranks (what
    verl's Ray worker group sets as RAY_LOCAL_WORLD_SIZE; torchrun's LOCAL_WORLD_SIZE), at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ranks = os.environ.get("RAY_LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or "1"
    return max(1, cores // max(1, int(ranks)))


class _CPUDeviceModule(ModuleType):
    """The subset of ``torch.cuda``'s API that verl calls on its device module, as CPU no-ops."""

    def __init__(self):
        super().__init__("verl_ext_cpu_device")

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> torch.device:
        return torch.device("cpu")

    def set_device(self, device) -> None:
        pass

    def synchronize(self, device=None) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def memory_allocated(self, device=None) -> int:
        return 0

    def memory_reserved(self, device=None) -> int:
        return 0

    def max_memory_allocated(self, device=None) -> int:
        return 0

    def max_memory_reserved(self, device=None) -> int:
        return 0

    def reset_peak_memory_stats(self, device=None) -> None:
        pass

    def mem_get_info(self, device=None) -> tuple[int, int]:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        free = os.sysconf("SC_AVPHYS_PAGES") * page_size
        return free, pages * page_size

    def get_rng_state(self, device=None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state, device=None) -> None:
        torch.set_rng_state(state)

    def get_device_name(self, device=None) -> str:
        return "cpu"

    def Stream(self, *args, **kwargs):  # noqa: N802 (mirrors torch.cuda.Stream)
        return contextlib.nullcontext()

    def current_stream(self, device=None):
        return _NullStream()

    def stream(self, stream=None):
        return contextlib.nullcontext()


class _NullStream:
    def synchronize(self) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl platform for CPU-only hosts: gloo collectives, logical Ray slots for ranks."""

    _device_module = _CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Probed after verl's accelerator platforms, so reaching here means none of them is present.
        return True

    def current_device(self) -> torch.device:
        # verl passes this straight to ``.to(...)``/``torch.device(...)``; the int 0 would mean cuda:0.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: Optional[int] = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return CPU_SLOT_RESOURCE

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
