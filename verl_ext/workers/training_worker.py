"""verl's ``TrainingWorker`` (actor, reference, critic engine host) on the CPU platform too, and with the
shared-prefix engine when asked for it."""

import torch.distributed
from verl.utils.device import get_device_name
from verl.workers.engine_workers import TrainingWorker as VerlTrainingWorker

from verl_ext.workers.cpu_engines import register_cpu_engines


class TrainingWorker(VerlTrainingWorker):
    def __init__(self, config, use_prefix_grouper: bool = False):
        if get_device_name() == "cpu":
            register_cpu_engines()
            # verl would ask for "cpu:gloo,cpu:gloo", which torch rejects as a duplicate device type.
            if not torch.distributed.is_initialized():
                torch.distributed.init_process_group(backend="gloo")
        if use_prefix_grouper:
            from verl_ext.workers.grouped_config import with_grouped_engine
            from verl_ext.workers.grouped_engine import register_grouped_engines

            register_grouped_engines()
            config = with_grouped_engine(config)  # verl's TrainingWorker builds the engine its strategy names
        super().__init__(config)
