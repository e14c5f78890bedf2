"""speculative: exact speculative decoding for T5X-style Transformers in JAX/Flax.

    import speculative
    target = speculative.loading.load_model(None, "/ckpts/my_t5x_run")   # its config.gin
    out = speculative.decoding.speculative_decode(target, draft, inputs, ...)

The public modules (`decoding`, `loading`, `sampling`, `checkpoints`, `theory`) are imported on
first use, so `import speculative` alone stays light (no JAX).
"""

import importlib

__version__ = "0.1.0"

_LAZY = ("checkpoints", "decoding", "loading", "sampling", "theory")
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'speculative' has no attribute {name!r}", name=name, obj=None)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
