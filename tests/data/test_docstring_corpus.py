"""Tests of scripts/build_docstring_corpus.py and speculative/data/docstring_corpus.py.

Known answers: what a function becomes (its code without the docstring, decorators kept,
dedented; the cleaned docstring) and why one is skipped; near-duplicates by normalised code;
cuts at paragraph boundaries only. A build over a fake standard library and a wheel made here
(so no network) is deterministic, leaves test code out of every split, splits by file, and
counts every skip; a wheel whose digest is not the pinned one is refused. The bundled splits
match their manifest, hold >= 1,000 examples each and share no file.
"""

import json
import os
import random
import zipfile

import pytest

from speculative.data import corpora
from speculative.data import docstring_corpus as dc
from tests.helpers import load_script

bdc = load_script("build_docstring_corpus")

SOURCE = '''
import functools


@functools.lru_cache()
def cached(x, y=2):
    """Add two numbers and cache the result.

    The second paragraph says more about how the sum is kept.
    """
    # a comment stays
    return x + y


class Box:
    def get(self, key):
        """Return the value stored under key in this box."""
        value = self._data[key]
        return value

    def short(self):
        """Too short."""
        return 1

    def stub(self):
        """Only a docstring, nothing else here."""

    def inline(self): """An inline docstring on the def line."""; return 2


def outer():
    """Outer function with a nested helper inside it."""
    def helper():
        """The nested helper has its own docstring too."""
        return 3
    return helper
'''


def test_extract_cuts_the_docstring_out_and_counts_skips():
    items = list(dc.extract("pkg/mod.py", SOURCE))
    examples = {e.name: e for e in items if isinstance(e, dc.Example)}
    skips = sorted(s.reason for s in items if isinstance(s, dc.Skip))
    assert sorted(examples) == ["Box.get", "cached", "outer", "outer.helper"]
    assert skips == ["inline_docstring", "no_body", "short_docstring"]
    cached = examples["cached"]
    assert cached.code == ("@functools.lru_cache()\ndef cached(x, y=2):\n"
                           "    # a comment stays\n    return x + y\n")
    assert cached.docstring == ("Add two numbers and cache the result.\n\n"
                                "The second paragraph says more about how the sum is kept.")
    assert examples["Box.get"].code.startswith("def get(self, key):\n    value = ")  # dedented
    assert '"""The nested helper' in examples["outer"].code  # only its own docstring goes
    assert '"""' not in examples["outer.helper"].code


def test_normalised_code_ignores_comments_and_layout_only():
    a = "def f(x):\n    # note\n    return x + 1\n"
    b = "def f(x):\n\n    return x+1  # other\n"
    assert dc.code_hash(a) == dc.code_hash(b)
    assert dc.code_hash(a) != dc.code_hash(a.replace("x + 1", "x + 2"))


def test_cut_paragraphs_keeps_whole_paragraphs_or_nothing():
    doc = "First one.\n\nSecond one here.\n\nThird."
    assert dc.cut_paragraphs(doc, lambda t: len(t) <= 100) == (doc, 0)
    assert dc.cut_paragraphs(doc, lambda t: len(t) <= 30) == ("First one.\n\nSecond one here.", 1)
    assert dc.cut_paragraphs(doc, lambda t: len(t) <= 5) == (None, 3)


def _words(rng, n):
    vocab = ("value key index count name list item table node graph array matrix "
             "return compute parse load save update check build read write convert").split()
    return " ".join(rng.choice(vocab) for _ in range(n))


def _module(rng, n):
    out = []
    for i in range(n):
        out.append(f"def f{i}_{rng.randrange(10**6)}(a, b={i}):\n"
                   f'    """{_words(rng, 8).capitalize()}.\n\n    {_words(rng, 30)}.\n    """\n'
                   + "    a = a + 1\n" * (i % 3) * 8
                   + f"    return a * {i} + b - {rng.randrange(1000)}\n\n")
    return "".join(out)


@pytest.fixture(scope="module")
def fake_sources(tmp_path_factory):
    """A fake standard library (with test code that must not be used) and a pinned wheel."""
    root = tmp_path_factory.mktemp("fake")
    rng = random.Random(0)
    stdlib = root / "stdlib"
    for path in [f"pkg{k}/mod{j}.py" for k in range(6) for j in range(4)] + [
            "tests/test_x.py", "pkg0/test_y.py", "pkg0/tests/helper.py", "conftest.py"]:
        (stdlib / path).parent.mkdir(parents=True, exist_ok=True)
        (stdlib / path).write_text(_module(rng, 12))
    (stdlib / "pkg0" / "copy.py").write_text((stdlib / "pkg1" / "mod0.py").read_text())
    (stdlib / "bad.py").write_text("def broken(:\n")
    cache = root / "cache"
    cache.mkdir()
    wheel_path = cache / "fakepkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel_path, "w") as z:
        for j in range(5):
            z.writestr(zipfile.ZipInfo(f"fakepkg/m{j}.py"), _module(rng, 10))
        z.writestr(zipfile.ZipInfo("fakepkg/testing/t.py"), _module(rng, 3))
        z.writestr(zipfile.ZipInfo("fakepkg-1.0.dist-info/x.py"), _module(rng, 3))
    wheel = bdc.Wheel("fakepkg", "1.0", False, corpora.file_sha256(str(wheel_path)))
    return str(stdlib), str(cache), wheel


