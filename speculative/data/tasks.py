"""seqio tasks and vocabularies: the paper's tasks and offline corpora.

Importing this module registers, without reading any data or touching the
network (seqio sources and vocabularies are lazy):

  wmt_t2t_ende_v003    TFDS wmt_t2t_translate/de-en:1.0.0, inputs
                       "translate English to German: <en>", targets "<de>"; BLEU.
  cnn_dailymail_v002   TFDS cnn_dailymail:3.4.0, inputs "summarize: <article>",
                       targets the highlights; ROUGE-1/2/Lsum.
  mini_ende            the offline English->German corpus made from gettext
                       catalogs by scripts/build_corpus.py, with its own
                       4k-piece vocabulary (when its files are present).
  stdlib_code          the offline Python-code corpus made from the standard
                       library by scripts/build_code_corpus.py, for decoder-only
                       models: inputs a code prefix (16 whole lines of a file),
                       targets its continuation (the next 16 lines), neither with
                       EOS; its own 4k-piece vocabulary (when its files are
                       present).
  code_docstring       the offline code -> docstring corpus made by
                       scripts/build_docstring_corpus.py (Table 2's summarization
                       task, offline): inputs a function's source without its
                       docstring, targets the docstring; ROUGE-1/2/L; its own
                       8k-piece vocabulary (when its files are present).

The paper's tasks use T5's vocabulary (`default_vocabulary()`, 32,100 ids, on
GCS) and need TFDS data prepared on a connected machine; `check_task_data`
(also run by every task's `get_dataset`) raises `TaskDataUnavailableError`
with the fix when that data is missing, instead of letting TFDS try to
download it. Local corpora become tasks through `register_tsv_task` (TSV
files) or `register_pairs_task` (in-memory pairs).

  import seqio, speculative.tasks
  task = seqio.get_mixture_or_task("mini_ende")
  ds = task.get_dataset({"inputs": 64, "targets": 64}, split="validation", shuffle=False)
  next(ds.as_numpy_iterator())["inputs_pretokenized"]
  # b'translate English to German: compilation of Java class failed, ...'

Splits use seqio's names: train, validation (valid.tsv / valid.jsonl), test.

`bleu` and `rouge` are plain functions of (targets, predictions) lists of
strings, usable with or without seqio; scores are on a 0-100 scale.
"""

import functools
import os
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from speculative import files
from speculative.data import code_corpus, docstring_corpus
from speculative.measure import metrics

with files.quiet_stderr():  # TensorFlow's C++ start-up lines (oneDNN, the CUDA probe)
    import seqio
    import tensorflow as tf

DEFAULT_SPM_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
DEFAULT_EXTRA_IDS = 100

EN_DE_PREFIX = "translate English to German: "
SUMMARIZE_PREFIX = "summarize: "

WMT_ENDE_TASK = "wmt_t2t_ende_v003"
WMT_ENDE_TFDS = "wmt_t2t_translate/de-en:1.0.0"
CNN_DM_TASK = "cnn_dailymail_v002"
CNN_DM_TFDS = "cnn_dailymail:3.4.0"
MINI_TASK = "mini_ende"
CODE_TASK = "stdlib_code"
DOCSTRING_TASK = "code_docstring"

# Bundled with the package (vocabulary + splits); the full build output of
# scripts/build_corpus.py lives in <repo>/data/corpus.
BUNDLED_MINI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mini")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS_DIR = os.path.join(_REPO, "data", "corpus")
SPM_MODEL = "spm.model"
# seqio split name -> file written by scripts/build_corpus.py.
MINI_SPLIT_FILES = {"train": "train.tsv", "validation": "valid.tsv", "test": "test.tsv"}
# The code corpus (scripts/build_code_corpus.py): bundled valid/test splits and vocabulary.
BUNDLED_CODE_DIR = code_corpus.CODE_DIR
CODE_SPLITS = ("train", "validation", "test")
BUNDLED_DOCSTRING_DIR = docstring_corpus.DOCSTRING_DIR

