r"""Builds an offline Python-code corpus from this machine's standard library, plus a vocabulary.

The decoder-only (GPT-like) row of the paper's Table 3 needs a language-modelling corpus that
every machine has: the `.py` sources of the Python standard library.

1. Find the sources: every `*.py` under `sysconfig.get_paths()["stdlib"]`, skipping test
   packages (directories named `test`, `tests` or `idle_test`), installed packages
   (`site-packages`, `dist-packages`) and the files a Python build generates for its machine
   (`_sysconfigdata_*.py`, `config-*/`), so the corpus depends only on the Python version.
   Empty files (package markers) and files that are not UTF-8 are skipped and listed in the
   manifest.
2. One document per file: its relative path ('/'-separated) and its exact text (read as bytes,
   decoded as UTF-8, newlines untouched), in sorted path order.
3. Split by a sha256 hash of the relative path: a file goes to valid when the hash fraction u is
   below --valid_fraction, to test when it is below the sum, else to train (96/2/2 by default:
   with ~700 files, 1% would leave ~7 files per evaluation split).
4. Write train.jsonl, valid.jsonl, test.jsonl (`speculative.code_corpus` reads them) and train
   a SentencePiece unigram vocabulary on the train split: T5 ids (pad 0, eos 1, unk 2, no bos),
   identity normalisation (no NFKC, no whitespace collapsing, no dummy prefix), "\n" a
   user-defined piece (so no piece spans two lines), pieces across spaces and whitespace-only
   pieces allowed (indentation is one piece), byte fallback (any character round-trips). So
   `decode(encode(text)) == text` for every source file, tabs and trailing spaces included.
   manifest.json records the Python version, file and line counts and the sha256 of each file.

Everything is deterministic given the standard library: running twice gives the same bytes (the
vocabulary is trained with one thread and a fixed seed).

What the repository commits (speculative/data/code/): valid.jsonl, test.jsonl, spm.model and
manifest.json, well under 2 MB, which is all that evaluation, the `stdlib_code` seqio task and
the bundled models' vocabulary need. train.jsonl (~11 MB) is not committed: it is this machine's
standard library, and --train_split_only rebuilds it beside the committed files (keeping their
vocabulary, so bundled checkpoints stay valid; on another Python version the train split
differs, and the manifest says which version made each file).

Examples (from the repository root):

  # Before training on a fresh clone: the train split only (a few seconds).
  python scripts/build_code_corpus.py --train_split_only

  # The whole corpus and vocabulary, as bundled (~3 minutes on one core).
  python scripts/build_code_corpus.py --vocab_size=4000

Expect, for CPython 3.11: ~730 files and ~330k lines (12 MB), ~15 files in each of valid and
test, and about 3 bytes of code per token.
"""

import json
import os
import sys
import sysconfig
from typing import Dict, List, Mapping, Optional, Sequence

from absl import app, flags

from speculative import files
from speculative.data import code_corpus, corpora
from speculative.runs import config as config_lib

FLAGS = flags.FLAGS
SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages",
                       "__pycache__"})


def is_skipped(relpath: str) -> bool:
    """Test packages, installed packages and the build's generated per-machine files."""
    *dirs, name = relpath.split("/")
    return (any(d in SKIP_DIRS or d.startswith("config-") for d in dirs)
            or name.startswith("_sysconfigdata_") or not name.endswith(".py"))


