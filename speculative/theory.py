"""The public theory API (docs/design.md, "Public API"); the formulas live in
`speculative.measure.analysis`."""

from speculative.measure.analysis import (
    expected_tokens,
    min_improvement,
    operations_factor,
    optimal_gamma,
    speedup,
)

__all__ = ["expected_tokens", "min_improvement", "operations_factor", "optimal_gamma", "speedup"]
