"""Tests for scripts/build_corpus.py: .mo parsing, cleaning, splitting, vocabulary."""

import gettext
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from tests.helpers import REPO, load_script

SCRIPT = os.path.join(REPO, "scripts", "build_corpus.py")


bc = load_script("build_corpus")

HEADER = ("Project-Id-Version: test\nContent-Type: text/plain; charset=UTF-8\n"
          "Plural-Forms: nplurals=2; plural=(n != 1);\n")


def write_mo(path, messages, big_endian=False):
    """Writes a GNU .mo file: `messages` maps msgid -> msgstr (str, NULs allowed)."""
    items = sorted((k.encode("utf-8"), v.encode("utf-8"))
                   for k, v in {"": HEADER, **messages}.items())
    order = ">" if big_endian else "<"
    n = len(items)
    orig_table, trans_table = 28, 28 + 8 * n
    pos = 28 + 16 * n
    blob, orig, trans = b"", [], []
    for key, _ in items:
        orig.append((len(key), pos + len(blob)))
        blob += key + b"\0"
    for _, value in items:
        trans.append((len(value), pos + len(blob)))
        blob += value + b"\0"
    out = struct.pack(order + "7I", 0x950412DE, 0, n, orig_table, trans_table, 0, 0)
    for length, offset in orig + trans:
        out += struct.pack(order + "2I", length, offset)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(out + blob)


CATALOG_A = {
    "Open file": "Datei öffnen",
    "%d file\x00%d files": "%d Datei\x00%d Dateien",  # plural
    "menu\x04Quit": "Beenden",  # context
    "OK": "OK",  # identical
    "x" * 250: "y" * 250,  # too long
    "%s (%d)": "%s – %d",  # placeholders and punctuation only
    "Could not open %(name)s: {0}": "Konnte %(name)s nicht öffnen: {0}",
    "Line one\n  line two\t end": "Zeile eins\nZeile zwei",
    "Save": "Speichern",
    "   ": "   ",
}
CATALOG_B = {"Open file": "Datei öffnen", "Save": "Sichern", "Help": "Hilfe"}
CATALOG_C = {"Save": "Speichern", "Cancel": "Abbrechen"}


@pytest.fixture
def catalogs(tmp_path):
    paths = {
        "a": tmp_path / "usr/share/locale/de/LC_MESSAGES/a.mo",
        "b": tmp_path / "pkg/locale/de_DE/LC_MESSAGES/b.mo",
        "c": tmp_path / "other/de.mo",
        "b_copy": tmp_path / "zzz/locale/de/LC_MESSAGES/b.mo",
    }
    write_mo(str(paths["a"]), CATALOG_A)
    write_mo(str(paths["b"]), CATALOG_B)
    write_mo(str(paths["c"]), CATALOG_C, big_endian=True)
    os.makedirs(paths["b_copy"].parent)
    shutil.copy(paths["b"], paths["b_copy"])
    return {k: str(v) for k, v in paths.items()}


def test_parse_mo_agrees_with_gettext(catalogs):
    entries = bc.read_mo(catalogs["a"])
    with open(catalogs["a"], "rb") as f:
        stdlib = gettext.GNUTranslations(f)
    for e in entries:
        if e.msgid_plural is not None:
            assert stdlib.ngettext(e.msgid, e.msgid_plural, 1) == e.msgstrs[0]
            assert stdlib.ngettext(e.msgid, e.msgid_plural, 5) == e.msgstrs[1]
        elif e.context is not None:
            assert stdlib.pgettext(e.context, e.msgid) == e.msgstrs[0]
        elif e.msgid:
            assert stdlib.gettext(e.msgid) == e.msgstrs[0]
    quit_entry, = [e for e in entries if e.context is not None]
    assert (quit_entry.context, quit_entry.msgid) == ("menu", "Quit")
    # Big-endian files parse to the same entries.
    assert {(e.msgid, e.msgstrs) for e in bc.read_mo(catalogs["c"])} >= {
        ("Save", ("Speichern",)), ("Cancel", ("Abbrechen",))}


def test_parse_mo_rejects_garbage():
    with pytest.raises(bc.MoFormatError):
        bc.parse_mo(b"not a catalog at all, definitely")


