"""data/corpora.py: the deterministic split fraction, file digests and a SentencePiece model
whose bytes are a function of its texts (the corpora themselves: tests/test_corpus.py)."""

import hashlib

from speculative.data import corpora


def test_hash_fraction_is_deterministic_and_in_0_1():
    values = [corpora.hash_fraction(f"sentence {i}") for i in range(200)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert values == [corpora.hash_fraction(f"sentence {i}") for i in range(200)]
    assert 0.35 < sum(v < 0.5 for v in values) / len(values) < 0.65  # about uniform


def test_file_sha256_is_the_files_digest(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * (3 << 20))  # several read blocks
    assert corpora.file_sha256(str(path)) == hashlib.sha256(b"x" * (3 << 20)).hexdigest()


def test_sentencepiece_model_bytes_are_a_function_of_the_texts(tmp_path):
    texts = [f"the cat {i} sat on the mat number {i % 7}" for i in range(300)]
    a = corpora.train_sentencepiece(texts, str(tmp_path / "a.model"), vocab_size=40)
    b = corpora.train_sentencepiece(texts, str(tmp_path / "b.model"), vocab_size=40)
    assert a == b == corpora.file_sha256(str(tmp_path / "a.model"))
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "a.model"))
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)  # T5's ids
