"""Inside a built image, on CPU (no GPU needed): the stack imports and verl_ext's registrations are where verl looks.

    docker run --rm -i verl-ext:gpu python - gpu < docker/check_image.py     (scripts/build_images.sh --check)
    docker run --rm -i verl-ext:cpu python - cpu < docker/check_image.py

Prints one line per package and exits non-zero, with the reason, on the first thing missing.
"""

import importlib.metadata as md
import importlib.util
import sys

import torch
import verl  # noqa: F401  (loads verl_ext through the verl.plugins entry point)
from verl.workers.rollout.replica import get_rollout_replica_class

import verl_ext
from verl_ext.registration import check_registered

IMAGES = {
    # image: (torch build, pinned versions)
    "cpu": ("cpu", {"torch": "2.13.0+cpu", "verl": "0.9.1"}),
    "gpu": ("cuda", {"torch": "2.11.0", "verl": "0.9.1", "vllm": "0.24.0"}),
}


def main(image: str) -> None:
    build, pins = IMAGES[image]
    for name, pinned in pins.items():
        installed = md.version(name)
        assert installed.split("+")[0] == pinned.split("+")[0], f"{name} {installed}, pinned {pinned}"
        print(f"{name:10} {installed}")
    cuda = torch.version.cuda
    assert (cuda is None) == (build == "cpu"), f"torch {torch.__version__} is not the {build} build"
    print(f"{'torch':10} built for {'CUDA ' + cuda if cuda else 'CPU'}; GPU visible: {torch.cuda.is_available()}")
    check_registered()
    print(f"{'verl_ext':10} {md.version('verl_ext')} from {verl_ext.__path__[0]}: registered in verl")
    if image == "gpu":
        check_gpu_stack()


def check_gpu_stack() -> None:
    import vllm

    replica = get_rollout_replica_class("vllm")  # verl_ext's vLLM server: imports vLLM's engine side
    from verl_ext.vllm.proposer import NgramRLProposer  # what vLLM loads in its workers for ngram_rl

    from torch.nn.attention.flex_attention import flex_attention  # noqa: F401  (grouped_attention=flex, auto)
    from verl_ext.attention.kernels import flex  # noqa: F401
    from verl_ext.workers.grouped_engine import register_grouped_engines

    register_grouped_engines()
    print(f"{'vllm':10} {vllm.__version__}: rollout replica {replica.__module__}.{replica.__name__}, "
          f"proposer {NgramRLProposer.__name__}")
    flash = importlib.util.find_spec("flash_attn") is not None
    print(f"{'attention':10} FlexAttention imports; grouped_attention=auto takes "
          f"{'flash-attn' if flash else 'FlexAttention (flash-attn not installed)'} on CUDA")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
