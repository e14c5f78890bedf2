"""Checkpoints: T5X legacy and Orbax (`t5x`), Hugging Face (`hf`), parameter trees
(`param_trees`), local and gs:// files (`paths`), T5X's config.gin (`config_gin`) and the model
factory (`factory`).

The public names (docs/design.md) are importable here: `load_params`, `save_t5x`, `from_hf_t5`,
`t5x_config`. A name that used to be importable here and now lives in a submodule
(`save_hf_t5`, `load_metadata`, ...) raises an AttributeError naming its new place.
"""

import dis
import sys

from speculative.checkpoints.config_gin import t5x_config
from speculative.checkpoints.hf import from_hf_t5
from speculative.checkpoints.t5x import load_params, save_t5x

__all__ = ["from_hf_t5", "load_params", "save_t5x", "t5x_config"]

# Names `speculative.checkpoints` re-exported before it became a package of modules.
_MOVED = {"save_hf_t5": "hf", "to_hf_t5": "hf", "config_from_hf": "hf", "hf_config_dict": "hf",
          "load_hf_config": "hf", "check_hf_target": "hf", "load_metadata": "t5x",
          "check_t5x_target": "t5x", "validate_params": "param_trees",
          "CheckpointError": "param_trees"}


def __getattr__(name: str):
    if name not in _MOVED:
        raise AttributeError(f"module 'speculative.checkpoints' has no attribute {name!r}",
                             name=name, obj=None)
    where = f"speculative.checkpoints.{_MOVED[name]}"
    message = (f"speculative.checkpoints.{name} moved to {where}.{name}: use `from {where} "
               f"import {name}` (importable from speculative.checkpoints itself: "
               f"{', '.join(__all__)}).")
    # `from speculative.checkpoints import X` turns an AttributeError into a bare "cannot
    # import name": raise the ImportError with the new form there, AttributeError elsewhere.
    caller = sys._getframe(1)  # pylint: disable=protected-access
    if caller.f_code.co_code[caller.f_lasti] == dis.opmap["IMPORT_FROM"]:
        raise ImportError(message, name=__name__)
    raise AttributeError(message, name=name, obj=None)
