"""Checkpoints: T5X legacy and Orbax (`t5x`), Hugging Face (`hf`), parameter trees
(`param_trees`), local and gs:// files (`paths`), T5X's config.gin (`config_gin`) and the model
factory (`factory`).

The public names (docs/design.md) are importable here: `load_params`, `save_t5x`, `from_hf_t5`,
`t5x_config`.
"""

from speculative.checkpoints.config_gin import t5x_config
from speculative.checkpoints.hf import from_hf_t5
from speculative.checkpoints.t5x import load_params, save_t5x

__all__ = ["from_hf_t5", "load_params", "save_t5x", "t5x_config"]