MetricSpec = Union[None, str, Sequence[Callable[..., Mapping[str, float]]]]


class TaskDataUnavailableError(RuntimeError):
    """A task's data is not on this machine (and will not be downloaded)."""


# ----------------------------------------------------------------------------
# Vocabularies and features.


@functools.lru_cache(maxsize=None)
def default_vocabulary() -> seqio.SentencePieceVocabulary:
    """T5's vocabulary (`t5.data.get_default_vocabulary()`): 32,000 pieces + 100 sentinels.

    Constructing it reads nothing; the model file is fetched from GCS on first
    use (encode/decode/vocab_size), which needs network access.
    """
    return seqio.SentencePieceVocabulary(DEFAULT_SPM_PATH, extra_ids=DEFAULT_EXTRA_IDS)


def mini_data_dir() -> str:
    """The bundled `speculative/data/mini/` if it has a vocabulary, else `data/corpus/`."""
    if os.path.exists(os.path.join(BUNDLED_MINI_DIR, SPM_MODEL)):
        return BUNDLED_MINI_DIR
    return CORPUS_DIR


@functools.lru_cache(maxsize=None)
def _spm_vocabulary(path: str) -> seqio.SentencePieceVocabulary:
    return seqio.SentencePieceVocabulary(path)


def _corpus_vocabulary(data_dir: str, build_script: str) -> seqio.SentencePieceVocabulary:
    """`data_dir/spm.model`, or TaskDataUnavailableError naming the script that builds it."""
    path = os.path.abspath(os.path.join(data_dir, SPM_MODEL))
    if not os.path.exists(path):
        raise TaskDataUnavailableError(
            f"no vocabulary at {path}; build it with "
            f"`python scripts/{build_script} --output_dir={os.path.dirname(path)}`")
    return _spm_vocabulary(path)


def mini_vocabulary(data_dir: Optional[str] = None) -> seqio.SentencePieceVocabulary:
    """The gettext corpus' SentencePiece vocabulary (pad 0, eos 1, unk 2, no sentinels)."""
    return _corpus_vocabulary(data_dir or mini_data_dir(), "build_corpus.py")


def code_vocabulary(data_dir: Optional[str] = None) -> seqio.SentencePieceVocabulary:
    """The code corpus' SentencePiece vocabulary (pad 0, eos 1, unk 2, "\\n" its own piece)."""
    return _corpus_vocabulary(data_dir or BUNDLED_CODE_DIR, "build_code_corpus.py")


def docstring_vocabulary(data_dir: Optional[str] = None) -> seqio.SentencePieceVocabulary:
    """The docstring corpus' SentencePiece vocabulary (pad 0, eos 1, unk 2, "\\n" a piece)."""
    return _corpus_vocabulary(data_dir or BUNDLED_DOCSTRING_DIR, "build_docstring_corpus.py")


def output_features(vocabulary: seqio.Vocabulary,
                    add_eos: bool = True) -> Dict[str, seqio.Feature]:
    """T5's DEFAULT_OUTPUT_FEATURES with `vocabulary`: inputs optional, both with EOS.

    `add_eos=False` for language modelling: a prompt is continued, not ended.
    """
    return {
        "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=add_eos, required=False),
        "targets": seqio.Feature(vocabulary=vocabulary, add_eos=add_eos),
    }


# ----------------------------------------------------------------------------
# Metrics (T5's definitions, in speculative.metrics: no seqio or TensorFlow needed).

bleu = metrics.bleu
rouge = metrics.rouge


def rouge_l(targets: Sequence[str], predictions: Sequence[str]) -> Dict[str, float]:
    """ROUGE-1/2/L (not Lsum: a docstring's lines are not sentences), as `code_docstring`
    reports it."""
    return metrics.rouge(targets, predictions, score_keys=("rouge1", "rouge2", "rougeL"))


_METRICS = {"bleu": bleu, "rouge": rouge, "rouge_l": rouge_l}


