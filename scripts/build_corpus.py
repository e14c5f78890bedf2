r"""Builds an offline English->German corpus from gettext catalogs, plus a vocabulary.

The paper's WMT EnDe task needs a TFDS download; this script makes a small
translation corpus from what is already on the machine: the German gettext
catalogs (`.mo` files) that Linux packages and Python packages ship.

1. Find German catalogs: `<prefix>/share/**/<de|de_DE>/LC_*/*.mo` for the
   prefixes /usr, /usr/local, sys.prefix and sys.base_prefix, and `.mo` files
   under installed Python packages (`**/locale/de/LC_MESSAGES/*.mo`, `de.mo`,
   `de_DE` variants). Byte-identical copies are read once.
2. Parse each catalog (GNU .mo format, little or big endian): msgid is English,
   msgstr German. Plural entries give the singular pair and the plural pair;
   the header (empty msgid) is dropped; a `context\x04msgid` prefix is removed.
3. Clean: collapse whitespace, drop empty pairs, pairs with source == target,
   pairs longer than --max_chars on either side, and pairs that are only
   punctuation or placeholders. printf-style and brace placeholders ({0},
   {name}) stay as text; nothing is unescaped.
4. Deduplicate and keep one target per source: the most frequent one, ties
   broken by the lexicographically smallest.
5. Split by a sha256 hash of the normalized source (lowercase, letters and
   digits only, so "File" and "File:" land in the same split) into train /
   valid / test; valid and test are capped (--max_valid, --max_test), the
   overflow goes to train.
6. Write train.tsv, valid.tsv, test.tsv (source<TAB>target) and train a
   SentencePiece unigram vocabulary (T5 ids: pad 0, eos 1, unk 2, no bos; byte
   fallback) on both sides of the train split: spm.model. manifest.json records
   the counts, every catalog read with its pair counts, the sha256 of each
   output file and the flags used.

Everything is deterministic given the catalogs: running twice gives the same
bytes (the vocabulary is trained with one thread and a fixed seed).

Example:

  python scripts/build_corpus.py --output_dir=data/corpus \
      --vocab_size=4000

Expect a few seconds for the corpus and under a minute for the vocabulary; the
number of pairs depends on the installed packages (tens of thousands on a
Debian machine with the usual locales).
"""

import collections
import dataclasses
import hashlib
import json
import os
import re
import site
import struct
import sys
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from absl import app, flags, logging

from speculative import files
from speculative.data import corpora
from speculative.runs import config as config_lib

_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", "data/corpus", "Where to write the TSVs, spm.model and manifest.json."
)
_LOCALES = flags.DEFINE_list(
    "locales", ["de", "de_DE"], "Locale directory / file names that count as German."
)
_MO_FILES = flags.DEFINE_list(
    "mo_files", None, "Explicit .mo files to read instead of searching the machine."
)
_EXTRA_ROOTS = flags.DEFINE_list(
    "extra_roots", [], "More directories to search recursively for German .mo files."
)
_MAX_CHARS = flags.DEFINE_integer(
    "max_chars", 200, "Drop pairs whose source or target is longer than this."
)
_VALID_FRACTION = flags.DEFINE_float("valid_fraction", 0.02, "Share of sources for valid.")
_TEST_FRACTION = flags.DEFINE_float("test_fraction", 0.02, "Share of sources for test.")
_MAX_VALID = flags.DEFINE_integer("max_valid", 1000, "Cap on valid pairs (rest to train).")
_MAX_TEST = flags.DEFINE_integer("max_test", 1000, "Cap on test pairs (rest to train).")
_VOCAB_SIZE = flags.DEFINE_integer(
    "vocab_size", 4000, "SentencePiece vocabulary size; 0 skips the vocabulary."
)
_BYTE_FALLBACK = flags.DEFINE_bool(
    "byte_fallback", True, "Spell unknown characters as UTF-8 bytes (nothing is <unk>)."
)
_MONOLINGUAL = flags.DEFINE_bool(
    "monolingual", False,
    "Instead of building the corpus, add mono_en.txt to the one in --output_dir: English "
    "msgids of the catalogs of every locale that the corpus does not hold (distillation "
    "sources the target has never seen).",
)

