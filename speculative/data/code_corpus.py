"""The Python-code corpus: its files, and the examples a language model and a task read from it.

`scripts/build_code_corpus.py` makes it from this machine's standard library (`.py` sources, one
document per file). A corpus directory (the bundled one is `speculative/data/code/`) holds:

    train.jsonl, valid.jsonl, test.jsonl   one document per line: {"path": "json/decoder.py",
                                            "text": <the file's exact source>}, sorted by path
    spm.model                               a SentencePiece vocabulary that round-trips code
                                            exactly ("\\n" is a piece of its own; byte fallback)
    manifest.json                           Python version, counts and sha256 of every file

Two readers use it, and both split the text where the vocabulary splits it anyway:

    ids = [tokenizer.encode(text) + [EOS] for _, text in read_documents(path)]
    chunks = lm_chunks(ids, length=256)        # training: next-token prediction on each chunk
    line_windows(text, prompt_lines=16, continuation_lines=16)   # the `stdlib_code` seqio task

Pure Python and numpy (no seqio or TensorFlow), so training and the task share it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterator, List, NamedTuple, Sequence, Tuple

import numpy as np

from speculative import files

CODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code")
SPLITS = ("train", "valid", "test")
SPM_MODEL = "spm.model"
MANIFEST = "manifest.json"
NEWLINE = "\n"  # a user-defined piece of the vocabulary: no piece spans two lines


class Document(NamedTuple):
    path: str  # relative to the standard library's root, '/'-separated
    text: str


def split_file(split: str) -> str:
    """'train' -> 'train.jsonl' (also accepts seqio's name 'validation' for 'valid'); the code
    and docstring corpora name their split files alike."""
    split = {"validation": "valid"}.get(split, split)
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not a split of the corpus; use one of "
                         f"{SPLITS} (or 'validation').")
    return f"{split}.jsonl"


def corpus_file(data_dir: str, name: str, builder: str = "scripts/build_code_corpus.py",
                note: str = "") -> str:
    """`data_dir/name`, or FileNotFoundError with the command that builds it (`builder`, the
    corpus' script; `note` adds why a file is missing)."""
    path = os.path.join(data_dir, name)
    if not os.path.exists(path):
        command = f"python {builder} --output_dir={data_dir}"
        if name == "train.jsonl":
            command += " --train_split_only"
            note = note or (" (the repository commits the valid/test splits and the "
                            "vocabulary, not the train split; this keeps them)")
        raise FileNotFoundError(f"No {name} in {data_dir}; build it with `{command}`{note}.")
    return path


def read_records(path: str, fields: Sequence[str], make: Callable[..., Any],
                 builder: str = "scripts/build_code_corpus.py") -> list:
    """Each line of a split file as `make(*its fields)`, in file order; a line that is not a
    JSON object with `fields` raises, naming its number and the corpus' script (`builder`)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                record = json.loads(line)
                out.append(make(*(record[k] for k in fields)))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: expected a JSON object with keys {list(fields)} "
                                 f"({e}); rebuild the corpus with {builder}.") from e
    return out


def read_documents(path: str) -> List[Document]:
    """The documents of one split file (`train.jsonl`, ...), in file order."""
    return read_records(path, Document._fields, Document)


def write_documents(path: str, docs: Sequence[Document]) -> None:
    """One JSON object per line (non-ASCII kept as UTF-8), written atomically."""
    files.write_atomic(path, "".join(
        json.dumps({"path": d.path, "text": d.text}, ensure_ascii=False) + "\n" for d in docs))


def lm_chunks(documents: Sequence[Sequence[int]], length: int) -> List[np.ndarray]:
    """Token ids of each document (EOS already appended) cut into consecutive chunks of `length`.

    A chunk never spans two documents; the last chunk of a document is shorter (the batcher pads
    it with 0, which has no loss weight). The model reads each chunk after BOS, as
    `t5.DecoderOnly` teacher forcing and its decode cache do.
    """
    if length < 2:
        raise ValueError(f"length={length} is too short for next-token chunks; use >= 2.")
    return [np.asarray(ids[s:s + length], np.int32)
            for ids in documents for s in range(0, len(ids), length)]


def line_windows(text: str, prompt_lines: int, continuation_lines: int) -> List[Tuple[str, str]]:
    """Consecutive `(prompt, continuation)` pairs of whole lines, each line keeping its "\\n".

    Windows of `prompt_lines + continuation_lines` lines tile the text from its start; a last
    window with no line left for its continuation is dropped, so joining every pair gives the
    text up to that remainder. Each prompt ends with "\\n", a piece of its own, so no piece of
    the vocabulary is cut between a prompt and its continuation.
    """
    if prompt_lines < 1 or continuation_lines < 1:
        raise ValueError(f"prompt_lines={prompt_lines} and continuation_lines="
                         f"{continuation_lines} must both be >= 1.")
    lines = text.split(NEWLINE)  # not str.splitlines: "\f", "\r", ... stay inside their line
    lines = [line + NEWLINE for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    step = prompt_lines + continuation_lines
    return [("".join(lines[s:s + prompt_lines]), "".join(lines[s + prompt_lines:s + step]))
            for s in range(0, len(lines), step) if len(lines) > s + prompt_lines]


def iter_line_windows(docs: Sequence[Document], prompt_lines: int,
                      continuation_lines: int) -> Iterator[Tuple[str, str, str]]:
    """`(path, prompt, continuation)` for every window of every document, in order."""
    for doc in docs:
        for prompt, continuation in line_windows(doc.text, prompt_lines, continuation_lines):
            yield doc.path, prompt, continuation
