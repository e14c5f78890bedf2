r"""Builds the code -> docstring corpus (Table 2's summarization task, offline) and its vocabulary.

Sources: this interpreter's standard library and a pinned list of wheels (`WHEELS`: exact
versions, fetched with `pip download --no-deps` into a cache outside the repository, default
~/.cache/speculative/wheels, and checked against their sha256 before use; a wheel already in
the cache with the right digest is not fetched again). Only `.py` files are read, never run.

1. Files: every `.py` of each source except test code (directories `test`, `tests`, `testing`,
   `idle_test`; files `test_*.py`, `*_test.py`, `conftest.py`), installed packages and
   `.dist-info`. A file that is not UTF-8 or does not parse is counted and skipped.
2. Functions: every function and method with a docstring (`docstring_corpus.extract`): the
   input is its source with the docstring's lines removed (decorators kept, dedented), the
   output its `inspect.cleandoc`-ed docstring. Skipped and counted: docstrings of fewer than 5
   words, functions with nothing but a docstring, docstrings sharing a line with code.
3. Near-duplicates: one example per normalised-code hash (tokens without comments or layout)
   across the whole corpus, the first in source order (standard library, then wheels by name,
   files by path), so a vendored copy or a reformatted overload is dropped wherever it is.
4. Split by file: a file goes to valid / test / train by the sha256 fraction of its path
   ('numpy/linalg/_linalg.py'), so no function of a held-out file is trained on.
5. Vocabulary: a SentencePiece unigram model trained on a fixed quarter of the train split's
   code and docstrings (the code corpus' settings: identity normalisation, "\n" a piece,
   whitespace pieces, byte fallback, so every text round-trips exactly).
6. Lengths, in that vocabulary: an input of more than --max_input_length tokens (EOS
   included) is skipped; a docstring longer than --max_target_length is cut at the last
   paragraph boundary that fits, or skipped if its first paragraph does not fit. Every cut and
   skip is counted in the manifest; nothing is cut mid-paragraph.

The manifest records the Python version, every wheel (name, version, sha256), the counts of
every step per source and split, the settings and the sha256 of every written file. No time or
path of this machine is in it, so two builds give the same manifest.

Examples (from the repository root):

  # Before training on a fresh clone: the train split only, beside the committed valid/test
  # splits and vocabulary (fetches ~230 MB of wheels once; ~2 minutes after that).
  python scripts/build_docstring_corpus.py --train_split_only

  # The whole corpus and vocabulary, as bundled (~6 minutes on one core after the fetch).
  python scripts/build_docstring_corpus.py
"""

import collections
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from absl import app, flags, logging

from speculative import files
from speculative.data import corpora
from speculative.data import docstring_corpus as dc
from speculative.runs import config as config_lib

FLAGS = flags.FLAGS
TEST_DIRS = frozenset({"test", "tests", "testing", "idle_test", "site-packages",
                       "dist-packages", "__pycache__"})
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "speculative", "wheels")


class Wheel(NamedTuple):
    name: str  # as in the wheel's file name
    version: str
    binary: bool  # a CPython 3.11 manylinux x86_64 wheel (its .py files are what is read)
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def prefix(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}-"


