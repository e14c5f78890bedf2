"""Tests for speculative.tasks: registration, local tasks, offline errors, the metrics attached
(BLEU and ROUGE themselves: tests/measure/test_metrics.py)."""

import json
import os

import pytest
import seqio

from speculative.data import tasks

SEQIO_TEST_SPM = os.path.join(os.path.dirname(seqio.__file__), "test_data", "sentencepiece",
                              "sentencepiece.model")
LENGTHS = {"inputs": 64, "targets": 64}


def _examples(task, split, lengths=None):
    ds = task.get_dataset(lengths or LENGTHS, split=split, shuffle=False)
    return list(ds.as_numpy_iterator())


def test_paper_tasks_registered_lazily():
    wmt = seqio.get_mixture_or_task(tasks.WMT_ENDE_TASK)
    cnn = seqio.get_mixture_or_task(tasks.CNN_DM_TASK)
    assert wmt.source.tfds_dataset.name == "wmt_t2t_translate/de-en:1.0.0"
    assert cnn.source.tfds_dataset.name == "cnn_dailymail:3.4.0"
    for task in (wmt, cnn):
        assert sorted(task.source.splits) == ["test", "train", "validation"]
        assert set(task.output_features) == {"inputs", "targets"}
        assert task.output_features["inputs"].required is False
        assert all(f.add_eos for f in task.output_features.values())
        assert all(f.vocabulary is tasks.default_vocabulary()
                   for f in task.output_features.values())
        # Nothing was loaded: no TFDS builder, no vocabulary model.
        assert not task.source.tfds_dataset.is_memoized()
    assert wmt.metric_fns == [tasks.bleu] and cnn.metric_fns == [tasks.rouge]
    vocab = tasks.default_vocabulary()
    assert vocab._model is None  # pylint: disable=protected-access
    assert vocab.sentencepiece_model_file == tasks.DEFAULT_SPM_PATH
    assert vocab.extra_ids == 100


def test_preprocessor_formats_inputs():
    prefix_step = seqio.get_mixture_or_task(tasks.WMT_ENDE_TASK).preprocessors[0]
    import tensorflow as tf
    raw = tf.data.Dataset.from_tensors({"en": "Hello world.", "de": "Hallo Welt."})
    ex = next(prefix_step(raw).as_numpy_iterator())
    assert ex == {"inputs": b"translate English to German: Hello world.",
                  "targets": b"Hallo Welt."}
    cnn = seqio.get_mixture_or_task(tasks.CNN_DM_TASK).preprocessors[0]
    raw = tf.data.Dataset.from_tensors({"article": "A long text.", "highlights": "Short.",
                                        "id": "x"})
    assert next(cnn(raw).as_numpy_iterator()) == {"inputs": b"summarize: A long text.",
                                                 "targets": b"Short."}


def test_offline_tfds_task_raises_clear_error(tmp_path, monkeypatch):
    empty = str(tmp_path / "tfds")
    os.makedirs(empty)
    with pytest.raises(tasks.TaskDataUnavailableError) as info:
        tasks.check_task_data(tasks.WMT_ENDE_TASK, tfds_data_dir=empty)
    message = str(info.value)
    for needle in ("wmt_t2t_translate/de-en:1.0.0", empty, "cannot download",
                   "tfds build", "--tfds_data_dir", "TFDS_DATA_DIR", "register_tsv_task"):
        assert needle in message
    assert isinstance(info.value, RuntimeError)

    # get_dataset fails the same way, at once, instead of trying to download.
    monkeypatch.setenv("TFDS_DATA_DIR", empty)
    with pytest.raises(tasks.TaskDataUnavailableError, match="cnn_dailymail:3.4.0"):
        seqio.get_mixture_or_task(tasks.CNN_DM_TASK).get_dataset(LENGTHS, split="validation")

    # A prepared dataset directory passes the check.
    prepared = tmp_path / "tfds" / "wmt_t2t_translate" / "de-en" / "1.0.0"
    prepared.mkdir(parents=True)
    (prepared / "dataset_info.json").write_text("{}")
    tasks.check_task_data(tasks.WMT_ENDE_TASK, tfds_data_dir=empty)


