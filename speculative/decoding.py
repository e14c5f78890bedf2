"""The public decoding API (docs/design.md, "Public API"): names kept importable here for code
outside the repository. Each lives in its room: the loops in `speculative.decode.loops`, the T5
adapters in `speculative.models.adapters`, beam search in `speculative.beam.search`."""

from speculative.beam.checks import BeamSearchResult
from speculative.beam.search import beam_search, speculative_beam_search
from speculative.decode.loops import DecodeResult, autoregressive_decode, speculative_decode
from speculative.models.adapters import DecoderOnlyModel, EncoderDecoderModel

__all__ = ["BeamSearchResult", "DecodeResult", "DecoderOnlyModel", "EncoderDecoderModel",
           "autoregressive_decode", "beam_search", "speculative_beam_search",
           "speculative_decode"]
