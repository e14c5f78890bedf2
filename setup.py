"""speculative: exact speculative decoding (Leviathan et al., ICML 2023) in JAX/Flax."""

import setuptools

JAX_VERSION = "0.10.2"  # the release CI tests (constraints.txt pins the same)

setuptools.setup(
    name="speculative",
    version="0.1.0",
    description="Speculative decoding for T5X-style Transformers in JAX/Flax",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["speculative", "speculative.*"]),
    include_package_data=True,
    package_data={"speculative": ["data/**/*"]},
    install_requires=[
        "jax>=0.10",
        "flax>=0.12",
        "optax>=0.2",
        "orbax-checkpoint>=0.6",
        "tensorstore>=0.1.60",
        "gin-config>=0.5",
        "seqio>=0.0.19",
        "numpy>=1.26",
        "ml-dtypes>=0.4",
        "msgpack>=1.0",
        "sentencepiece>=0.2",
        "safetensors>=0.4",
        "absl-py>=2.0",
        "tqdm>=4.60",
        "sacrebleu>=2.3",
        "rouge-score>=0.1.2",
        "matplotlib>=3.7",
    ],
    extras_require={
        # Accelerators: the JAX release CI tests (constraints.txt), built for the device.
        "tpu": [f"jax[tpu]=={JAX_VERSION}"],
        "cuda": [f"jax[cuda12]=={JAX_VERSION}"],  # NVIDIA driver >= 525 (CUDA 12)
        "cuda13": [f"jax[cuda13]=={JAX_VERSION}"],  # NVIDIA driver >= 580 (CUDA 13)
        "test": [
            "pytest>=8",
            "ruff>=0.6",
            "pytest-timeout>=2",
            "pytest-xdist>=3",
            "chex>=0.1.86",
            "hypothesis>=6",
            "scipy>=1.11",
            "torch==2.13.0",
            "transformers>=4.40",
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6",
        ],
    },
)
