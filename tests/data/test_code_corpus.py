"""Tests of scripts/build_code_corpus.py and speculative/data/code_corpus.py.

Known answers: the sources found are the stdlib's minus test packages, installed packages and
per-machine build files; a build is byte-for-byte deterministic and its splits are disjoint,
cover every file and follow the path hash; the vocabulary gives back every real stdlib file
exactly (and tabs, trailing spaces, CR, form feeds, non-ASCII); the bundled files match their
manifest; chunks and line windows tile their input.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest
import sentencepiece as spm

from speculative.data import code_corpus
from tests.helpers import REPO, TINY_CODE_PATHS, TINY_CODE_SPLITS, load_script

bcc = load_script("build_code_corpus")
STDLIB = sysconfig.get_paths()["stdlib"]


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_find_sources_skips_tests_installed_packages_and_build_files(tmp_path):
    keep = ["a.py", "pkg/b.py", "pkg/sub/c.py", "idlelib/editor.py", "testing.py"]
    skip = ["test/test_a.py", "pkg/tests/test_b.py", "idlelib/idle_test/t.py",
            "site-packages/numpy/core.py", "dist-packages/x.py", "config-3.11-x86_64/p.py",
            "_sysconfigdata__linux_x86_64.py", "notes.txt", "__pycache__/a.py"]
    for path in keep + skip:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x = 1\n")
    assert bcc.find_sources(str(tmp_path)) == sorted(keep)
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "latin.py").write_bytes("# -*- coding: latin-1 -*-\nname = 'Jos\xe9'\n"
                                        .encode("latin-1"))
    docs, skipped = bcc.read_sources(str(tmp_path), ["a.py", "empty.py", "latin.py"])
    assert docs == [code_corpus.Document("a.py", "x = 1\n")]
    assert skipped == {"empty": ["empty.py"], "undecodable": ["latin.py"]}
    with pytest.raises(FileNotFoundError, match="stdlib='/nonexistent'"):
        bcc.find_sources("/nonexistent")


def test_this_machines_stdlib_yields_sources_without_tests():
    paths = bcc.find_sources(STDLIB)
    assert len(paths) > 300 and "json/decoder.py" in paths and "argparse.py" in paths
    assert not any(part in ("test", "tests", "idle_test", "site-packages")
                   for path in paths for part in path.split("/")[:-1])


def test_build_is_deterministic_and_splits_are_disjoint(tiny_code_corpus, tmp_path):
    again = tmp_path / "again"
    manifest = bcc.build_code_corpus(str(again), paths=list(reversed(TINY_CODE_PATHS)),
                                     valid_fraction=0.05, test_fraction=0.15, vocab_size=400)
    for name in ("train.jsonl", "valid.jsonl", "test.jsonl", "spm.model", "manifest.json"):
        assert _sha256(tiny_code_corpus / name) == _sha256(again / name), name
    splits = {name: [d.path for d in code_corpus.read_documents(str(again / f"{name}.jsonl"))]
              for name in code_corpus.SPLITS}
    assert sorted(sum(splits.values(), [])) == sorted(TINY_CODE_PATHS)  # each file once
    assert {k: splits[k] for k in ("valid", "test")} == TINY_CODE_SPLITS
    for name, paths in splits.items():
        assert paths == sorted(paths)
        u = [bcc.hash_fraction(p) for p in paths]
        assert all((x < 0.05) if name == "valid" else (0.05 <= x < 0.2) if name == "test"
                   else x >= 0.2 for x in u), name
    assert manifest["counts"] == {name: len(p) for name, p in splits.items()}
    for name in ("train.jsonl", "valid.jsonl", "test.jsonl", "spm.model"):
        assert manifest["files"][name]["sha256"] == _sha256(again / name)
    for doc in code_corpus.read_documents(str(again / "train.jsonl")):  # the files' exact text
        with open(os.path.join(STDLIB, doc.path), "rb") as f:
            assert doc.text.encode("utf-8") == f.read()
    with pytest.raises(ValueError, match="valid_fraction=0.6"):
        bcc.split_documents([], 0.6, 0.5)


def test_vocabulary_round_trips_real_code_exactly(tiny_code_corpus):
    sp = spm.SentencePieceProcessor(model_file=str(tiny_code_corpus / "spm.model"))
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
    newline = sp.piece_to_id("\n")
    docs = [d for name in code_corpus.SPLITS
            for d in code_corpus.read_documents(str(tiny_code_corpus / f"{name}.jsonl"))]
    assert len(docs) == len(TINY_CODE_PATHS)
    for doc in docs:
        ids = sp.encode(doc.text)
        assert sp.decode(ids) == doc.text, doc.path
        assert sp.unk_id() not in ids and ids.count(newline) == doc.text.count("\n")
    # What the stdlib itself lacks: tabs, trailing blanks, CRLF, form feeds, leading blanks,
    # runs of blank lines, characters never seen in training (byte fallback).
    odd = "\tif x:  \r\n\t\treturn 'Jos\u00e9 \u2603 \U0001F600'\t\n\x0c\n\n\n   # end  "
    assert sp.decode(sp.encode(odd)) == odd
    assert "\n" not in "".join(p for p in map(sp.id_to_piece, sp.encode(odd)) if p != "\n")


def test_bundled_corpus_matches_its_manifest_and_round_trips():
    """The committed valid/test splits and vocabulary are the files the manifest describes, and
    the bundled vocabulary gives back each of their documents exactly."""
    data = code_corpus.CODE_DIR
    with open(os.path.join(data, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(data, "spm.model"))
    assert sp.get_piece_size() == manifest["vocabulary"]["vocab_size"] == 4000
    assert sp.piece_to_id("\n") == manifest["vocabulary"]["newline_piece"]
    for name in ("valid.jsonl", "test.jsonl", "spm.model"):
        assert _sha256(os.path.join(data, name)) == manifest["files"][name]["sha256"], name
    committed = sum(os.path.getsize(os.path.join(data, name))
                    for name in ("valid.jsonl", "test.jsonl", "spm.model", "manifest.json"))
    assert committed < 2e6, committed
    for name in ("valid", "test"):
        docs = code_corpus.read_documents(os.path.join(data, f"{name}.jsonl"))
        assert len(docs) == manifest["counts"][name]
        for doc, ids in zip(docs, sp.encode([d.text for d in docs])):
            assert sp.decode(ids) == doc.text, doc.path


def test_train_split_only_keeps_the_vocabulary_and_the_fractions(tiny_code_corpus, tmp_path):
    out = tmp_path / "corpus"
    shutil.copytree(tiny_code_corpus, out)
    (out / "train.jsonl").unlink()
    vocab = _sha256(out / "spm.model")
    manifest = bcc.build_code_corpus(str(out), paths=TINY_CODE_PATHS, valid_fraction=0.05,
                                     test_fraction=0.15, train_split_only=True)
    assert _sha256(out / "train.jsonl") == _sha256(tiny_code_corpus / "train.jsonl")
    assert _sha256(out / "spm.model") == vocab
    assert manifest["files"]["train.jsonl"]["python_version"] == sys.version.split()[0]
    with pytest.raises(ValueError, match="valid_fraction=0.1.*overlap"):
        bcc.build_code_corpus(str(out), paths=TINY_CODE_PATHS, valid_fraction=0.1,
                              test_fraction=0.15, train_split_only=True)
    with pytest.raises(FileNotFoundError, match="build_code_corpus.py"):
        bcc.build_code_corpus(str(tmp_path / "none"), paths=TINY_CODE_PATHS,
                              train_split_only=True)


def test_script_runs_on_a_given_stdlib(tmp_path):
    stdlib = tmp_path / "lib"
    for path in TINY_CODE_PATHS:
        (stdlib / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(STDLIB, path), stdlib / path)
    (stdlib / "test").mkdir()
    (stdlib / "test" / "test_x.py").write_text("assert True\n")
    out = tmp_path / "corpus"
    env = dict(os.environ, PYTHONPATH=REPO)
    run = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "build_code_corpus.py"),
                          f"--stdlib={stdlib}", f"--output_dir={out}", "--vocab_size=400",
                          "--valid_fraction=0.05", "--test_fraction=0.15"],
                         capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 0, run.stderr
    manifest = json.loads((out / "manifest.json").read_text("utf-8"))
    assert manifest["counts"] == {"train": 10, "valid": 2, "test": 1}  # test/ is skipped
    assert manifest["command"]["flags"]["vocab_size"] == 400
    assert "train.jsonl: documents 10" in run.stdout


def test_lm_chunks_and_line_windows_tile_their_input():
    docs = [[5, 6, 7, 8, 9, 1], [3, 1]]
    chunks = code_corpus.lm_chunks(docs, 4)
    assert [c.tolist() for c in chunks] == [[5, 6, 7, 8], [9, 1], [3, 1]]
    assert all(c.dtype == np.int32 for c in chunks)
    text = "a\n\tb  \n\x0cc\r\nd\n\ne"  # "\f" and "\r" do not end lines; no final newline
    windows = code_corpus.line_windows(text, 2, 1)
    assert windows == [("a\n\tb  \n", "\x0cc\r\n"), ("d\n\n", "e")]
    assert "".join(p + c for p, c in windows) == text
    assert code_corpus.line_windows("a\nb\n", 2, 1) == []  # no line left to continue with
    with pytest.raises(ValueError, match="prompt_lines=0"):
        code_corpus.line_windows(text, 0, 1)
    with pytest.raises(FileNotFoundError, match="--train_split_only"):
        code_corpus.corpus_file("/nonexistent", "train.jsonl")
    with pytest.raises(ValueError, match="split='dev'"):
        code_corpus.split_file("dev")