def _metric_fns(metric: MetricSpec):
    if metric is None:
        return []
    if isinstance(metric, str):
        if metric not in _METRICS:
            raise ValueError(f"metric={metric!r}; use one of {sorted(_METRICS)}, None or functions")
        return [_METRICS[metric]]
    return list(metric)


# ----------------------------------------------------------------------------
# Preprocessors (tf ops only; no dependency on the `t5` package).


@seqio.map_over_dataset
def prefix_pair(x, prefix: str, source_key: str, target_key: str):
    """{source_key: s, target_key: t, ...} -> {"inputs": prefix + s, "targets": t}."""
    return {
        "inputs": tf.strings.join([prefix, x[source_key]]),
        "targets": x[target_key],
    }


def check_tsv_files(pattern: Union[str, Sequence[str]]) -> None:
    """Refuses a `source<TAB>target` file with a line that is not exactly two fields, naming
    the file, the line number and the line (TensorFlow's parser would fail later, mid-run,
    with neither)."""
    for one in [pattern] if isinstance(pattern, str) else list(pattern):
        for path in sorted(tf.io.gfile.glob(one)):  # a missing file fails where it is read
            with tf.io.gfile.GFile(path, "r") as f:
                for number, line in enumerate(f, 1):
                    fields = line.rstrip("\r\n").count("\t") + 1
                    if fields != 2:
                        raise ValueError(
                            f"{path}:{number}: {fields} tab-separated fields in "
                            f"{line.rstrip()[:80]!r}; each line is source<TAB>target (one tab; "
                            "a tab inside a text must be replaced, e.g. by a space).")


class _TsvSource(seqio.TextLineDataSource):
    """A `TextLineDataSource` of `source<TAB>target` files whose lines are checked
    (`check_tsv_files`) before a split is first read; registering reads nothing."""

    def __init__(self, split_to_filepattern):
        super().__init__(split_to_filepattern)
        self._patterns, self._checked = dict(split_to_filepattern), set()

    def get_dataset(self, *args, **kwargs):
        split = kwargs.get("split", args[0] if args else None)
        if split in self._patterns and split not in self._checked:
            check_tsv_files(self._patterns[split])
            self._checked.add(split)
        return super().get_dataset(*args, **kwargs)


@seqio.map_over_dataset
def parse_tsv(line):
    """Parses `source<TAB>target` lines into {"source", "target"}; quotes are plain text."""
    source, target = tf.io.decode_csv(
        line, record_defaults=["", ""], field_delim="\t", use_quote_delim=False)
    return {"source": source, "target": target}


def _text_to_text_preprocessors(first: Sequence[Callable]) -> list:
    return list(first) + [
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        seqio.preprocessors.append_eos_after_trim,
    ]


# ----------------------------------------------------------------------------
# Data checks.


def _tfds_data_dir(source: seqio.TfdsDataSource, tfds_data_dir: Optional[str]) -> str:
    return (tfds_data_dir or source.tfds_dataset.data_dir or os.environ.get("TFDS_DATA_DIR")
            or os.path.join(os.path.expanduser("~"), "tensorflow_datasets"))


def _is_remote(path: str) -> bool:
    return "://" in path