def test_entry_pairs_plural_context_header(catalogs):
    pairs = [p for e in bc.read_mo(catalogs["a"]) for p in bc.entry_pairs(e)]
    assert ("%d file", "%d Datei") in pairs
    assert ("%d files", "%d Dateien") in pairs
    assert ("Quit", "Beenden") in pairs
    assert all(source != "" for source, _ in pairs)  # header dropped
    assert not any("\x04" in s or "\x00" in s for pair in pairs for s in pair)


@pytest.mark.parametrize("source,target,expected", [
    ("  Open\n file ", "Datei\töffnen", ("Open file", "Datei öffnen")),
    ("OK", "OK", None),
    ("", "x", None),
    ("Save", "", None),
    ("%s: %s", "%s: %s.", None),
    ("%(count)d / {0}", "{0} – %(count)d", None),
    ("--", "—", None),
    ("%s files", "%s Dateien", ("%s files", "%s Dateien")),
    ("Delete {name}?", "{name} löschen?", ("Delete {name}?", "{name} löschen?")),
    ("a" * 201, "b", None),
    ("a" * 200, "b", ("a" * 200, "b")),
])
def test_clean_pair(source, target, expected):
    assert bc.clean_pair(source, target, max_chars=200) == expected


def test_choose_targets_most_frequent_then_smallest():
    pairs = [("Save", "Speichern"), ("Save", "Sichern"), ("Save", "Speichern"),
             ("Close", "Schließen"), ("Close", "Beenden")]
    assert bc.choose_targets(pairs) == {"Save": "Speichern", "Close": "Beenden"}


def test_is_german_mo():
    yes = ["/usr/share/locale/de/LC_MESSAGES/x.mo", "/p/locale/de_DE/LC_MESSAGES/x.mo",
           "/usr/share/locale/de/LC_TIME/coreutils.mo", "/p/translations/de.mo",
           "/p/i18n/de_DE.mo", "/p/locales/de/x.mo", "/vim/lang/de.UTF-8/LC_MESSAGES/vim.mo"]
    no = ["/usr/share/locale/fr/LC_MESSAGES/x.mo", "/p/locale/de_CH/LC_MESSAGES/x.mo",
          "/p/de/LC_MESSAGES/x.po", "/p/translations/fr.mo", "/p/deutsch/x.mo"]
    assert all(bc.is_german_mo(p) for p in yes)
    assert not any(bc.is_german_mo(p) for p in no)
    assert bc.is_german_mo("/p/locale/de_CH/LC_MESSAGES/x.mo", locales=["de_CH"])


def test_find_mo_files(catalogs, tmp_path):
    write_mo(str(tmp_path / "usr/share/locale/fr/LC_MESSAGES/a.mo"), {"Save": "Enregistrer"})
    found = bc.find_mo_files(prefixes=[str(tmp_path / "usr")],
                             package_dirs=[str(tmp_path / "pkg")],
                             extra_roots=[str(tmp_path / "other")])
    assert found == sorted([catalogs["a"], catalogs["b"], catalogs["c"]])


def test_split_pairs_deterministic_disjoint_capped():
    pairs = {f"message number {i}": f"Nachricht Nummer {i}" for i in range(2000)}
    pairs["File"], pairs["file:"] = "Datei", "Datei:"
    splits = bc.split_pairs(pairs, valid_fraction=0.1, test_fraction=0.1,
                            max_valid=50, max_test=1000)
    assert splits == bc.split_pairs(dict(reversed(list(pairs.items()))), 0.1, 0.1, 50, 1000)
    assert len(splits["valid"]) == 50
    assert 150 < len(splits["test"]) < 260  # ~10% of 2002
    sources = [s for name in bc.SPLITS for s, _ in splits[name]]
    assert sorted(sources) == sorted(pairs) and len(set(sources)) == len(sources)
    # valid keeps the smallest hashes; test sources hash into [0.1, 0.2).
    valid_u = [bc.hash_fraction(s) for s, _ in splits["valid"]]
    assert valid_u == sorted(valid_u) and max(valid_u) < 0.1
    assert all(0.1 <= bc.hash_fraction(s) < 0.2 for s, _ in splits["test"])
    # Near-duplicates land in the same split.
    where = {s: name for name in bc.SPLITS for s, _ in splits[name]}
    assert where["File"] == where["file:"]
    with pytest.raises(ValueError, match="valid_fraction"):
        bc.split_pairs(pairs, valid_fraction=0.6, test_fraction=0.5)


