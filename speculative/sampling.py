"""The public sampling API (docs/design.md, "Public API"); the kernel lives in
`speculative.decode.sampling`."""

from speculative.decode.sampling import SamplingConfig, speculative_sample

__all__ = ["SamplingConfig", "speculative_sample"]