def check_task_data(
    task: Union[str, seqio.Task],
    split: Optional[str] = None,
    tfds_data_dir: Optional[str] = None,
) -> None:
    """Raises TaskDataUnavailableError unless `task`'s data for `split` is on disk.

    TFDS tasks need `<data_dir>/<name>/<config>/<version>/dataset_info.json`
    (data_dir: `tfds_data_dir`, else seqio's override, else $TFDS_DATA_DIR, else
    ~/tensorflow_datasets); file tasks need every file of the split (all splits
    when `split` is None). Remote paths (gs://...) are not checked.
    """
    if isinstance(task, str):
        task = seqio.get_mixture_or_task(task)
    source = task.source
    if isinstance(source, seqio.TfdsDataSource):
        name = source.tfds_dataset.name
        data_dir = _tfds_data_dir(source, tfds_data_dir)
        if not name or _is_remote(data_dir):
            return
        dataset, _, version = name.partition(":")
        info = os.path.join(data_dir, *dataset.split("/"), version, "dataset_info.json")
        if os.path.exists(info):
            return
        raise TaskDataUnavailableError(
            f"Task '{task.name}' needs the TFDS dataset '{name}', which is not prepared in "
            f"'{data_dir}' (missing {info}). This machine cannot download it (no network "
            f"access to TFDS/GCS), and seqio would otherwise try and fail or hang. To provide "
            f"it: on a connected machine run `tfds build {name} --data_dir=DIR`, copy DIR "
            f"here and pass --tfds_data_dir=DIR (or set TFDS_DATA_DIR=DIR, or call "
            f"seqio.set_tfds_data_dir_override(DIR)). To work offline instead, use a local "
            f"corpus: speculative.tasks.register_tsv_task(name, {{'validation': "
            f"'valid.tsv'}}, vocabulary), or the bundled '{MINI_TASK}' task."
        )
    if isinstance(source, seqio.FileDataSource):
        splits = [split] if split is not None else list(source.splits)
        for s in splits:
            if s not in source.splits:
                raise TaskDataUnavailableError(
                    f"Task '{task.name}' has no split '{s}'; it has {sorted(source.splits)}")
            missing = [f for f in source.list_shards(s)
                       if not _is_remote(f) and not os.path.exists(f)]
            if missing or not source.list_shards(s):
                raise TaskDataUnavailableError(
                    f"Task '{task.name}', split '{s}': no data file at {missing or '(no match)'}. "
                    f"Build the corpus with `python scripts/build_corpus.py "
                    f"--output_dir=DIR` and register it with register_tsv_task / "
                    f"register_mini_task(DIR).")


class CheckedTask(seqio.Task):
    """A seqio.Task whose get_dataset first runs `check_task_data` (no silent download)."""

    def get_dataset(self, sequence_length=None, split="train", use_cached=False,
                    *args, **kwargs) -> tf.data.Dataset:
        if not use_cached:
            check_task_data(self, split)
        return super().get_dataset(sequence_length, split, use_cached, *args, **kwargs)


# ----------------------------------------------------------------------------
# Registration.


def _register(name: str, source, preprocessors, vocabulary, metric,
              add_eos: bool = True) -> seqio.Task:
    seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(
        name,
        source=source,
        output_features=output_features(vocabulary, add_eos),
        preprocessors=_text_to_text_preprocessors(preprocessors),
        metric_fns=_metric_fns(metric),
        task_cls=CheckedTask,
    )


# The paper's two Table 2 tasks as T5 registers them: (name, TFDS dataset, prefix, source and
# target keys, metric).
PAPER_TASKS = (
    (WMT_ENDE_TASK, WMT_ENDE_TFDS, EN_DE_PREFIX, "en", "de", "bleu"),
    (CNN_DM_TASK, CNN_DM_TFDS, SUMMARIZE_PREFIX, "article", "highlights", "rouge"),
)


def register_paper_tasks(tfds_data_dir: Optional[str] = None) -> None:
    """(Re-)registers wmt_t2t_ende_v003 and cnn_dailymail_v002 as in T5."""
    splits = ("train", "validation", "test")
    for name, tfds_name, prefix, source_key, target_key, metric in PAPER_TASKS:
        _register(
            name, seqio.TfdsDataSource(tfds_name, tfds_data_dir=tfds_data_dir, splits=splits),
            [functools.partial(prefix_pair, prefix=prefix, source_key=source_key,
                               target_key=target_key)],
            default_vocabulary(), metric)