WHEELS = (
    Wheel("Django", "5.1.3", False,
          "8b38a9a12da3ae00cb0ba72da985ec4b14de6345046b1e174b1fd7254398f818"),
    Wheel("SQLAlchemy", "2.0.36", True,
          "2519f3a5d0517fc159afab1015e54bb81b4406c278749779be57a569d8d1bb0d"),
    Wheel("ansible_core", "2.18.1", False,
          "4a312e416e09c7271188d6b8e2b1062fc6834fefd6a1814d0e02fb8aadb3e1ba"),
    Wheel("astropy", "6.1.6", True,
          "236f88d63f5bae380fbde8521bf1919f7f8305755995a2a730b11cb9012d04f9"),
    Wheel("biopython", "1.84", True,
          "894ee7533cca7f5f9769e2595fbe7b0dba5018f39a2170753d101a13e7585ff4"),
    Wheel("bokeh", "3.6.1", False,
          "6a97271bd4cc5b32c5bc7aa9c1c0dbe0beb0a8da2a22193e57c73f0c88d2075a"),
    Wheel("cirq_core", "1.4.1", False,
          "869db60413265c41a8206854c1d4ca9bad5fac9cfd7c6a10685b5a6d516defa0"),
    Wheel("dask", "2024.11.2", False,
          "6115c4b76015e8d9d9c2922b6a0a1c850e283fb7fee74eebbd2e28e9c117c30d"),
    Wheel("docutils", "0.21.2", False,
          "dafca5b9e384f0e419294eb4d2ff9fa826435bf15f15b7bd45723e8ad76811b2"),
    Wheel("fonttools", "4.55.0", True,
          "f307f6b5bf9e86891213b293e538d292cd1677e06d9faaa4bf9c086ad5f132f6"),
    Wheel("hypothesis", "6.122.1", False,
          "59e52da0f2529b40f0b7bd0c3c61d8b3fe3337102800bf3534c53d4a8bdf8a6d"),
    Wheel("ipython", "8.29.0", False,
          "0188a1bd83267192123ccea7f4a8ed0a78910535dbaa3f37671dca76ebd429c8"),
    Wheel("jax", "0.4.35", False,
          "fa99e909a31424abfec750019a6dd36f6acc18a6e7d40e2c0086b932cc351325"),
    Wheel("keras", "3.7.0", False,
          "546a64f302e4779c129c06d9826fa586de752cdfd43d7dc4010c31b282587969"),
    Wheel("matplotlib", "3.9.2", True,
          "8912ef7c2362f7193b5819d17dae8629b34a95c58603d781329712ada83f9447"),
    Wheel("mne", "1.8.0", False,
          "8398695e2bf754a33cafe10668edb515297dc32014dec94e646491095fa959ab"),
    Wheel("mpmath", "1.3.0", False,
          "a0b2b9fe80bbcd81a6647ff13108738cfb482d481d826cc0e02f5b35e5c88d2c"),
    Wheel("mypy", "1.13.0", True,
          "20c7ee0bc0d5a9595c46f38beb04201f2620065a93755704e141fcac9f59db2b"),
    Wheel("networkx", "3.4.2", False,
          "df5d4365b724cf81b8c6a7312509d0c22386097011ad1abe274afd5e9d3bbc5f"),
    Wheel("nltk", "3.9.1", False,
          "4fa26829c5b00715afe3061398a8989dc643b92ce7dd93fb4585a70930d168a1"),
    Wheel("numba", "0.60.0", True,
          "4142d7ac0210cc86432b818338a2bc368dc773a2f5cf1e32ff7c5b378bd63ee8"),
    Wheel("numpy", "2.1.3", True,
          "bc6f24b3d1ecc1eebfbf5d6051faa49af40b03be1aaa781ebdadcbc090b4539b"),
    Wheel("openpyxl", "3.1.5", False,
          "5282c12b107bffeef825f4617dc029afaf41d0ea60823bbb665ef3079dc79de2"),
    Wheel("pandas", "2.2.3", True,
          "c124333816c3a9b03fbeef3a9f230ba9a737e9e5bb4060aa2107a86cc0a497fc"),
    Wheel("paramiko", "3.5.0", False,
          "1fedf06b085359051cd7d0d270cebe19e755a8a921cc2ddbfa647fb0cd7d68f9"),
    Wheel("pillow", "11.0.0", True,
          "6f4dba50cfa56f910241eb7f883c20f1e7b1d8f7d91c750cd0b318bad443f4d5"),
    Wheel("pip", "24.3.1", False,
          "3790624780082365f47549d032f3770eeb2b1e8bd1f7b2e02dace1afa361b4ed"),
    Wheel("prompt_toolkit", "3.0.48", False,
          "f49a827f90062e411f1ce1f854f2aedb3c23353244f8108b89283587397ac10e"),
    Wheel("pydantic", "2.10.3", False,
          "be04d85bbc7b65651c5f8e6b9976ed9c6f41782a55524cef079a34a0bb82144d"),
    Wheel("pyqtgraph", "0.13.7", False,
          "7754edbefb6c367fa0dfb176e2d0610da3ada20aa7a5318516c74af5fb72bf7a"),
    Wheel("rich", "13.9.4", False,
          "6049d5e6ec054bf2779ab3358186963bac2ea89175919d699e378b99738c2a90"),
    Wheel("scapy", "2.6.1", False,
          "88a998572049b511a1f3e44f4aa7c62dd39c6ea2aa1bb58434f503956641789d"),
    Wheel("scikit_image", "0.24.0", True,
          "fa27b3a0dbad807b966b8db2d78da734cb812ca4787f7fbb143764800ce2fa9c"),
    Wheel("scikit_learn", "1.5.2", True,
          "f8b0ccd4a902836493e026c03256e8b206656f91fbcc4fde28c57a5b752561f1"),
    Wheel("scipy", "1.14.1", True,
          "fef8c87f8abfb884dac04e97824b61299880c43f4ce675dd2cbeadd3c9b466d2"),
    Wheel("setuptools", "75.6.0", False,
          "ce74b49e8f7110f9bf04883b730f4765b774ef3ef28f722cce7c273d253aaf7d"),
    Wheel("sphinx", "8.1.3", False,
          "09719015511837b76bf6e03e42eb7595ac8c2e41eeb9c29c5b755c6b677992a2"),
    Wheel("statsmodels", "0.14.4", True,
          "e332c2d9b806083d1797231280602340c5c913f90d4caa0213a6a54679ce9331"),
    Wheel("sympy", "1.13.3", False,
          "54612cf55a62755ee71824ce692986f23c88ffa77207b30c1368eda4a7060f73"),
    Wheel("tensorflow_probability", "0.25.0", False,
          "f3f4d6431656c0122906888afe1b67b4400e82bd7f254b45b92e6c5b84ea8e3e"),
    Wheel("textual", "0.87.1", False,
          "026d1368cd10610a72a9d3de7a56692a17e7e8dffa0468147eb8e186ba0ff0c0"),
    Wheel("tornado", "6.4.2", True,
          "bca9eb02196e789c9cb5c3c7c0f04fb447dc2adffd95265b2c7223a8a615ccbf"),
    Wheel("transformers", "4.46.3", False,
          "a12ef6f52841fd190a3e5602145b542d03507222f2c64ebb7ee92e8788093aef"),
    Wheel("twisted", "24.10.0", False,
          "67aa7c8aa94387385302acf44ade12967c747858c8bcce0f11d38077a11c5326"),
    Wheel("xarray", "2024.11.0", False,
          "6ee94f63ddcbdd0cf3909d1177f78cdac756640279c0e32ae36819a89cdaba37"),
)


