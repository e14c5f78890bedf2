"""Checkpoints: T5X legacy and Orbax (`t5x`), Hugging Face (`hf`), parameter trees
(`param_trees`), T5X's config.gin and the model factory.

The public names (docs/design.md) are importable here: `load_params`, `save_t5x`, `from_hf_t5`.
"""

from speculative.checkpoints.hf import from_hf_t5
from speculative.checkpoints.t5x import load_params, save_t5x

__all__ = ["from_hf_t5", "load_params", "save_t5x"]
