"""Stage 1 of inference (`runs/infer.py`): read the inputs, as text or the task's token ids.

    task = get_task(settings)                  # the seqio task: vocabulary, prefix, metric
    sources = read_inputs(settings, task)      # [Source]: this shard's examples, in order

The inputs come from the task's split (`settings.split`, read in order, untrimmed) or, with
INPUT_FILE, from a file of the user's (`read_input_file`), which is read and checked line by
line before any model loads:

  text     one input a line (no reference)
  .tsv     input<TAB>reference, the reference optional (a reference column adds the metric)
  .jsonl   {"input": ..., "target": ...} a line ("reference" for "target"; both optional)

A malformed line raises a ValueError naming the file, the line number and the fix. With
NUM_SHARDS > 1 this process keeps examples i with `i % NUM_SHARDS == SHARD_ID` (seqio's
`ShardInfo`, as T5X's infer splits a dataset), numbered by their place in the whole input.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import List, Optional

import numpy as np

from speculative.data import tasks
from speculative.runs.infer_settings import InferSettings


@dataclasses.dataclass(frozen=True)
class Source:
    """One input before encoding: its texts and, from a task, its token ids.

    Attributes:
      index: the example's place in the whole input (all shards).
      inputs_text: the input as written (a task's inputs_pretokenized: its prefix included;
        a file's line: without the task prefix, which encoding adds).
      targets_text: the reference ('' where there is none).
      input_ids, target_ids: the task's token ids (None for a file's line: `infer_encode`
        encodes its texts).
      line: the file's line number (None for a task's example).
    """

    index: int
    inputs_text: str
    targets_text: str
    input_ids: Optional[np.ndarray] = None
    target_ids: Optional[np.ndarray] = None
    line: Optional[int] = None


def get_task(settings: InferSettings):
    """The seqio task, after checking its data is here (TaskDataUnavailableError otherwise; with
    INPUT_FILE only its vocabulary, prefix and metric are used, so no data is needed)."""
    import seqio  # pylint: disable=g-import-not-at-top

    if settings.tfds_data_dir:
        seqio.set_tfds_data_dir_override(settings.tfds_data_dir)
    try:
        task = seqio.get_mixture_or_task(settings.mixture_or_task_name)
    except ValueError as e:
        raise ValueError(
            f"infer: unknown MIXTURE_OR_TASK_NAME={settings.mixture_or_task_name!r}; "
            "use a registered task (wmt_t2t_ende_v003, cnn_dailymail_v002, mini_ende, or one "
            "added with tasks.register_tsv_task).") from e
    if not isinstance(task, seqio.Task):
        raise ValueError(
            f"infer reads one task; {settings.mixture_or_task_name!r} is a mixture of "
            f"{[t.name for t in task.tasks]}: pass one of them as MIXTURE_OR_TASK_NAME.")
    if settings.input_file is None:
        tasks.check_task_data(task, settings.split, settings.tfds_data_dir)
    return task


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _bad(path: str, number: int, problem: str, fix: str) -> ValueError:
    return ValueError(f"INPUT_FILE={path!r} line {number}: {problem}; {fix}")


def _parse_line(path: str, kind: str, number: int, line: str):
    """`(input, reference or None)` of one line of an input file of `kind`."""
    if kind == "jsonl":
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(path, number, f"not JSON ({e.msg})",
                       'write one object a line, e.g. {"input": "...", "target": "..."}') from None
        if not isinstance(row, dict) or not isinstance(row.get("input"), str):
            raise _bad(path, number, 'no "input" string',
                       'give each line an "input" key, e.g. {"input": "..."}')
        if "target" in row and "reference" in row:
            raise _bad(path, number, 'both "target" and "reference"', "keep one of them")
        reference = row.get("target", row.get("reference"))
        if reference is not None and not isinstance(reference, str):
            raise _bad(path, number, f"the reference {reference!r} is not a string",
                       "give it as text")
        return row["input"], reference
    if kind == "tsv":
        columns = line.split("\t")
        if len(columns) > 2:
            raise _bad(path, number, f"{len(columns)} tab-separated columns",
                       "give input<TAB>reference (a tab inside a text: use a .jsonl file)")
        return columns[0], columns[1] if len(columns) == 2 else None
    return line, None


def read_input_file(path: str) -> List[Source]:
    """Every line of `path` (kind by extension: .jsonl, .tsv, else text) as a `Source`; raises
    on the first malformed line with its number. Either every line has a reference or none."""
    kind = {".jsonl": "jsonl", ".tsv": "tsv"}.get(os.path.splitext(path)[1].lower(), "text")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"INPUT_FILE={path!r} is not UTF-8 text ({e.reason} at byte "
                         f"{e.start}); save it as UTF-8.") from None
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    sources, with_reference = [], None
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if not line.strip():
            raise _bad(path, number, "an empty line", "remove it (each line is one input)")
        text, reference = _parse_line(path, kind, number, line)
        if not text.strip():
            raise _bad(path, number, "an empty input", "give each line an input text")
        if with_reference is None:
            with_reference = reference is not None
        elif with_reference != (reference is not None):
            raise _bad(path, number, "a reference " + ("missing" if with_reference else "given")
                       + f" where line 1 {'has' if with_reference else 'has none'}",
                       "give every line a reference (the metric needs them all) or none")
        sources.append(Source(index=number - 1, inputs_text=text,
                              targets_text=reference or "", line=number))
    if not sources:
        raise ValueError(f"INPUT_FILE={path!r} holds no inputs; write one input a line.")
    return sources


def read_task(settings: InferSettings, task) -> List[Source]:
    """The split's examples in order (no shuffling), untrimmed, with their token ids."""
    ds = task.get_dataset(None, split=settings.split, shuffle=False, num_epochs=1)
    if settings.num_examples is not None:
        ds = ds.take(settings.num_examples)
    sources = []
    for i, ex in enumerate(ds.as_numpy_iterator()):
        if "inputs" not in ex:
            raise ValueError(f"Task {task.name!r} has no 'inputs' feature; infer decodes "
                             "inputs -> targets tasks (encoder input, or decoder-only prompt).")
        targets = ex.get("targets")
        sources.append(Source(
            index=i, inputs_text=_text(ex.get("inputs_pretokenized", b"")),
            targets_text=_text(ex.get("targets_pretokenized", b"")),
            input_ids=np.asarray(ex["inputs"], np.int32),
            target_ids=None if targets is None else np.asarray(targets, np.int32)))
    if not sources:
        raise ValueError(f"Task {task.name!r}, split {settings.split!r} has no examples.")
    return sources


def read_inputs(settings: InferSettings, task) -> List[Source]:
    """This shard's sources: INPUT_FILE's lines (the first NUM_EXAMPLES) or the task's split."""
    if settings.input_file is not None:
        sources = read_input_file(settings.input_file)[:settings.num_examples]
    else:
        sources = read_task(settings, task)
    shard = sources[settings.shard_id::settings.num_shards]
    if not shard:
        raise ValueError(f"SHARD_ID={settings.shard_id} of NUM_SHARDS={settings.num_shards} "
                         f"gets none of the {len(sources)} inputs; use fewer shards.")
    if settings.infer_mode == "score" and not all(s.targets_text or s.target_ids is not None
                                                  for s in shard):
        raise ValueError("mode 'score' scores given targets, and the inputs have none: give "
                         "INPUT_FILE a reference column (.tsv) or a \"target\" key (.jsonl).")
    return shard