def is_test_or_skipped(relpath: str) -> bool:
    """Test code, installed packages, metadata and files that are not Python sources."""
    *dirs, name = relpath.split("/")
    return (any(d in TEST_DIRS or d.endswith(".dist-info") or d.startswith("config-")
                for d in dirs)
            or not name.endswith(".py") or name.startswith("test_") or name.endswith("_test.py")
            or name == "conftest.py" or name.startswith("_sysconfigdata_"))


def fetch_wheel(wheel: Wheel, cache_dir: str) -> str:
    """The wheel's path in `cache_dir`, fetched with pip if missing; its sha256 checked."""
    def cached():
        return sorted(f for f in os.listdir(cache_dir) if f.startswith(wheel.prefix)
                      and f.endswith(".whl"))
    os.makedirs(cache_dir, exist_ok=True)
    if not cached():
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                   "--only-binary=:all:", "-d", cache_dir, wheel.requirement]
        if wheel.binary:
            command += ["--platform", "manylinux2014_x86_64", "--python-version", "3.11",
                        "--implementation", "cp", "--abi", "cp311"]
        logging.info("fetching %s", wheel.requirement)
        subprocess.run(command, check=True)
    names = cached()
    for name in names:
        path = os.path.join(cache_dir, name)
        if corpora.file_sha256(path) == wheel.sha256:
            return path
    raise RuntimeError(f"{wheel.requirement}: no wheel in {cache_dir} has the pinned sha256 "
                       f"{wheel.sha256} (found {names}); delete them and run again, or pin "
                       "the new digest in WHEELS if the index really changed the file.")


def stdlib_files(root: str) -> Iterator[Tuple[str, bytes]]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(dirnames)
        rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
        for name in sorted(filenames):
            path = name if rel == "." else f"{rel}/{name}"
            if not is_test_or_skipped(path):
                with open(os.path.join(dirpath, name), "rb") as f:
                    yield path, f.read()


def wheel_files(path: str) -> Iterator[Tuple[str, bytes]]:
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):
            if not is_test_or_skipped(name):
                yield name, z.read(name)


def collect(sources: Sequence[Tuple[str, Iterator[Tuple[str, bytes]]]]):
    """-> (examples deduplicated across all sources, {source: Counter of what happened})."""
    seen, examples = set(), []
    counts: Dict[str, collections.Counter] = {}
    for source, items in sources:
        c = counts[source] = collections.Counter()
        for relpath, data in items:
            c["files"] += 1
            try:
                found = list(dc.extract(f"{source}/{relpath}", data.decode("utf-8")))
            except (UnicodeDecodeError, SyntaxError, ValueError):
                c["files_unparsed"] += 1
                continue
            for item in found:
                if isinstance(item, dc.Skip):
                    c[item.reason] += 1
                    continue
                key = dc.code_hash(item.code)
                if key in seen:
                    c["duplicate_code"] += 1
                    continue
                seen.add(key)
                examples.append(item)
                c["functions"] += 1
    return examples, counts


