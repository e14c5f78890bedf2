"""Beam search walltime: the host-driven search, the jitted cached one, and the jitted
speculative beam search, on a bundled EN->DE pair with T5X's eval settings (length penalty 0.6).

For each beam width, the three searches decode the same test sentences at batch 1, each timed
over all sentences in interleaved rounds after a warm-up on one sentence (compilation). Target
forwards come from the searches' results; BLEU (sacrebleu) of the best beams against the
references. The jitted search is checked against the host-driven one on every sentence (same
sequences), so a speed number never comes from a different output.

Then, untimed, the jitted plain and speculative searches decode the whole test split in
batches (`split_batch` rows; sources longer than the input length in their own, longer
batches, so none is skipped): its BLEU, and whether the two searches return the same beams
with the same scores on every sentence.

    python scripts/beam_benchmark.py --target=large_target --output_dir=results/large/beam
"""

from __future__ import annotations

import time
from typing import Dict, Sequence

import numpy as np

from speculative import files
from speculative.beam import reference as beam_reference
from speculative.beam import search as beam_lib
from speculative.data import bundles
from speculative.decode import validation
from speculative.experiments import record
from speculative.measure import costs as costs_lib
from speculative.measure import host
from speculative.runs import mini
from speculative.runs.infer import MIN_BEAM_SPEEDUP

MAX_LEN = 48


def run(output_dir: str, target_name: str = mini.LARGE_TARGET, draft_name: str = "",
        num_sentences: int = 16, beam_sizes: Sequence[int] = (1, 2, 4),
        num_calibration: int = 8, repeats: int = 1, length_penalty: float = 0.6,
        split_sentences: int = 0, split_batch: int = 16, overwrite: bool = False) -> Dict:
    """Times the three searches at every beam width (the speculative one with the proposal
    `costs.choose_beam_proposal` picks on `num_calibration` validation sentences), then decodes
    the first `split_sentences` test sentences (0 = the whole split) with the jitted plain and
    speculative searches (`decode_test_split`); writes `beam.json` and `beam.md`."""
    import sacrebleu  # pylint: disable=g-import-not-at-top

    validation.positive_int(num_sentences, "num_sentences", "test sentences decoded")
    validation.positive_int(repeats, "repeats", "timed rounds")
    validation.positive_int(split_batch, "split_batch", "rows per batch of the test-split pass")
    if isinstance(split_sentences, bool) or not isinstance(split_sentences, int) or \
            split_sentences < 0:
        raise ValueError(f"split_sentences={split_sentences!r}: give the number of test "
                         "sentences of the test-split pass, or 0 for the whole split.")
    validation.positive_int(num_calibration, "num_calibration", "sentences choosing a proposal")
    for w in beam_sizes:
        validation.positive_int(w, "beam_sizes", "beams kept per input")
    files.check_report(output_dir, "beam", overwrite)
    draft_name = draft_name or mini.best_t5_draft(target_name)
    target, draft = mini.load(target_name), mini.load(draft_name)
    vocab = mini.Vocabulary()
    pairs = mini.test_pairs(num_sentences)
    inputs = [vocab.encode_sources([src], bundles.INPUT_LENGTH) for src, _ in pairs]
    references = [ref for _, ref in pairs]
    load = host.LoadAverage()
    start = time.time()
    rows = []
    calibration = mini.source_batches(num_calibration, 1, bundles.INPUT_LENGTH,
                                      split="valid")
    for w in beam_sizes:
        kw = dict(beam_size=w, max_decode_len=MAX_LEN, length_penalty=length_penalty)
        # The proposal (draft_beam, gamma, draft_branch) is chosen on validation sentences.
        choice = costs_lib.choose_beam_proposal(target, draft, calibration, repeats=2, **kw)
        u, g, b = choice.best.draft_beam, choice.best.gamma, choice.best.draft_branch
        print(f"beam {w}: chose draft_beam {u}, gamma {g}, draft_branch {b} (calibration speedup "
              f"{choice.best.speedup:.2f}x)", flush=True)
        searches = {
            "host": lambda x: beam_reference.host_beam_search(target, x, **kw),
            "jitted": lambda x: beam_lib.beam_search(target, x, **kw),
            "speculative": lambda x, u=u, g=g, b=b: beam_lib.speculative_beam_search(
                target, draft, x, draft_beam=u, gamma=g, draft_branch=b, **kw),
        }
        for search in searches.values():  # compile on one sentence first
            search(inputs[0])
        programs = {name: (lambda f=f: [f(x) for x in inputs]) for name, f in searches.items()}
        _, times, outputs = costs_lib.interleaved(programs, repeats, progress=f"beam {w}")
        row = {"beam_size": w, "proposal": choice.to_json()}
        # What a round's one target forward costs against one plain step (w rows, 1 token).
        one = np.repeat(inputs[0], w, axis=0)
        paths = np.repeat(inputs[0], w * b + u, axis=0)
        step = costs_lib.measure_costs(target, draft, one, [g], max_decode_len=MAX_LEN,
                                       num_steps=8, repeats=5, seed=0).target_step_s
        verify = costs_lib.measure_costs(target, draft, paths, [g], max_decode_len=MAX_LEN,
                                         num_steps=8, repeats=5, seed=0).target_verify_s[g]
        row["round_verify_cost"] = verify / step
        best = {}
        for name, results in outputs.items():
            best[name] = np.concatenate([r.sequences[:, 0] for r in results])
            texts = [vocab.decode(seq) for seq in best[name]]
            row[name] = {
                "seconds_median": float(np.median(times[name])),
                "target_calls": int(sum(r.target_calls for r in results)),
                "bleu": sacrebleu.corpus_bleu(texts, [references]).score}
        row["same_sequences"] = {name: bool(np.array_equal(best[name], best["host"]))
                                 for name in ("jitted", "speculative")}
        row["jitted_over_host"] = row["host"]["seconds_median"] / row["jitted"]["seconds_median"]
        row["speculative_over_jitted"] = (row["jitted"]["seconds_median"]
                                          / row["speculative"]["seconds_median"])
        row["test_split"] = decode_test_split(target, draft, vocab, split_sentences,
                                              split_batch, proposal=(u, g, b), **kw)
        rows.append(row)
        print(_line(row), flush=True)
    result = {"target": target_name, "draft": draft_name, "sentences": num_sentences,
              "calibration_sentences": num_calibration, "length_penalty": length_penalty,
              "split_batch": split_batch,
              "repeats": repeats,
              "max_decode_len": MAX_LEN, "rows": rows, "seconds": round(time.time() - start, 1),
              "load_average_1m": load.record(),
              "environment": host.environment()}
    record.publish("beam", f"{target_name}/{draft_name}", output_dir, "beam", result, markdown,
                   load=result["load_average_1m"])
    return result


