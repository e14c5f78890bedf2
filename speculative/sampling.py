"""The public sampling API (docs/design.md, "Public API"); the kernel lives in
`speculative.decode.kernel`."""

from speculative.decode.kernel import SamplingConfig, speculative_sample

__all__ = ["SamplingConfig", "speculative_sample"]