def file_of(example: dc.Example) -> str:
    return example.path


def split_examples(examples: Sequence[dc.Example], valid_fraction: float,
                   test_fraction: float) -> Dict[str, List[dc.Example]]:
    """train/valid/test by `corpora.hash_fraction` of each example's file path."""
    if valid_fraction <= 0 or test_fraction <= 0 or valid_fraction + test_fraction >= 1:
        raise ValueError(f"valid_fraction={valid_fraction} and test_fraction={test_fraction} "
                         "must be > 0 and sum to less than 1.")
    splits = {name: [] for name in dc.SPLITS}
    for e in examples:
        u = corpora.hash_fraction(file_of(e))
        splits["valid" if u < valid_fraction else
               "test" if u < valid_fraction + test_fraction else "train"].append(e)
    return splits


def train_vocabulary(examples: Sequence[dc.Example], model_path: str, vocab_size: int,
                     fraction: float) -> str:
    """The vocabulary on the examples whose (path, name) hash is below `fraction`."""
    chosen = [e for e in examples if corpora.hash_fraction(f"{e.path}:{e.name}") < fraction]
    lines = (line for e in chosen for text in (e.code, e.docstring)
             for line in text.split("\n") if line)
    return corpora.train_sentencepiece(
        lines, model_path, vocab_size, user_defined_symbols=["\n"],
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=False, split_by_whitespace=False, allow_whitespace_only_pieces=True,
        byte_fallback=True, character_coverage=0.9995)


def fit_lengths(examples: Sequence[dc.Example], sp, max_input: int, max_target: int):
    """Examples that fit (docstrings cut at paragraph boundaries) -> (examples, Counter)."""
    kept, c = [], collections.Counter()
    for e in examples:
        if len(sp.encode(e.code)) + 1 > max_input:
            c["skipped_long_code"] += 1
            continue
        doc, dropped = dc.cut_paragraphs(e.docstring,
                                         lambda t: len(sp.encode(t)) + 1 <= max_target)
        if doc is None:
            c["skipped_long_docstring"] += 1
            continue
        if dropped:
            c["docstring_cut_at_paragraph"] += 1
        kept.append(e._replace(docstring=doc))
    c["kept"] = len(kept)
    return kept, c


def _record(path: str, examples: Sequence[dc.Example]) -> dict:
    return {"examples": len(examples), "bytes": os.path.getsize(path),
            "sha256": corpora.file_sha256(path)}