SPLITS = ("train", "valid", "test")
SPM_MODEL = "spm.model"
MONO = "mono_en.txt"
MANIFEST = "manifest.json"
DEFAULT_PREFIXES = ("/usr", "/usr/local", sys.prefix, sys.base_prefix)

_MO_MAGIC = 0x950412DE
_CONTEXT_SEP = "\x04"
# printf-style (%s, %-10.3ld, %1$s, %(name)s, %%), brace-style ({0}, {name}, {}).
_PLACEHOLDER_RE = re.compile(
    r"%(?:\([^)]*\)|\d+\$)?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
    r"(?:hh|h|ll|l|L|q|j|z|Z|t|I64|I32|I)?[diouxXeEfFgGaAcspnmS%]"
    r"|\{[^{}\s]*\}"
)


class MoFormatError(ValueError):
    """A file is not a valid GNU .mo catalog."""


@dataclasses.dataclass(frozen=True)
class MoEntry:
    """One catalog entry; msgstrs has one string per plural form."""

    context: Optional[str]
    msgid: str
    msgid_plural: Optional[str]
    msgstrs: Tuple[str, ...]


# ----------------------------------------------------------------------------
# Finding catalogs.


def _locale_name(name: str) -> str:
    """'de_DE.UTF-8' -> 'de_DE'; 'de-DE' -> 'de_DE'."""
    return name.split(".")[0].split("@")[0].replace("-", "_")


def is_german_mo(path: str, locales: Sequence[str] = ("de", "de_DE")) -> bool:
    """True for `.../<locale>/LC_*/x.mo`, `.../<locale>/x.mo` or `.../<locale>.mo`."""
    if not path.endswith(".mo"):
        return False
    wanted = set(locales)
    parts = os.path.normpath(path).split(os.sep)
    stem = _locale_name(parts[-1][: -len(".mo")])
    if stem in wanted:
        return True
    dirs = parts[:-1]
    if dirs and dirs[-1].startswith("LC_"):
        return len(dirs) >= 2 and _locale_name(dirs[-2]) in wanted
    return bool(dirs) and _locale_name(dirs[-1]) in wanted


