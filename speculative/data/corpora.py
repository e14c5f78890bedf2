"""What the offline corpus builders share: the split hash, file digests and the vocabulary trainer.

`scripts/build_corpus.py` (EN->DE gettext pairs) and `scripts/build_code_corpus.py` (Python
sources) both split by a hash of a key, record each file's sha256 in a manifest and train a
T5-style SentencePiece vocabulary whose bytes are a function of its input alone.
"""

import hashlib
import io
from typing import Iterable

from speculative import files


def hash_fraction(key: str) -> float:
    """A deterministic number in [0, 1) from sha256 of `key` (the split a key falls in)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def train_sentencepiece(texts: Iterable[str], model_path: str, vocab_size: int,
                        **options) -> str:
    """Trains a SentencePiece unigram model on `texts` into `model_path`; returns its sha256.

    Ids as T5's vocabularies: pad 0, eos 1, unk 2, no bos. One thread, a fixed seed and no
    sentence sampling make the model bytes a function of `texts` and `options` (further
    `SentencePieceTrainer.train` arguments, e.g. `byte_fallback`, `normalization_rule_name`).
    """
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    texts = list(texts)
    if not texts:
        raise ValueError("cannot train a vocabulary on an empty corpus")
    spm.set_random_generator_seed(0)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, model_type="unigram",
        vocab_size=vocab_size, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, input_sentence_size=0,
        shuffle_input_sentence=False, num_threads=1, minloglevel=2, **options)
    data = model.getvalue()
    files.write_atomic(model_path, data)
    return hashlib.sha256(data).hexdigest()
