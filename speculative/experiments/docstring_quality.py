"""How good the bundled docstring target is: ROUGE-1/2/L of its greedy docstrings on the test
split, beside three trivial baselines that any model must beat.

    name        the function's name split into words ("read_json" -> "read json",
                "HTTPServer.serveForever" -> "http server serve forever")
    comment     the first comment line of its source ('' where it has none)
    frequent    the most common docstring of the training split, for every function

Scores are mean F-measures x100 over the test functions (`metrics.rouge`, no stemmer, as the
`code_docstring` task scores). The target's outputs are greedy (temperature 0), which is also
what every speculative T = 0 run returns. The report (`quality.json` / `.md`, under
`results/docstrings/`) records the margin of the target over the best baseline in ROUGE-L.

    python scripts/docstring_quality.py [--num=N] [--output_dir=DIR] [--overwrite]
"""

from __future__ import annotations

import collections
import io
import re
import tokenize
from typing import Dict, List, Optional, Sequence

from speculative import files
from speculative.data import bundles, docstring_corpus
from speculative.experiments import record
from speculative.measure import metrics

BASELINES = ("name", "comment", "frequent")
SCORES = ("rouge1", "rouge2", "rougeL")


def name_words(name: str) -> str:
    """'Class.method_name' / 'camelCase' -> lower-case words ('class method name')."""
    words = []
    for part in re.split(r"[._]+", name):
        words += re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", part)
    return " ".join(w.lower() for w in words)


def first_comment(code: str) -> str:
    """The text of the first `#` comment in `code` ('' when there is none or it does not
    tokenize)."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                return tok.string.lstrip("#").strip()
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return ""


def most_common_docstring(docstrings: Sequence[str]) -> str:
    """The most frequent string (the first seen among equals)."""
    counts = collections.Counter(docstrings)
    return max(counts, key=lambda d: (counts[d], -docstrings.index(d)))


def baselines(examples: Sequence[docstring_corpus.Example],
              frequent: str) -> Dict[str, List[str]]:
    return {"name": [name_words(e.name) for e in examples],
            "comment": [first_comment(e.code) for e in examples],
            "frequent": [frequent] * len(examples)}


def _score(refs: Sequence[str], hyps: Sequence[str]) -> Dict[str, float]:
    return {k: round(v, 2) for k, v in metrics.rouge(refs, hyps, score_keys=SCORES).items()}


def target_docstrings(num: Optional[int], batch_size: int = 128,
                      target: str = bundles.DOCSTRING_TARGET) -> List[str]:
    """The bundled target's greedy docstrings for the first `num` test functions (None: all),
    in file order (the bundle's inputs, decoded in float32)."""
    # pylint: disable=g-import-not-at-top
    import jax
    import numpy as np
    from tqdm import tqdm

    from speculative import decoding
    from speculative.decode import kernel as sampling

    bundle = bundles.bundle(target)
    model = bundle.load(target)
    tokenizer = bundles.docstring_tokenizer()
    out = []
    for batch in tqdm(bundle.batches(num, batch_size), desc="greedy docstrings", unit="batch"):
        result = decoding.autoregressive_decode(
            model, batch, rng=jax.random.PRNGKey(0), sampling=sampling.SamplingConfig(0.0),
            max_decode_len=bundle.max_decode_len)
        out += [tokenizer.decode(row) for row in np.asarray(result.tokens)]
    return out


def run(num: Optional[int] = None, output_dir: str = "results/docstrings",
        overwrite: bool = False, data_dir: str = docstring_corpus.DOCSTRING_DIR) -> Dict:
    """Scores the target and the baselines on the first `num` test functions (None: all) and
    writes `quality.json` / `.md` to `output_dir` (refused before any work if there and not
    `overwrite`). Needs the training split for 'frequent' (scripts/build_docstring_corpus.py
    --train_split_only)."""
    files.check_report(output_dir, "quality", overwrite)
    train = [e.docstring for e in docstring_corpus.read_split(data_dir, "train")]
    examples = docstring_corpus.read_split(data_dir, "test")[:num]
    refs = [e.docstring for e in examples]
    frequent = most_common_docstring(train)
    hyps = {"target": target_docstrings(num), **baselines(examples, frequent)}
    scores = {name: _score(refs, h) for name, h in hyps.items()}
    best = max(BASELINES, key=lambda b: scores[b]["rougeL"])
    result = {
        "target": bundles.DOCSTRING_TARGET, "split": "test", "examples": len(examples),
        "scores": scores, "best_baseline": best,
        "margin_rougeL": round(scores["target"]["rougeL"] - scores[best]["rougeL"], 2),
        "frequent_docstring": frequent,
        "samples": [{"name": e.name, "reference": e.docstring, "target": h}
                    for e, h in list(zip(examples, hyps["target"]))[:5]],
    }
    record.publish("docstring_quality", bundles.DOCSTRING_TARGET, output_dir, "quality",
                   result, markdown)
    return result


def markdown(result: Dict) -> str:
    rows = [[name, *(f"{result['scores'][name][k]:.2f}" for k in SCORES)]
            for name in ("target",) + BASELINES]
    prov = result["provenance"]
    return (f"# {result['target']} on the code -> docstring test split\n\n"
            f"{result['examples']} functions; ROUGE F x100 (no stemmer). The target's docstrings "
            "are greedy; the baselines are the function's name in words, its first comment "
            "line and the most common training docstring "
            f"({result['frequent_docstring']!r}).\n\n"
            + files.markdown_table(["model", "ROUGE-1", "ROUGE-2", "ROUGE-L"], rows)
            + f"\n\nThe target beats the best baseline ({result['best_baseline']}) by "
            f"{result['margin_rougeL']:.2f} ROUGE-L.\n\n"
            f"Command: `{prov['command']}` (commit {prov['commit']}).\n")