def _walk_mo(root: str, locales: Optional[Sequence[str]]) -> Iterable[str]:
    """.mo files under `root` for `locales` (None: every .mo file)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            wanted = path.endswith(".mo") if locales is None else is_german_mo(path, locales)
            if wanted and os.path.isfile(path):
                yield path


def python_package_dirs(prefixes: Sequence[str] = DEFAULT_PREFIXES) -> List[str]:
    """site-/dist-packages directories of this interpreter and of the prefixes."""
    dirs = list(site.getsitepackages())
    user = site.getusersitepackages()
    if isinstance(user, str):
        dirs.append(user)
    dirs += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    for prefix in prefixes:
        lib = os.path.join(prefix, "lib")
        if os.path.isdir(lib):
            for name in sorted(os.listdir(lib)):
                if name.startswith("python3"):
                    for sub in ("site-packages", "dist-packages"):
                        dirs.append(os.path.join(lib, name, sub))
    seen, out = set(), []
    for d in dirs:
        real = os.path.realpath(d)
        if os.path.isdir(real) and real not in seen:
            seen.add(real)
            out.append(d)
    return out


def find_mo_files(
    prefixes: Sequence[str] = DEFAULT_PREFIXES,
    package_dirs: Optional[Sequence[str]] = None,
    extra_roots: Sequence[str] = (),
    locales: Optional[Sequence[str]] = ("de", "de_DE"),
) -> List[str]:
    """German .mo files (`locales=None`: all .mo files) under `<prefix>/share`, Python package
    dirs and extra roots.

    Paths are returned sorted and unique by real path (copies with the same bytes
    are removed later, in `build_corpus`).
    """
    if package_dirs is None:
        package_dirs = python_package_dirs(prefixes)
    roots = [os.path.join(p, "share") for p in prefixes]
    roots += list(package_dirs) + list(extra_roots)
    found = {}
    for root in roots:
        if os.path.isdir(root):
            for path in _walk_mo(root, locales):
                found.setdefault(os.path.realpath(path), path)
    return sorted(found.values())


# ----------------------------------------------------------------------------
# Reading catalogs.


def _charset(header: str) -> str:
    match = re.search(r"charset=([^\s;]+)", header, flags=re.IGNORECASE)
    name = match.group(1) if match else "utf-8"
    if name.upper() == "CHARSET":  # an unfilled template header
        return "utf-8"
    try:
        "".encode(name)
    except LookupError:
        return "utf-8"
    return name


def parse_mo(data: bytes) -> List[MoEntry]:
    """Parses the bytes of a GNU .mo file (documented in the gettext manual).

    Layout: magic, revision, N, offset of the original-strings table, offset of
    the translated-strings table; each table holds N (length, offset) pairs.
    Plural msgids are `singular\\0plural`, plural msgstrs `form0\\0form1...`,
    and a context is a `context\\x04` prefix of the msgid.
    """
    if len(data) < 20:
        raise MoFormatError(f"only {len(data)} bytes; a .mo header has 20")
    (magic,) = struct.unpack("<I", data[:4])
    if magic == _MO_MAGIC:
        order = "<"
    elif magic == struct.unpack(">I", struct.pack("<I", _MO_MAGIC))[0]:
        order = ">"
    else:
        raise MoFormatError(f"bad magic number 0x{magic:08x}")
    revision, count, orig_off, trans_off = struct.unpack(order + "4I", data[4:20])
    if revision >> 16 not in (0, 1):
        raise MoFormatError(f"unsupported major revision {revision >> 16}")

    def table(offset):
        strings = []
        for i in range(count):
            pos = offset + 8 * i
            length, start = struct.unpack(order + "2I", data[pos : pos + 8])
            if start + length > len(data):
                raise MoFormatError(f"string {i} runs past the end of the file")
            strings.append(data[start : start + length])
        return strings

    originals, translations = table(orig_off), table(trans_off)
    charset = "utf-8"
    for msgid, msgstr in zip(originals, translations):
        if msgid == b"":
            charset = _charset(msgstr.decode("ascii", errors="replace"))
    entries = []
    for msgid, msgstr in zip(originals, translations):
        try:
            ids = msgid.decode(charset).split("\x00")
            strs = msgstr.decode(charset).split("\x00")
        except UnicodeDecodeError:
            continue
        context = None
        if _CONTEXT_SEP in ids[0]:
            context, ids[0] = ids[0].split(_CONTEXT_SEP, 1)
        entries.append(
            MoEntry(
                context=context,
                msgid=ids[0],
                msgid_plural=ids[1] if len(ids) > 1 else None,
                msgstrs=tuple(strs),
            )
        )
    return entries


def read_mo(path: str) -> List[MoEntry]:
    with open(path, "rb") as f:
        return parse_mo(f.read())


def entry_pairs(entry: MoEntry) -> List[Tuple[str, str]]:
    """(English, German) pairs of one entry; the header gives none.

    A plural entry gives (singular, form 0) and (plural, form 1): German has two
    plural forms, and form 1 is the one used for n != 1.
    """
    if entry.msgid == "" and entry.context is None:
        return []
    pairs = [(entry.msgid, entry.msgstrs[0])]
    if entry.msgid_plural is not None and len(entry.msgstrs) > 1:
        pairs.append((entry.msgid_plural, entry.msgstrs[1]))
    return pairs


# ----------------------------------------------------------------------------
# Cleaning, deduplication, splitting.


def normalize_text(text: str) -> str:
    """Strips and collapses every run of whitespace (newlines, tabs) to one space."""
    return " ".join(text.split())


def has_words(text: str) -> bool:
    """False for text that is only punctuation, digits and placeholders."""
    return any(ch.isalpha() for ch in _PLACEHOLDER_RE.sub(" ", text))


def clean_pair(source: str, target: str, max_chars: int = 200) -> Optional[Tuple[str, str]]:
    """The normalized pair, or None when it should be dropped."""
    source, target = normalize_text(source), normalize_text(target)
    if not source or not target or source == target:
        return None
    if len(source) > max_chars or len(target) > max_chars:
        return None
    if not has_words(source) or not has_words(target):
        return None
    return source, target


def choose_targets(pairs: Iterable[Tuple[str, str]]) -> Dict[str, str]:
    """One target per source: the most frequent, ties -> lexicographically smallest."""
    counts = collections.Counter(pairs)
    best: Dict[str, Tuple[int, str]] = {}
    for (source, target), n in counts.items():
        current = best.get(source)
        if current is None or (-n, target) < (-current[0], current[1]):
            best[source] = (n, target)
    return {source: target for source, (_, target) in best.items()}


def split_key(source: str) -> str:
    """Normalized source used for hashing: near-duplicates share a split."""
    key = re.sub(r"\W+", "", source.lower())
    return key or source


def hash_fraction(source: str) -> float:
    """A deterministic number in [0, 1) from sha256 of the split key."""
    return corpora.hash_fraction(split_key(source))


def split_pairs(
    pairs: Mapping[str, str],
    valid_fraction: float = 0.02,
    test_fraction: float = 0.02,
    max_valid: int = 1000,
    max_test: int = 1000,
) -> Dict[str, List[Tuple[str, str]]]:
    """Splits source -> target into train/valid/test, each ordered by hash.

    A source goes to valid when its hash fraction u < valid_fraction, to test when
    valid_fraction <= u < valid_fraction + test_fraction; of those only the
    max_valid / max_test with the smallest u are kept and the rest join train.
    """
    if valid_fraction < 0 or test_fraction < 0 or valid_fraction + test_fraction >= 1:
        raise ValueError(
            f"valid_fraction={valid_fraction} and test_fraction={test_fraction} must be "
            ">= 0 and sum to less than 1"
        )
    keyed = sorted((hash_fraction(s), s, t) for s, t in pairs.items())
    splits = {name: [] for name in SPLITS}
    for u, source, target in keyed:
        if u < valid_fraction and len(splits["valid"]) < max_valid:
            splits["valid"].append((source, target))
        elif (
            valid_fraction <= u < valid_fraction + test_fraction
            and len(splits["test"]) < max_test
        ):
            splits["test"].append((source, target))
        else:
            splits["train"].append((source, target))
    return splits


# ----------------------------------------------------------------------------
# Writing.


def _tsv_field(text: str) -> str:
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def write_tsv(path: str, pairs: Sequence[Tuple[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for source, target in pairs:
            f.write(f"{_tsv_field(source)}\t{_tsv_field(target)}\n")


def read_tsv(path: str) -> List[Tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t", 1)) for line in f if line.strip()]


file_sha256 = corpora.file_sha256


def train_vocabulary(
    texts: Sequence[str],
    model_path: str,
    vocab_size: int = 4000,
    byte_fallback: bool = True,
    hard_vocab_limit: bool = True,
) -> str:
    """Trains the corpus' SentencePiece unigram model on `texts`; returns its sha256
    (`corpora.train_sentencepiece`: T5 ids, deterministic)."""
    return corpora.train_sentencepiece(
        texts, model_path, vocab_size, byte_fallback=byte_fallback,
        character_coverage=0.9995 if byte_fallback else 1.0, hard_vocab_limit=hard_vocab_limit)


def build_corpus(
    output_dir: str,
    mo_files: Optional[Sequence[str]] = None,
    *,
    locales: Sequence[str] = ("de", "de_DE"),
    extra_roots: Sequence[str] = (),
    max_chars: int = 200,
    valid_fraction: float = 0.02,
    test_fraction: float = 0.02,
    max_valid: int = 1000,
    max_test: int = 1000,
    vocab_size: int = 4000,
    byte_fallback: bool = True,
    hard_vocab_limit: bool = True,
    command: Optional[Mapping[str, object]] = None,
) -> dict:
    """Builds the corpus (and vocabulary unless vocab_size == 0); returns the manifest.

    Args:
        output_dir: created if missing; gets train/valid/test.tsv, spm.model and
            manifest.json.
        mo_files: catalogs to read; None searches the machine (`find_mo_files`).
        command: recorded in the manifest as how the corpus was made.
    """
    if mo_files is None:
        mo_files = find_mo_files(extra_roots=extra_roots, locales=locales)
    if not mo_files:
        raise FileNotFoundError(
            "no German .mo catalogs found; pass --mo_files or --extra_roots, or install "
            "a package that ships German translations"
        )
    sources, all_pairs, seen_digests = [], [], {}
    for path in mo_files:
        with open(path, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        record = {"path": path, "sha256": digest}
        if digest in seen_digests:
            record.update(duplicate_of=seen_digests[digest], entries=0, pairs=0, clean_pairs=0)
            sources.append(record)
            continue
        seen_digests[digest] = path
        try:
            entries = parse_mo(data)
        except MoFormatError as e:
            logging.warning("skipping %s: %s", path, e)
            record.update(error=str(e), entries=0, pairs=0, clean_pairs=0)
            sources.append(record)
            continue
        raw = [p for e in entries for p in entry_pairs(e)]
        clean = [c for c in (clean_pair(s, t, max_chars) for s, t in raw) if c is not None]
        record.update(entries=len(entries), pairs=len(raw), clean_pairs=len(clean))
        sources.append(record)
        all_pairs.extend(clean)

    unique_pairs = len(set(all_pairs))
    chosen = choose_targets(all_pairs)
    splits = split_pairs(chosen, valid_fraction, test_fraction, max_valid, max_test)

    os.makedirs(output_dir, exist_ok=True)
    files = {}
    for name in SPLITS:
        path = os.path.join(output_dir, f"{name}.tsv")
        write_tsv(path, splits[name])
        files[f"{name}.tsv"] = {"pairs": len(splits[name]), "bytes": os.path.getsize(path),
                                "sha256": file_sha256(path)}

    vocab = None
    if vocab_size:
        texts = [text for pair in splits["train"] for text in pair]
        model_path = os.path.join(output_dir, SPM_MODEL)
        digest = train_vocabulary(texts, model_path, vocab_size, byte_fallback, hard_vocab_limit)
        import sentencepiece as spm  # pylint: disable=g-import-not-at-top

        processor = spm.SentencePieceProcessor(model_file=model_path)
        vocab = {"file": SPM_MODEL, "sha256": digest, "vocab_size": processor.get_piece_size(),
                 "requested_vocab_size": vocab_size, "model_type": "unigram",
                 "pad_id": processor.pad_id(), "eos_id": processor.eos_id(),
                 "unk_id": processor.unk_id(), "bos_id": processor.bos_id(),
                 "byte_fallback": byte_fallback, "trained_on": "train.tsv, both sides"}
        files[SPM_MODEL] = {"bytes": os.path.getsize(model_path), "sha256": digest}

    manifest = {
        "description": "English->German pairs from gettext .mo catalogs (msgid -> msgstr)",
        "counts": {name: len(splits[name]) for name in SPLITS},
        "num_mo_files": len(mo_files),
        "num_mo_files_read": len(seen_digests),
        "pairs_clean_total": len(all_pairs),
        "pairs_unique": unique_pairs,
        "sources_unique": len(chosen),
        "files": files,
        "vocabulary": vocab,
        "settings": {"locales": list(locales), "max_chars": max_chars,
                     "valid_fraction": valid_fraction, "test_fraction": test_fraction,
                     "max_valid": max_valid, "max_test": max_test,
                     "vocab_size": vocab_size, "byte_fallback": byte_fallback},
        "command": dict(command) if command else None,
        "sources": sources,
    }
    with open(os.path.join(output_dir, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False, sort_keys=False)
        f.write("\n")
    return manifest


def build_monolingual(
    corpus_dir: str,
    mo_files: Optional[Sequence[str]] = None,
    *,
    extra_roots: Sequence[str] = (),
    max_chars: int = 200,
    command: Optional[Mapping[str, object]] = None,
) -> dict:
    """Writes `corpus_dir/mono_en.txt` and its entry in manifest.json; returns that entry.

    The English msgids of every locale's catalogs (cleaned like the corpus' sources) that
    the corpus cannot have seen: a source is kept only if its split key (`split_key`) differs
    from that of every train/valid/test source and its hash fraction lies past the valid and
    test ranges of the manifest's settings, so no near-duplicate of an evaluation sentence
    gets in. One source per line, ordered by hash. A draft distilled on the target's
    translations of them learns how the target generalises, not what it memorised.
    """
    with open(os.path.join(corpus_dir, MANIFEST), encoding="utf-8") as f:
        manifest = json.load(f)
    settings = manifest["settings"]
    held = {split_key(s) for name in SPLITS
            for s, _ in read_tsv(os.path.join(corpus_dir, f"{name}.tsv"))}
    if mo_files is None:
        mo_files = find_mo_files(extra_roots=extra_roots, locales=None)
    kept, seen_digests = {}, set()
    for path in mo_files:
        with open(path, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen_digests:
            continue
        seen_digests.add(digest)
        try:
            entries = parse_mo(data)
        except MoFormatError as e:
            logging.warning("skipping %s: %s", path, e)
            continue
        for entry in entries:
            for text in (entry.msgid, entry.msgid_plural):
                text = normalize_text(text or "")
                if not text or len(text) > max_chars or not has_words(text):
                    continue
                key = split_key(text)
                u = hash_fraction(text)
                if key not in held and u >= settings["valid_fraction"] + settings["test_fraction"]:
                    kept.setdefault(key, (u, text))
    sources = [text for _, text in sorted(kept.values())]
    path = os.path.join(corpus_dir, MONO)
    files.write_atomic(path, "".join(_tsv_field(text) + "\n" for text in sources))
    entry = {"sources": len(sources), "num_mo_files_read": len(seen_digests),
             "bytes": os.path.getsize(path), "sha256": file_sha256(path),
             "max_chars": max_chars, "command": dict(command) if command else None}
    manifest.setdefault("files", {})[MONO] = entry
    files.write_atomic(os.path.join(corpus_dir, MANIFEST),
                       json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return entry


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _MONOLINGUAL.value:
        entry = build_monolingual(
            _OUTPUT_DIR.value, _MO_FILES.value, extra_roots=_EXTRA_ROOTS.value,
            max_chars=_MAX_CHARS.value,
            command={"argv": ["scripts/build_corpus.py"] + sys.argv[1:]})
        print(json.dumps({k: entry[k] for k in ("sources", "num_mo_files_read", "bytes")}))
        return
    names = ["output_dir", "locales", "mo_files", "extra_roots", "max_chars", "valid_fraction",
             "test_fraction", "max_valid", "max_test", "vocab_size", "byte_fallback"]
    command = {
        "argv": ["scripts/build_corpus.py"] + sys.argv[1:],
        "flags": {name: flags.FLAGS[name].value for name in names},
    }
    manifest = build_corpus(
        _OUTPUT_DIR.value,
        _MO_FILES.value,
        locales=_LOCALES.value,
        extra_roots=_EXTRA_ROOTS.value,
        max_chars=_MAX_CHARS.value,
        valid_fraction=_VALID_FRACTION.value,
        test_fraction=_TEST_FRACTION.value,
        max_valid=_MAX_VALID.value,
        max_test=_MAX_TEST.value,
        vocab_size=_VOCAB_SIZE.value,
        byte_fallback=_BYTE_FALLBACK.value,
        command=command,
    )
    print(json.dumps({k: manifest[k] for k in ("counts", "num_mo_files", "num_mo_files_read",
                                               "pairs_unique", "sources_unique")}, indent=1))
    for name, info in manifest["files"].items():
        print(f"{name}: {info['bytes']} bytes")


if __name__ == "__main__":
    config_lib.run_app(main)