def _build(out, fake_sources, **kw):
    stdlib, cache, wheel = fake_sources
    return bdc.build(str(out), cache_dir=cache, wheels=[wheel], stdlib=stdlib, vocab_size=400,
                     vocab_fraction=1.0, valid_fraction=0.2, test_fraction=0.2, **kw)


def test_build_is_deterministic_splits_by_file_and_leaves_tests_out(tmp_path, fake_sources):
    first = _build(tmp_path / "a", fake_sources)
    second = _build(tmp_path / "b", fake_sources)
    assert first == second
    assert first["extraction"]["stdlib"]["files_unparsed"] == 1
    assert first["extraction"]["stdlib"]["duplicate_code"] == 12  # copy.py, all of it
    assert first["extraction"]["fakepkg"]["functions"] == 50
    files_of = {}
    for split in dc.SPLITS:
        examples = dc.read_split(str(tmp_path / "a"), split)
        assert len(examples) == first["counts"][split] > 0
        for e in examples:
            assert not bdc.is_test_or_skipped(e.path.split("/", 1)[1]), e.path
            assert "test" not in e.path and "conftest" not in e.path
            files_of.setdefault(e.path, set()).add(split)
    assert all(len(s) == 1 for s in files_of.values())  # no file in two splits
    assert sum(first["counts"].values()) == 24 * 12 + 50  # 24 modules (+ a copy), the wheel
    for name, record in first["files"].items():
        assert corpora.file_sha256(str(tmp_path / "a" / name)) == record["sha256"]


def test_long_inputs_are_skipped_and_long_docstrings_cut_and_counted(tmp_path, fake_sources):
    manifest = _build(tmp_path, fake_sources, max_input_length=48, max_target_length=16)
    lengths = {k: sum(c.get(k, 0) for c in manifest["lengths"].values())
               for k in ("skipped_long_code", "docstring_cut_at_paragraph", "kept")}
    assert lengths["docstring_cut_at_paragraph"] > 0 and lengths["skipped_long_code"] > 0
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / dc.SPM_MODEL))
    for split in dc.SPLITS:
        for e in dc.read_split(str(tmp_path), split):
            assert len(sp.encode(e.code)) + 1 <= 48 and len(sp.encode(e.docstring)) + 1 <= 16
            assert "\n\n" not in e.docstring  # only the first paragraph fits 16 tokens


def test_train_split_only_rebuilds_the_same_train_file(tmp_path, fake_sources):
    full = _build(tmp_path, fake_sources)
    os.remove(tmp_path / "train.jsonl")
    again = _build(tmp_path, fake_sources, train_split_only=True)
    assert again["files"]["train.jsonl"] == full["files"]["train.jsonl"]
    with pytest.raises(ValueError, match="differ from the corpus"):
        _build(tmp_path, fake_sources, train_split_only=True, max_target_length=64)


def test_a_wheel_with_another_digest_is_refused(tmp_path, fake_sources):
    _, cache, wheel = fake_sources
    with pytest.raises(RuntimeError, match="pinned sha256"):
        bdc.fetch_wheel(wheel._replace(sha256="0" * 64), cache)


def test_bundled_corpus_matches_its_manifest():
    manifest_path = dc.corpus_file(dc.DOCSTRING_DIR, dc.MANIFEST)
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["counts"]["train"] >= 60_000
    files_of = {}
    for split in ("valid", "test"):
        path = os.path.join(dc.DOCSTRING_DIR, dc.split_file(split))
        assert corpora.file_sha256(path) == manifest["files"][dc.split_file(split)]["sha256"]
        examples = dc.read_examples(path)
        assert len(examples) == manifest["counts"][split] >= 1000
        for e in examples:
            files_of.setdefault(e.path, set()).add(split)
            assert e.docstring.strip()  # a kept first paragraph may be under MIN_WORDS
    assert all(len(s) == 1 for s in files_of.values())
    model = os.path.join(dc.DOCSTRING_DIR, dc.SPM_MODEL)
    assert corpora.file_sha256(model) == manifest["files"][dc.SPM_MODEL]["sha256"]
    assert [w["name"] for w in manifest["wheels"]] == sorted(
        (w.name for w in bdc.WHEELS), key=str.lower)