def register_tsv_task(
    name: str,
    split_to_filepattern: Mapping[str, Union[str, Sequence[str]]],
    vocabulary: seqio.Vocabulary,
    prefix: str = EN_DE_PREFIX,
    metric: MetricSpec = "bleu",
) -> seqio.Task:
    """Registers a text-to-text task reading `source<TAB>target` lines.

    Args:
        name: task name; an existing task of that name is replaced.
        split_to_filepattern: e.g. {"train": "corpus/train.tsv", "validation": ...}. Every
          split's files are checked once, when the split is first read: a line without
          exactly one tab is refused with its file and line number (`check_tsv_files`).
        vocabulary: used for inputs and targets.
        prefix: prepended to each source to form `inputs`.
        metric: "bleu", "rouge", None or a list of metric functions.
    """
    patterns = {split: (p if isinstance(p, str) else list(p))
                for split, p in split_to_filepattern.items()}
    return _register(
        name, _TsvSource(patterns),
        [parse_tsv, functools.partial(prefix_pair, prefix=prefix, source_key="source",
                                      target_key="target")],
        vocabulary, metric)


def register_pairs_task(
    name: str,
    split_to_pairs: Mapping[str, Sequence[Tuple[str, str]]],
    vocabulary: seqio.Vocabulary,
    prefix: str = EN_DE_PREFIX,
    metric: MetricSpec = "bleu",
) -> seqio.Task:
    """Registers a task over in-memory (source, target) pairs (tests, notebooks)."""
    data = {split: ([s for s, _ in pairs], [t for _, t in pairs])
            for split, pairs in split_to_pairs.items()}

    def dataset_fn(split, shuffle_files, seed=None):
        del shuffle_files, seed  # one in-memory "file"
        sources, targets = data[split]
        return tf.data.Dataset.from_tensor_slices(
            {"source": tf.constant(sources, tf.string), "target": tf.constant(targets, tf.string)})

    source = seqio.FunctionDataSource(
        dataset_fn, splits=list(data),
        num_input_examples={split: len(pairs) for split, pairs in split_to_pairs.items()})
    return _register(
        name, source,
        [functools.partial(prefix_pair, prefix=prefix, source_key="source",
                           target_key="target")],
        vocabulary, metric)


def register_mini_task(data_dir: Optional[str] = None, name: str = MINI_TASK) -> seqio.Task:
    """Registers the gettext EnDe corpus in `data_dir` (default `mini_data_dir()`).

    Splits are those whose file exists: train (train.tsv), validation
    (valid.tsv), test (test.tsv); the vocabulary is `data_dir/spm.model`.
    """
    data_dir = os.path.abspath(data_dir or mini_data_dir())
    vocabulary = mini_vocabulary(data_dir)
    splits = {split: os.path.join(data_dir, f) for split, f in MINI_SPLIT_FILES.items()
              if os.path.exists(os.path.join(data_dir, f))}
    if not splits:
        raise TaskDataUnavailableError(
            f"no {sorted(MINI_SPLIT_FILES.values())} in {data_dir}; build them with "
            f"`python scripts/build_corpus.py --output_dir={data_dir}`")
    return register_tsv_task(name, splits, vocabulary, prefix=EN_DE_PREFIX, metric="bleu")