def _write_tsv(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for source, target in rows:
            f.write(f"{source}\t{target}\n")


ROWS = [("Open the file", "Die Datei öffnen"),
        ('Say "hello"', "Sag „hallo“"),
        ("Could not read %s", "Konnte %s nicht lesen")]


def test_tsv_task_tokenizes_with_prefix_and_eos(tmp_path):
    path = str(tmp_path / "valid.tsv")
    _write_tsv(path, ROWS)
    vocab = seqio.SentencePieceVocabulary(SEQIO_TEST_SPM)
    task = tasks.register_tsv_task("test_tsv_ende", {"validation": path}, vocab)
    assert seqio.get_mixture_or_task("test_tsv_ende") is task
    examples = _examples(task, "validation")
    assert len(examples) == len(ROWS)
    for ex, (source, target) in zip(examples, ROWS):
        assert ex["inputs_pretokenized"].decode() == "translate English to German: " + source
        assert ex["targets_pretokenized"].decode() == target
        assert ex["inputs"][-1] == 1 and ex["targets"][-1] == 1
        assert 1 not in ex["inputs"][:-1]
        assert ex["inputs"].tolist() == vocab.encode(
            "translate English to German: " + source) + [1]
        assert ex["targets"].tolist() == vocab.encode(target) + [1]
    # Trimmed to the sequence length, EOS is still last.
    short = _examples(task, "validation", {"inputs": 5, "targets": 4})
    assert all(len(ex["inputs"]) == 5 and ex["inputs"][-1] == 1 for ex in short)
    assert task.metric_fns == [tasks.bleu]

    # Re-registering replaces the task; other prefixes and metrics work.
    again = tasks.register_tsv_task("test_tsv_ende", {"validation": path}, vocab,
                                    prefix="summarize: ", metric="rouge")
    assert seqio.get_mixture_or_task("test_tsv_ende") is again
    assert again.metric_fns == [tasks.rouge]
    ex = _examples(again, "validation")[0]
    assert ex["inputs_pretokenized"] == b"summarize: Open the file"
    seqio.TaskRegistry.remove("test_tsv_ende")


def test_tsv_task_missing_file_is_clear(tmp_path):
    vocab = seqio.SentencePieceVocabulary(SEQIO_TEST_SPM)
    missing = str(tmp_path / "nope.tsv")
    task = tasks.register_tsv_task("test_tsv_missing", {"train": missing}, vocab)
    with pytest.raises(tasks.TaskDataUnavailableError, match="nope.tsv"):
        task.get_dataset(LENGTHS, split="train")
    with pytest.raises(ValueError, match="metric"):
        tasks.register_tsv_task("test_tsv_missing", {"train": missing}, vocab, metric="meteor")
    seqio.TaskRegistry.remove("test_tsv_missing")


def test_pairs_task():
    vocab = seqio.SentencePieceVocabulary(SEQIO_TEST_SPM)
    task = tasks.register_pairs_task("test_pairs_ende", {"test": ROWS}, vocab)
    examples = _examples(task, "test")
    assert [ex["targets_pretokenized"].decode() for ex in examples] == [t for _, t in ROWS]
    assert all(ex["targets"][-1] == 1 for ex in examples)
    seqio.TaskRegistry.remove("test_pairs_ende")


def test_bundled_mini_task():
    data_dir = tasks.mini_data_dir()
    assert data_dir == tasks.BUNDLED_MINI_DIR
    with open(os.path.join(data_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    vocab = tasks.mini_vocabulary()
    assert vocab is tasks.mini_vocabulary(data_dir)
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
    assert vocab.vocab_size == manifest["vocabulary"]["vocab_size"]
    task = seqio.get_mixture_or_task(tasks.MINI_TASK)
    assert "validation" in task.source.splits and "test" in task.source.splits
    examples = _examples(task, "validation")
    assert len(examples) == manifest["counts"]["valid"]
    ex = examples[0]
    assert ex["inputs_pretokenized"].startswith(b"translate English to German: ")
    assert ex["inputs"][-1] == 1 and ex["targets"][-1] == 1
    assert vocab.unk_id not in ex["targets"]  # byte fallback
    assert vocab.decode(ex["targets"].tolist()) == ex["targets_pretokenized"].decode()

    with pytest.raises(tasks.TaskDataUnavailableError, match="build_corpus"):
        tasks.mini_vocabulary("/nonexistent/dir")


def _consume(docs, examples, prompt_lines):
    """Matches the examples, in order, to consecutive slices of the documents' text: each file
    is covered from its start, leaving at most `prompt_lines` lines (no continuation) over."""
    k = 0
    for doc in docs:
        pos = 0
        while k < len(examples):
            text = (examples[k]["inputs_pretokenized"] + examples[k]["targets_pretokenized"]
                    ).decode("utf-8")
            if not doc.text.startswith(text, pos):
                break
            pos, k = pos + len(text), k + 1
        assert doc.text[pos:].count("\n") <= prompt_lines, doc.path
    assert k == len(examples)


def test_code_task_yields_prompts_and_continuations_of_the_source(tiny_code_corpus):
    from speculative.data import code_corpus

    task = tasks.register_code_task(str(tiny_code_corpus), name="tiny_code", prompt_lines=4,
                                    continuation_lines=3)
    assert set(task.source.splits) == {"train", "validation", "test"}
    vocab = task.output_features["targets"].vocabulary
    assert vocab is tasks.code_vocabulary(str(tiny_code_corpus)) and vocab.vocab_size == 400
    for split, name in (("validation", "valid"), ("test", "test")):
        examples = _examples(task, split, {"inputs": 512, "targets": 512})
        docs = code_corpus.read_documents(str(tiny_code_corpus / f"{name}.jsonl"))
        _consume(docs, examples, prompt_lines=4)
        for ex in examples:
            prompt, continuation = (ex["inputs_pretokenized"].decode(),
                                    ex["targets_pretokenized"].decode())
            assert prompt.count("\n") == 4 and prompt.endswith("\n")
            assert 1 <= continuation.count("\n") + (not continuation.endswith("\n")) <= 3
            assert vocab.decode(ex["inputs"].tolist()) == prompt  # exactly, whitespace and all
            assert vocab.decode(ex["targets"].tolist()) == continuation
            assert vocab.eos_id not in ex["inputs"] and vocab.eos_id not in ex["targets"]
    with pytest.raises(tasks.TaskDataUnavailableError, match="build_code_corpus"):
        tasks.code_vocabulary("/nonexistent/dir")
    seqio.TaskRegistry.remove("tiny_code")


def test_bundled_code_task():
    from speculative.data import code_corpus

    task = seqio.get_mixture_or_task(tasks.CODE_TASK)
    assert {"validation", "test"} <= set(task.source.splits)
    examples = _examples(task, "validation", {"inputs": 1024, "targets": 1024})
    docs = code_corpus.read_documents(os.path.join(tasks.BUNDLED_CODE_DIR, "valid.jsonl"))
    _consume(docs, examples, prompt_lines=16)
    vocab = task.output_features["inputs"].vocabulary
    assert vocab.vocab_size == 4000
    for ex in examples:
        assert vocab.decode(ex["inputs"].tolist()) == ex["inputs_pretokenized"].decode()
        assert vocab.decode(ex["targets"].tolist()) == ex["targets_pretokenized"].decode()