def find_sources(root: str) -> List[str]:
    """Relative paths ('/'-separated) of the corpus' `.py` files under `root`, sorted."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"stdlib={root!r} is not a directory; pass the root of a Python "
                                "standard library (sysconfig.get_paths()['stdlib']).")
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
        for name in filenames:
            path = name if rel == "." else f"{rel}/{name}"
            if not is_skipped(path):
                paths.append(path)
    return sorted(paths)


def read_sources(root: str, paths: Sequence[str]):
    """-> (documents, {'empty': paths, 'undecodable': paths not UTF-8})."""
    docs, skipped = [], {"empty": [], "undecodable": []}
    for path in paths:
        with open(os.path.join(root, *path.split("/")), "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped["undecodable"].append(path)
            continue
        if text:
            docs.append(code_corpus.Document(path, text))
        else:
            skipped["empty"].append(path)
    return docs, skipped


hash_fraction = corpora.hash_fraction  # of each file's relative path


def split_documents(docs: Sequence[code_corpus.Document], valid_fraction: float = 0.02,
                    test_fraction: float = 0.02) -> Dict[str, List[code_corpus.Document]]:
    """train/valid/test by `hash_fraction` of each path; each split keeps the input order."""
    if valid_fraction < 0 or test_fraction < 0 or valid_fraction + test_fraction >= 1:
        raise ValueError(f"valid_fraction={valid_fraction} and test_fraction={test_fraction} "
                         "must be >= 0 and sum to less than 1.")
    splits = {name: [] for name in code_corpus.SPLITS}
    for doc in docs:
        u = hash_fraction(doc.path)
        name = ("valid" if u < valid_fraction else
                "test" if u < valid_fraction + test_fraction else "train")
        splits[name].append(doc)
    return splits


def train_vocabulary(docs: Sequence[code_corpus.Document], model_path: str,
                     vocab_size: int = 4000) -> str:
    """Trains the code vocabulary (see the module docstring) on `docs`; returns its sha256.

    The trainer reads one line at a time ("\\n" is a user-defined piece, so no piece could span
    lines anyway); `corpora.train_sentencepiece` makes the bytes a function of `docs`.
    """
    return corpora.train_sentencepiece(
        (line for doc in docs for line in doc.text.split("\n") if line), model_path,
        vocab_size, user_defined_symbols=[code_corpus.NEWLINE],
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=False, split_by_whitespace=False, allow_whitespace_only_pieces=True,
        byte_fallback=True, character_coverage=0.9995)


def _file_record(path: str, docs: Sequence[code_corpus.Document]) -> dict:
    return {"documents": len(docs), "lines": sum(d.text.count("\n") for d in docs),
            "bytes": os.path.getsize(path), "sha256": corpora.file_sha256(path),
            "python_version": sys.version.split()[0]}


def _write_manifest(output_dir: str, manifest: dict) -> None:
    files.write_atomic(os.path.join(output_dir, code_corpus.MANIFEST),
                       json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")


def build_code_corpus(output_dir: str, stdlib: Optional[str] = None, *,
                      paths: Optional[Sequence[str]] = None, valid_fraction: float = 0.02,
                      test_fraction: float = 0.02, vocab_size: int = 4000,
                      train_split_only: bool = False,
                      command: Optional[Mapping[str, object]] = None) -> dict:
    """Builds the corpus (see the module docstring) into `output_dir`; returns the manifest.

    Args:
      output_dir: created if missing.
      stdlib: the sources' root; default this interpreter's standard library.
      paths: relative paths to read instead of every file `find_sources` finds (tests).
      train_split_only: write train.jsonl only and update its manifest entry; the valid/test
        splits and the vocabulary in `output_dir` stay as they are.
      command: recorded in the manifest as how the corpus was made.
    """
    root = os.path.abspath(stdlib or sysconfig.get_paths()["stdlib"])
    paths = sorted(paths) if paths is not None else find_sources(root)
    docs, skipped = read_sources(root, paths)
    splits = split_documents(docs, valid_fraction, test_fraction)
    os.makedirs(output_dir, exist_ok=True)
    if train_split_only:
        with open(code_corpus.corpus_file(output_dir, code_corpus.MANIFEST),
                  encoding="utf-8") as f:
            manifest = json.load(f)
        settings = manifest["settings"]
        if (settings["valid_fraction"], settings["test_fraction"]) != (valid_fraction,
                                                                        test_fraction):
            raise ValueError(
                f"valid_fraction={valid_fraction}, test_fraction={test_fraction} differ from "
                f"the corpus in {output_dir} ({settings['valid_fraction']}, "
                f"{settings['test_fraction']}): the train split would overlap its evaluation "
                "splits; pass the manifest's fractions.")
        path = os.path.join(output_dir, "train.jsonl")
        code_corpus.write_documents(path, splits["train"])
        manifest["files"]["train.jsonl"] = _file_record(path, splits["train"])
        _write_manifest(output_dir, manifest)
        return manifest

    file_records = {}
    for name in code_corpus.SPLITS:
        path = os.path.join(output_dir, code_corpus.split_file(name))
        code_corpus.write_documents(path, splits[name])
        file_records[os.path.basename(path)] = _file_record(path, splits[name])
    model_path = os.path.join(output_dir, code_corpus.SPM_MODEL)
    digest = train_vocabulary(splits["train"], model_path, vocab_size)
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    processor = spm.SentencePieceProcessor(model_file=model_path)
    valid_text = "".join(d.text for d in splits["valid"])
    manifest = {
        "description": "Python standard library sources, one document per .py file",
        "python_version": sys.version.split()[0],
        "stdlib": root if stdlib else "sysconfig.get_paths()['stdlib']",
        "counts": {name: len(splits[name]) for name in code_corpus.SPLITS},
        "lines": sum(d.text.count("\n") for d in docs),
        "skipped": skipped,
        "files": file_records,
        "vocabulary": {
            "file": code_corpus.SPM_MODEL, "sha256": digest,
            "vocab_size": processor.get_piece_size(), "requested_vocab_size": vocab_size,
            "model_type": "unigram", "pad_id": processor.pad_id(),
            "eos_id": processor.eos_id(), "unk_id": processor.unk_id(),
            "bos_id": processor.bos_id(), "newline_piece": processor.piece_to_id("\n"),
            "trained_on": "train.jsonl",
            "valid_bytes_per_token": round(len(valid_text.encode("utf-8")) / max(
                1, len(processor.encode(valid_text))), 3)},
        "settings": {"valid_fraction": valid_fraction, "test_fraction": test_fraction,
                     "vocab_size": vocab_size, "skip_dirs": sorted(SKIP_DIRS)},
        "command": dict(command) if command else None,
    }
    manifest["files"][code_corpus.SPM_MODEL] = {"bytes": os.path.getsize(model_path),
                                                "sha256": digest}
    _write_manifest(output_dir, manifest)
    return manifest


def define_flags() -> None:
    """The script's flags, defined when it runs (so tests can import it beside
    scripts/build_corpus.py, whose flags share these names)."""
    flags.DEFINE_string("output_dir", None, "Where to write the splits, spm.model and "
                        "manifest.json (default: the bundled speculative/data/code/).")
    flags.DEFINE_string("stdlib", None,
                        "Root of the sources (default: sysconfig.get_paths()['stdlib']).")
    flags.DEFINE_float("valid_fraction", 0.02, "Share of files for valid.")
    flags.DEFINE_float("test_fraction", 0.02, "Share of files for test.")
    flags.DEFINE_integer("vocab_size", 4000, "SentencePiece vocabulary size.")
    flags.DEFINE_bool("train_split_only", False,
                      "Write train.jsonl only, beside the valid/test splits and vocabulary "
                      "already in --output_dir (what a fresh clone needs before training).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    names = ["output_dir", "stdlib", "valid_fraction", "test_fraction", "vocab_size",
             "train_split_only"]
    command = {"argv": ["scripts/build_code_corpus.py"] + sys.argv[1:],
               "flags": {name: FLAGS[name].value for name in names}}
    manifest = build_code_corpus(
        FLAGS.output_dir or code_corpus.CODE_DIR, FLAGS.stdlib,
        valid_fraction=FLAGS.valid_fraction, test_fraction=FLAGS.test_fraction,
        vocab_size=FLAGS.vocab_size, train_split_only=FLAGS.train_split_only, command=command)
    for name, info in manifest["files"].items():
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "sha256"))


if __name__ == "__main__":
    define_flags()
    config_lib.run_app(main)