def build(output_dir: str, *, cache_dir: str = DEFAULT_CACHE, wheels: Sequence[Wheel] = WHEELS,
          stdlib: Optional[str] = None, valid_fraction: float = 0.025,
          test_fraction: float = 0.025, vocab_size: int = 8000, vocab_fraction: float = 0.25,
          max_input_length: int = 384, max_target_length: int = 128,
          train_split_only: bool = False, command: Optional[dict] = None) -> dict:
    """Builds the corpus (see the module docstring) into `output_dir`; returns the manifest.

    `stdlib=''` leaves the standard library out and `wheels` can be any pinned subset (tests);
    `train_split_only` writes train.jsonl with the vocabulary already in `output_dir` and
    checks that the settings match its manifest.
    """
    settings = {"valid_fraction": valid_fraction, "test_fraction": test_fraction,
                "vocab_size": vocab_size, "vocab_fraction": vocab_fraction,
                "max_input_length": max_input_length, "max_target_length": max_target_length,
                "min_docstring_words": dc.MIN_WORDS, "test_dirs": sorted(TEST_DIRS)}
    old = None
    if train_split_only:
        with open(dc.corpus_file(output_dir, dc.MANIFEST), encoding="utf-8") as f:
            old = json.load(f)
        if old["settings"] != settings:
            raise ValueError(f"The settings {settings} differ from the corpus in {output_dir} "
                             f"({old['settings']}): the train split would not match its "
                             "vocabulary and evaluation splits; pass the manifest's settings.")
    sources = []
    if stdlib != "":
        root = os.path.abspath(stdlib or sysconfig.get_paths()["stdlib"])
        sources.append(("stdlib", stdlib_files(root)))
    for wheel in sorted(wheels, key=lambda w: w.name.lower()):
        path = fetch_wheel(wheel, cache_dir)
        sources.append((wheel.name.lower().replace("_", "-"), wheel_files(path)))
    examples, counts = collect(sources)
    splits = split_examples(examples, valid_fraction, test_fraction)
    os.makedirs(output_dir, exist_ok=True)
    model_path = os.path.join(output_dir, dc.SPM_MODEL)
    if not train_split_only:
        train_vocabulary(splits["train"], model_path, vocab_size, vocab_fraction)
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    sp = spm.SentencePieceProcessor(model_file=model_path)
    names = ("train",) if train_split_only else dc.SPLITS
    records, length_counts = {}, {}
    for name in names:
        kept, length_counts[name] = fit_lengths(splits[name], sp, max_input_length,
                                                max_target_length)
        path = os.path.join(output_dir, dc.split_file(name))
        dc.write_examples(path, kept)
        records[dc.split_file(name)] = _record(path, kept)
    if train_split_only:
        manifest = old
        if old["files"]["train.jsonl"]["sha256"] != records["train.jsonl"]["sha256"]:
            logging.warning("train.jsonl differs from the one the manifest records (another "
                            "Python version's standard library?); the manifest now records "
                            "this one.")
        manifest["files"]["train.jsonl"] = records["train.jsonl"]
        manifest["lengths"]["train"] = dict(sorted(length_counts["train"].items()))
    else:
        records[dc.SPM_MODEL] = {"bytes": os.path.getsize(model_path),
                                 "sha256": corpora.file_sha256(model_path)}
        valid_doc = "".join(e.docstring for e in splits["valid"])
        manifest = {
            "description": "Python functions (docstring removed) -> their docstrings",
            "python_version": sys.version.split()[0],
            "wheels": [{"name": w.name, "version": w.version, "sha256": w.sha256}
                       for w in sorted(wheels, key=lambda w: w.name.lower())],
            "extraction": {s: dict(sorted(c.items())) for s, c in counts.items()},
            "split_functions": {name: len(splits[name]) for name in dc.SPLITS},
            "lengths": {name: dict(sorted(c.items())) for name, c in length_counts.items()},
            "counts": {name: records[dc.split_file(name)]["examples"] for name in dc.SPLITS},
            "vocabulary": {"file": dc.SPM_MODEL, "vocab_size": sp.get_piece_size(),
                           "pad_id": sp.pad_id(), "eos_id": sp.eos_id(),
                           "unk_id": sp.unk_id(), "bos_id": sp.bos_id(),
                           "newline_piece": sp.piece_to_id("\n"),
                           "valid_docstring_bytes_per_token": round(
                               len(valid_doc.encode("utf-8"))
                               / max(1, len(sp.encode(valid_doc))), 3)},
            "files": records,
            "settings": settings,
            "command": command,
        }
    files.write_atomic(os.path.join(output_dir, dc.MANIFEST),
                       json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return manifest


def define_flags() -> None:
    flags.DEFINE_string("output_dir", None, "Where to write the corpus (default: the bundled "
                        "speculative/data/docstrings/).")
    flags.DEFINE_string("cache_dir", DEFAULT_CACHE, "Where the pinned wheels are kept.")
    flags.DEFINE_bool("train_split_only", False, "Write train.jsonl only, beside the committed "
                      "valid/test splits and vocabulary (what a fresh clone needs to train).")
    flags.DEFINE_integer("max_input_length", 384, "Longest input in tokens (EOS included).")
    flags.DEFINE_integer("max_target_length", 128, "Longest docstring in tokens (EOS included).")
    flags.DEFINE_integer("vocab_size", 8000, "SentencePiece vocabulary size.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    names = ["max_input_length", "max_target_length", "vocab_size"]
    command = {"script": "scripts/build_docstring_corpus.py",
               "flags": {name: FLAGS[name].value for name in names}}
    manifest = build(FLAGS.output_dir or dc.DOCSTRING_DIR, cache_dir=FLAGS.cache_dir,
                     vocab_size=FLAGS.vocab_size, max_input_length=FLAGS.max_input_length,
                     max_target_length=FLAGS.max_target_length,
                     train_split_only=FLAGS.train_split_only, command=command)
    for name, info in manifest["files"].items():
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "sha256"))


if __name__ == "__main__":
    define_flags()
    config_lib.run_app(main)