def test_build_corpus_end_to_end(catalogs, tmp_path):
    out = str(tmp_path / "corpus")
    files = sorted(catalogs.values())
    manifest = bc.build_corpus(out, files, valid_fraction=0.0, test_fraction=0.0,
                               vocab_size=0, command={"argv": ["test"]})
    train = bc.read_tsv(os.path.join(out, "train.tsv"))
    assert dict(train) == {
        "Open file": "Datei öffnen",
        "%d file": "%d Datei",
        "%d files": "%d Dateien",
        "Quit": "Beenden",
        "Could not open %(name)s: {0}": "Konnte %(name)s nicht öffnen: {0}",
        "Line one line two end": "Zeile eins Zeile zwei",
        # 2 x Speichern (a, c) beat 1 x Sichern: the byte-identical copy of b
        # is read once (with it, the tie would go to "Sichern").
        "Save": "Speichern",
        "Help": "Hilfe",
        "Cancel": "Abbrechen",
    }
    assert len(train) == len(dict(train))
    assert manifest["counts"] == {"train": 9, "valid": 0, "test": 0}
    assert manifest["num_mo_files"] == 4 and manifest["num_mo_files_read"] == 3
    by_path = {s["path"]: s for s in manifest["sources"]}
    assert by_path[catalogs["b_copy"]]["duplicate_of"] == catalogs["b"]
    assert by_path[catalogs["a"]]["clean_pairs"] == 7
    assert by_path[catalogs["c"]]["clean_pairs"] == 2
    assert manifest["command"] == {"argv": ["test"]}
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        assert json.load(f) == manifest
    for name in ("train.tsv", "valid.tsv", "test.tsv"):
        assert manifest["files"][name]["sha256"] == bc.file_sha256(os.path.join(out, name))

    # Splitting on real fractions sends every pair somewhere exactly once.
    manifest2 = bc.build_corpus(str(tmp_path / "c2"), files, valid_fraction=0.3,
                                test_fraction=0.3, vocab_size=0)
    assert sum(manifest2["counts"].values()) == 9


def _vocab_texts():
    words = ["file", "open", "save", "close", "error", "cannot", "read", "write", "Datei",
             "öffnen", "speichern", "Fehler", "lesen", "schreiben", "nicht", "kann"]
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(3 + i % 5))
            for i in range(300)]


def test_vocabulary_ids_and_determinism(tmp_path):
    import sentencepiece as spm

    texts = _vocab_texts()
    a, b = str(tmp_path / "a.model"), str(tmp_path / "b.model")
    digest_a = bc.train_vocabulary(texts, a, vocab_size=300, hard_vocab_limit=False)
    digest_b = bc.train_vocabulary(texts, b, vocab_size=300, hard_vocab_limit=False)
    assert digest_a == digest_b == bc.file_sha256(a) == bc.file_sha256(b)
    sp = spm.SentencePieceProcessor(model_file=a)
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
    assert [sp.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    # Byte fallback: characters never seen are bytes, not <unk>.
    text = "Fehler: ☃ 漢字"
    ids = sp.encode(text)
    assert sp.unk_id() not in ids and sp.decode(ids) == text
    with pytest.raises(ValueError, match="empty"):
        bc.train_vocabulary([], str(tmp_path / "c.model"))


def test_vocabulary_through_build_and_seqio(catalogs, tmp_path):
    import seqio

    out = str(tmp_path / "corpus")
    extra = str(tmp_path / "extra.mo")
    write_mo(extra, {t: f"{t} (de)" for t in _vocab_texts()})
    manifest = bc.build_corpus(out, sorted(catalogs.values()) + [extra], vocab_size=300,
                               hard_vocab_limit=False)
    model = os.path.join(out, "spm.model")
    assert manifest["vocabulary"]["sha256"] == bc.file_sha256(model)
    assert manifest["files"]["spm.model"]["sha256"] == manifest["vocabulary"]["sha256"]
    vocab = seqio.SentencePieceVocabulary(model)
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
    assert vocab.vocab_size == manifest["vocabulary"]["vocab_size"]
    assert vocab.decode(vocab.encode("Datei öffnen")) == "Datei öffnen"


def test_script_help_and_run(catalogs, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO)
    # absl's --help prints the module docstring and flags, then exits with status 1.
    help_text = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True,
                               text=True, env=env, check=False).stdout
    assert help_text.startswith("Builds an offline English->German corpus")
    assert "scripts/build_corpus.py --output_dir=data/corpus" in help_text
    assert "--vocab_size" in help_text
    out = str(tmp_path / "corpus")
    subprocess.run([sys.executable, SCRIPT, f"--output_dir={out}",
                    f"--mo_files={catalogs['a']},{catalogs['b']}", "--vocab_size=0",
                    "--valid_fraction=0", "--test_fraction=0"],
                   capture_output=True, text=True, env=env, check=True)
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["counts"]["train"] == 8
    assert manifest["command"]["flags"]["mo_files"] == [catalogs["a"], catalogs["b"]]
    assert manifest["command"]["argv"][0] == "scripts/build_corpus.py"
    assert hashlib.sha256(open(os.path.join(out, "train.tsv"), "rb").read()).hexdigest() == \
        manifest["files"]["train.tsv"]["sha256"]


