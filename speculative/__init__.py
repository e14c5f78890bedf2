"""speculative: exact speculative decoding for T5X-style Transformers in JAX/Flax."""

__version__ = "0.1.0"
