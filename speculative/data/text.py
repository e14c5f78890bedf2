"""The corpora as token ids: the EN->DE pairs and sources, their SentencePiece tokenizer, and the
code corpus as language-model chunks and prompts. The bundles read models' inputs through it,
the trainer its examples (`speculative.training.data` batches them).

    pairs = load_pairs(tsv)                      # [(english, german)]
    tok = Tokenizer(spm_path)                    # inputs: PREFIX + en, + EOS; targets: de + EOS
    chunks = lm_examples(code_dir, "valid", tok, 256)   # [(NO_INPUTS, ids)] of <= 256 tokens
    prompts = lm_prompts(chunks, 128)            # the first 128 ids of chunks that go on
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from speculative.data import code_corpus
from speculative.decode.contract import EOS_ID, PAD_ID

Example = Tuple[np.ndarray, np.ndarray]  # (input ids, target ids), each ending in EOS
NO_INPUTS = np.zeros((0,), np.int32)  # the inputs of a decoder-only (language model) example
PREFIX = "translate English to German: "  # == tasks.EN_DE_PREFIX (the mini_ende task)
MINI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mini")


def load_pairs(path: str) -> List[Tuple[str, str]]:
    """`source<TAB>target` lines (the corpus' TSV files) -> list of (source, target)."""
    pairs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 2:
                raise ValueError(f"{path}:{n}: expected 'source<TAB>target', got {line[:80]!r}.")
            pairs.append((fields[0], fields[1]))
    return pairs


def load_sources(path: str) -> List[str]:
    """One source sentence per line (UTF-8; blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


class Tokenizer:
    """The corpus' SentencePiece model (pad 0, eos 1, unk 2), as the `mini_ende` task uses it;
    `prefix` starts every input (the EN->DE task prefix by default; '' for code -> docstring)."""

    def __init__(self, spm_path: Optional[str] = None, prefix: str = PREFIX):
        import sentencepiece  # pylint: disable=g-import-not-at-top

        self.prefix = prefix
        self.path = spm_path or os.path.join(MINI_DIR, "spm.model")
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"No SentencePiece model at {self.path}; build the corpus "
                                    "with scripts/build_corpus.py or pass data_dir.")
        self.sp = sentencepiece.SentencePieceProcessor(model_file=self.path)
        self.vocab_size = self.sp.get_piece_size()

    def encode_inputs(self, sources: Sequence[str]) -> List[List[int]]:
        return [ids + [EOS_ID] for ids in self.sp.encode([self.prefix + s for s in sources])]

    def encode_sources(self, sources: Sequence[str], length: int) -> np.ndarray:
        """`[B, length]` int32 encoder inputs: prefix + source + EOS, right-padded with 0.

        A source longer than `length` raises (nothing is silently cut).
        """
        out = np.zeros((len(sources), length), np.int32)
        for b, ids in enumerate(self.encode_inputs(sources)):
            if len(ids) > length:
                raise ValueError(f"Source {b} has {len(ids)} tokens with prefix and EOS, more "
                                 f"than length={length}; raise the input length.")
            out[b, :len(ids)] = ids
        return out

    def encode_targets(self, targets: Sequence[str]) -> List[List[int]]:
        return [ids + [EOS_ID] for ids in self.sp.encode(list(targets))]

    def decode(self, ids) -> str:
        """Ids up to the first EOS (or padding) -> text."""
        ids = [int(i) for i in ids]
        return self.sp.decode(ids[:next((k for k, i in enumerate(ids) if i in (EOS_ID, PAD_ID)),
                                        len(ids))])


def lm_examples(data_dir: str, split: str, tokenizer: Tokenizer, length: int) -> List[Example]:
    """A split of the code corpus in `data_dir` as language-model examples `(NO_INPUTS, chunk)`:
    each document's ids plus EOS in chunks of at most `length` tokens (`code_corpus.lm_chunks`)."""
    path = code_corpus.corpus_file(data_dir, code_corpus.split_file(split))
    ids = tokenizer.encode_targets([doc.text for doc in code_corpus.read_documents(path)])
    return [(NO_INPUTS, chunk) for chunk in code_corpus.lm_chunks(ids, length)]


def check_prompt_length(prompt_length: int, chunk_length: int) -> None:
    """A prompt must leave room in its chunk for what follows it (`lm_prompts`); raised before
    any work by every run that cuts prompts from chunks."""
    if not 1 <= prompt_length < chunk_length:
        raise ValueError(f"prompt_length={prompt_length} must be in [1, {chunk_length}) (the "
                         "chunk length) to leave chunks that go on after a prompt.")


def lm_prompts(examples: Sequence[Example], prompt_length: int) -> List[np.ndarray]:
    """Prompts for a decoder-only model: the first `prompt_length` tokens of each chunk of
    `examples` (`lm_examples`) that goes on after them (no EOS inside the prompt)."""
    return [y[:prompt_length] for _, y in examples
            if len(y) > prompt_length and EOS_ID not in y[:prompt_length]]
