"""Models: T5 (encoder-decoder and decoder-only) and n-gram drafts."""