def test_build_monolingual_keeps_only_sources_the_corpus_cannot_have_seen(catalogs, tmp_path):
    """mono_en.txt takes English msgids from every locale's catalogs, minus anything whose
    split key is in the corpus (any split) or that would hash into the valid/test ranges."""
    out = str(tmp_path / "corpus")
    bc.build_corpus(out, sorted(catalogs.values()), valid_fraction=0.2, test_fraction=0.2,
                    vocab_size=0)
    held = {bc.split_key(s) for name in bc.SPLITS
            for s, _ in bc.read_tsv(os.path.join(out, f"{name}.tsv"))}
    candidates = [f"Print page {w}" for w in ("one", "two", "three", "four", "five", "six",
                                              "seven", "eight", "nine", "ten", "eleven")]
    french = {"Open file": "Ouvrir", "open FILE!": "Ouvrir !", "%s: %d": "%s : %d",
              "z" * 250: "y", "Line one\n two": "Ligne", **{c: "Imprimer" for c in candidates}}
    fr_path = str(tmp_path / "usr/share/locale/fr/LC_MESSAGES/x.mo")
    write_mo(fr_path, french)
    assert bc.find_mo_files(prefixes=[str(tmp_path / "usr")], package_dirs=[],
                            locales=None) == [catalogs["a"], fr_path]  # every locale
    entry = bc.build_monolingual(out, [fr_path, catalogs["a"]], command={"argv": ["t"]})
    with open(os.path.join(out, bc.MONO), encoding="utf-8") as f:
        kept = f.read().splitlines()
    assert "Open file" not in kept and "open FILE!" not in kept  # in the corpus (split key)
    assert "%s: %d" not in kept and "z" * 250 not in kept
    assert all(bc.split_key(s) not in held and bc.hash_fraction(s) >= 0.4 for s in kept)
    # Of the 11 new sentences those hashing into [0, 0.4) are left out: some are, some are not.
    expected = sorted((bc.hash_fraction(c), c) for c in candidates + ["Line one two"]
                      if bc.hash_fraction(c) >= 0.4)
    assert kept == [c for _, c in expected] and 0 < len(kept) < 12
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["files"][bc.MONO] == entry and entry["sources"] == len(kept)
    assert entry["sha256"] == bc.file_sha256(os.path.join(out, bc.MONO))
    assert manifest["counts"]["train"] > 0  # the corpus entries are untouched


def test_bundled_monolingual_sources_do_not_overlap_the_corpus():
    corpus = os.path.join(REPO, "speculative", "data", "mini")
    held = {bc.split_key(s) for name in bc.SPLITS
            for s, _ in bc.read_tsv(os.path.join(corpus, f"{name}.tsv"))}
    with open(os.path.join(corpus, bc.MONO), encoding="utf-8") as f:
        mono = f.read().splitlines()
    with open(os.path.join(corpus, "manifest.json"), encoding="utf-8") as f:
        entry = json.load(f)["files"][bc.MONO]
    assert len(mono) == entry["sources"] > 10000
    assert bc.file_sha256(os.path.join(corpus, bc.MONO)) == entry["sha256"]
    assert not {bc.split_key(s) for s in mono} & held