def register_code_task(data_dir: Optional[str] = None, name: str = CODE_TASK,
                       prompt_lines: int = 16, continuation_lines: int = 16) -> seqio.Task:
    """Registers the Python-code corpus in `data_dir` (default: the bundled one) as a
    prompt -> continuation task for decoder-only models.

    Each file of a split is cut into windows of whole lines (`code_corpus.line_windows`):
    inputs the first `prompt_lines` lines of a window, targets the next `continuation_lines`,
    so `inputs_pretokenized + targets_pretokenized` is a slice of the file, byte for byte, and
    no piece is cut between them (a prompt ends with "\\n", a piece of its own). No EOS is
    added to either: a prompt is continued, and a continuation ends at a line, not at the end of
    the file. (seqio tokenizes with TF Text's SentencePiece op: where a long run of spaces has
    several equally likely segmentations it may pick another one than the Python library
    picks for the same text in training; the text is the same.) Splits are those whose file
    exists (the repository bundles validation and test;
    `scripts/build_code_corpus.py --train_split_only` writes train); the vocabulary is
    `data_dir/spm.model`. No metric: continuations of code are compared by loss and
    acceptance, not by n-gram overlap.
    """
    data_dir = os.path.abspath(data_dir or BUNDLED_CODE_DIR)
    vocabulary = code_vocabulary(data_dir)
    splits = _corpus_splits(data_dir, "scripts/build_code_corpus.py")
    code_corpus.line_windows("", prompt_lines, continuation_lines)  # checks the line counts

    def dataset_fn(split, shuffle_files, seed=None):
        del shuffle_files, seed  # one file per split, read in order
        docs = code_corpus.read_documents(
            code_corpus.corpus_file(data_dir, code_corpus.split_file(split)))
        windows = list(code_corpus.iter_line_windows(docs, prompt_lines, continuation_lines))
        paths, prompts, continuations = zip(*windows) if windows else ((), (), ())
        return tf.data.Dataset.from_tensor_slices({
            "path": tf.constant(paths, tf.string), "prompt": tf.constant(prompts, tf.string),
            "continuation": tf.constant(continuations, tf.string)})

    return _register(
        name, seqio.FunctionDataSource(dataset_fn, splits=splits),
        [functools.partial(prefix_pair, prefix="", source_key="prompt",
                           target_key="continuation")],
        vocabulary, None, add_eos=False)


def _corpus_splits(data_dir: str, builder: str) -> List[str]:
    """The seqio splits of a JSONL corpus (code, docstrings) whose file is in `data_dir`, or
    TaskDataUnavailableError with the command (`builder`) that writes them."""
    splits = [s for s in CODE_SPLITS
              if os.path.exists(os.path.join(data_dir, code_corpus.split_file(s)))]
    if not splits:
        raise TaskDataUnavailableError(
            f"no train/valid/test.jsonl in {data_dir}; build them with "
            f"`python {builder} --output_dir={data_dir}`")
    return splits


def register_docstring_task(data_dir: Optional[str] = None,
                            name: str = DOCSTRING_TASK) -> seqio.Task:
    """Registers the code -> docstring corpus in `data_dir` (default: the bundled one).

    inputs: a function's source (decorators kept, docstring removed, dedented), no prefix;
    targets: its docstring (`inspect.cleandoc`-ed, whole paragraphs); both with EOS; metric
    ROUGE-1/2/L (`rouge_l`). Splits are those whose file exists (the repository bundles
    validation and test; `scripts/build_docstring_corpus.py --train_split_only` writes
    train); the vocabulary is `data_dir/spm.model`. Extra features: `path` and `name`.
    """
    data_dir = os.path.abspath(data_dir or BUNDLED_DOCSTRING_DIR)
    vocabulary = docstring_vocabulary(data_dir)
    splits = _corpus_splits(data_dir, docstring_corpus.BUILDER)

    def dataset_fn(split, shuffle_files, seed=None):
        del shuffle_files, seed  # one file per split, read in order
        examples = docstring_corpus.read_split(data_dir, split)
        return tf.data.Dataset.from_tensor_slices({
            key: tf.constant([getattr(e, key) for e in examples], tf.string)
            for key in docstring_corpus.Example._fields})

    return _register(
        name, seqio.FunctionDataSource(dataset_fn, splits=splits),
        [functools.partial(prefix_pair, prefix="", source_key="code",
                           target_key="docstring")],
        vocabulary, "rouge_l")


register_paper_tasks()
if os.path.exists(os.path.join(mini_data_dir(), SPM_MODEL)):
    register_mini_task()
if os.path.exists(os.path.join(BUNDLED_CODE_DIR, SPM_MODEL)):
    register_code_task()
if os.path.exists(os.path.join(BUNDLED_DOCSTRING_DIR, SPM_MODEL)):
    register_docstring_task()