def decode_test_split(target, draft, vocab, num: int, batch_size: int, *, proposal,
                      beam_size: int, max_decode_len: int, length_penalty: float) -> Dict:
    """The jitted plain and speculative searches (`proposal = (draft_beam, gamma,
    draft_branch)`) over the first `num` test sentences (0 = all), `batch_size` rows per call.
    Sources that do not fit `bundles.INPUT_LENGTH` tokens go in batches of their own, padded
    to the next multiple of 16. Returns the sentence count, the plain search's BLEU (best beam
    against the references), whether every beam of every sentence is the same in both searches,
    the largest score difference, and both searches' target calls."""
    import sacrebleu  # pylint: disable=g-import-not-at-top

    pairs = mini.test_pairs(num or None)
    sources = [src for src, _ in pairs]
    lengths = [len(ids) for ids in vocab.encode_inputs(sources)]
    short = [i for i, n in enumerate(lengths) if n <= bundles.INPUT_LENGTH]
    long = [i for i, n in enumerate(lengths) if n > bundles.INPUT_LENGTH]
    long_len = -(-max((lengths[i] for i in long), default=16) // 16) * 16
    u, g, b = proposal
    kw = dict(beam_size=beam_size, max_decode_len=max_decode_len, length_penalty=length_penalty)
    best = [None] * len(pairs)
    same, score_diff, calls = True, 0.0, {"jitted": 0, "speculative": 0}
    for index, length in ((short, bundles.INPUT_LENGTH), (long, long_len)):
        for start in range(0, len(index), batch_size):
            rows = index[start:start + batch_size]
            x = vocab.encode_sources([sources[i] for i in rows], length)
            plain = beam_lib.beam_search(target, x, **kw)
            spec = beam_lib.speculative_beam_search(target, draft, x, draft_beam=u, gamma=g,
                                                    draft_branch=b, **kw)
            same &= bool(np.array_equal(plain.sequences, spec.sequences))
            score_diff = max(score_diff, float(np.max(np.abs(plain.scores - spec.scores))))
            calls["jitted"] += plain.target_calls
            calls["speculative"] += spec.target_calls
            for i, seq in zip(rows, plain.sequences[:, 0]):
                best[i] = vocab.decode(seq)
    bleu = sacrebleu.corpus_bleu(best, [[ref for _, ref in pairs]]).score
    return {"sentences": len(pairs), "longer_than_input": len(long), "bleu": bleu,
            "same_beams": same, "max_score_diff": score_diff, "target_calls": calls}


def _line(row: Dict) -> str:
    return (f"beam {row['beam_size']}: host {row['host']['seconds_median']:.2f} s, jitted "
            f"{row['jitted']['seconds_median']:.2f} s ({row['jitted_over_host']:.1f}x faster), "
            f"speculative {row['speculative']['seconds_median']:.2f} s "
            f"({row['speculative_over_jitted']:.2f}x the jitted; round verify cost "
            f"{row['round_verify_cost']:.2f} steps); target calls "
            f"{row['host']['target_calls']} / {row['jitted']['target_calls']} / "
            f"{row['speculative']['target_calls']}; same sequences {row['same_sequences']}; "
            f"test split: {row['test_split']['sentences']} sentences, BLEU "
            f"{row['test_split']['bleu']:.1f}, same beams {row['test_split']['same_beams']} "
            f"(scores within {row['test_split']['max_score_diff']:.1e})")


def markdown(result: Dict) -> str:
    head = ["beam", "host-driven s", "jitted s", "jitted speedup", "speculative s",
            "speculative / jitted", "proposal (draft beam, γ, branch)", "chosen at",
            "infer.py runs", "steps per round",
            "round verify cost (steps)", "target calls host / jitted / speculative", "BLEU",
            "same sequences"]
    rows = []
    for r in result["rows"]:
        p = r["proposal"]
        rows.append([
            str(r["beam_size"]), f"{r['host']['seconds_median']:.2f}",
            f"{r['jitted']['seconds_median']:.2f}", f"{r['jitted_over_host']:.1f}x",
            f"{r['speculative']['seconds_median']:.2f}", f"{r['speculative_over_jitted']:.2f}x",
            f"{p['draft_beam']}, {p['gamma']}, {p['draft_branch']}",
            f"{p['speedup']:.2f}x",
            "speculative" if p["speedup"] >= MIN_BEAM_SPEEDUP else "plain",
            f"{p['replayed_per_round']:.2f}",
            f"{r['round_verify_cost']:.2f}",
            f"{r['host']['target_calls']} / {r['jitted']['target_calls']} / "
            f"{r['speculative']['target_calls']}", f"{r['jitted']['bleu']:.1f}",
            "yes" if all(r["same_sequences"].values()) else str(r["same_sequences"])])
    env = result["environment"]["cpu"]
    load = result["load_average_1m"]
    return (f"# Beam search walltime ({result['target']}, draft {result['draft']}, batch 1)\n\n"
            "`python scripts/beam_benchmark.py` (speculative/experiments/beam.py). "
            f"{result['sentences']} test sentences, length penalty {result['length_penalty']}, "
            f"max_decode_len {result['max_decode_len']}; each search timed over all sentences "
            f"in {result['repeats']} interleaved round(s) after a warm-up. The speculative "
            "search runs the proposal `costs.choose_beam_proposal` found fastest on "
            f"{result['calibration_sentences']} validation sentences (draft beam 0 = each "
            "alive beam's greedy paths only; branch b = its b best first tokens, each "
            "continued greedily; 'chosen at' is its speedup there, and infer.py runs "
            f"it where that is at least {MIN_BEAM_SPEEDUP}x); steps per round are the target's "
            "beam steps "
            "replayed per round there; the round verify cost is the target forward of "
            "(w x branch + draft beam) paths of γ + 1 tokens over one plain step of w rows. "
            f"Host: {env.get('model')}, load average {load['before']:.2f} "
            f"before, {load['after']:.2f} after.\n\n" + files.markdown_table(head, rows) + "\n"
            + _split_markdown(result))


def _split_markdown(result: Dict) -> str:
    """The test-split pass (untimed): BLEU and plain = speculative on every sentence."""
    first = result["rows"][0]["test_split"]
    head = ["beam", "BLEU", "same beams, plain and speculative", "largest score difference",
            "target calls plain / speculative"]
    rows = [[r["beam_size"], f"{r['test_split']['bleu']:.1f}",
             "yes, every sentence" if r["test_split"]["same_beams"] else "**no**",
             f"{r['test_split']['max_score_diff']:.1e}",
             f"{r['test_split']['target_calls']['jitted']} / "
             f"{r['test_split']['target_calls']['speculative']}"] for r in result["rows"]]
    return (f"Test split ({first['sentences']} sentences, {first['longer_than_input']} of them "
            f"longer than {bundles.INPUT_LENGTH} tokens in batches of their own; batches of "
            f"{result['split_batch']}; untimed): the jitted plain search and the speculative "
            "one with the proposal above, every beam and score compared.\n\n"
            + files.markdown_table(head, rows))
