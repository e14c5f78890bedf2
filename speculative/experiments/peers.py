"""Our decoders against Hugging Face transformers' on the same T5 models, inputs and process.

For each (target, draft) pair, `run`

  1. converts both models with the project's converter (`checkpoints.hf.save_hf_t5`: `to_hf_t5` +
     `hf_config_dict`) into a temporary directory and loads them as transformers'
     `T5ForConditionalGeneration` (PyTorch, float32);
  2. checks logits parity: our `Transformer` and theirs, teacher-forced on the same encoder inputs
     and on the target's greedy output, must agree to `parity_atol` (max abs diff), else
     `ParityError` before any timing;
  3. times, at each temperature, in one `costs.interleaved` run (the project's one timing
     engine: first calls apart, then rounds in a rotated order, medians):
       ours          `autoregressive_decode`, `speculative_decode` (gamma drafts per round)
       transformers  `generate`; assisted generation (`assistant_model=`) with the assistant's
                     default settings, and with a constant `gamma` (no confidence stop)
     every program decoding the same sentences one at a time (batch 1), with the same
     `max_new_tokens` (= our `max_decode_len`), EOS 1, pad 0 and decoder start 0;
  4. checks that every greedy method emits the same tokens, per sentence.

Tokens per target call are ours from `DecodeStats`, theirs from a forward hook on their target
(one call per `generate` step or assisted round; the encoder runs outside it).

Measured pitfalls, each handled where it bites (see docs/peers.md):

  * libgomp's threads busy-wait: with another process busy, transformers ran ~25x slower.
    `OMP_WAIT_POLICY=PASSIVE` is set before torch is imported (`import_hf`).
  * transformers 5.x reads `num_assistant_tokens`, `num_assistant_tokens_schedule` and
    `assistant_confidence_threshold` from the *assistant's* `generation_config` and ignores them
    as `generate()` arguments; with the "heuristic" schedule it also writes the last draft
    length back there, so each call starts from a fresh copy of the setting it times. Its
    defaults (5.24: 20 drafts, "constant", confidence stop 0.4) are recorded
    (`assistant_settings`).
  * `generate` of a T5 whose encoder has fewer layers than its decoder (large_target) fails
    with an IndexError in the KV cache unless given an `EncoderDecoderCache(DynamicCache(),
    DynamicCache())`, fresh per call. An assistant's cache is built inside transformers, so
    such a draft is refused.

JSON schema (`peers.json`; NaN and infinities are written as null):

    schema        "speculative.peers/1"
    config        pairs [[target, draft]], num_sentences, repeats, gamma, temperatures,
                  max_decode_len, input_length, parity_atol, seed
    environment   host.environment() + torch_version, transformers_version,
                  torch_num_threads, omp_wait_policy, load_average_1m {before, after}
    pairs         one per pair:
      target, draft, sentences
      parity      {target, draft: max abs logit diff, max_abs_logit, atol}
      assistant_default  the settings transformers' assisted generation used by default:
                  num_assistant_tokens, num_assistant_tokens_schedule,
                  assistant_confidence_threshold, adaptive_threshold (`assistant_settings`)
      methods     one per (implementation, method, temperature): timing
                  (`measure.Timing.to_json`: costs.spread, first_call_s, compile_s), tokens
                  (per repeat), tokens_per_s, target_calls, tokens_per_target_call
      comparisons one per (ours, theirs) at each temperature: both tokens/s and tokens per target
                  call, ours_over_theirs (tokens/s ratio)
      greedy      {sentences, identical (all greedy methods equal), methods, identical_to
                  {method: sentences equal to ours autoregressive}}
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import jax
import numpy as np

from speculative import files, loading
from speculative.checkpoints import hf as hf_checkpoints
from speculative.checkpoints import t5x as checkpoints
from speculative.data import bundles
from speculative.decode import contract, validation
from speculative.decode import loops as decoding
from speculative.decode import stats as stats_lib
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import record
from speculative.measure import costs as costs_lib
from speculative.measure import host
from speculative.measure import timing as measure
from speculative.models import t5
from speculative.runs import mini

SCHEMA = "speculative.peers/1"
RESULTS_FILE = "peers.json"
TABLE_FILE = "peers.md"
INSTALL_HINT = 'pip install -e ".[test]"'
OURS, THEIRS = "ours", "transformers"
AUTOREGRESSIVE, SPECULATIVE = "autoregressive", "speculative"
GENERATE, ASSISTED_DEFAULT = "generate", "assisted (default)"


class MissingDependency(ImportError):
    """torch or transformers is not installed (the message names the install command)."""


class ParityError(ValueError):
    """Our logits and transformers' differ by more than the tolerance on the same weights."""


@dataclasses.dataclass(frozen=True)
class Given:
    """A T5 model that is not bundled: `config` with weights from `checkpoint` (any path
    `checkpoints.load_params` reads), or random weights seeded `seed` when None."""

    name: str
    config: t5.T5Config
    checkpoint: Optional[str] = None
    seed: int = 0


Spec = Union[str, Given]  # a bundled model name, or a given model


def assisted_fixed(gamma: int) -> str:
    return f"assisted (gamma={gamma})"


def import_hf():
    """(torch, transformers), or `MissingDependency` naming the install command."""
    # libgomp's worker threads busy-wait for work by default; with another process busy on the
    # machine, transformers ran ~25x slower here. Passive waiting must be set before torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch  # pylint: disable=import-outside-toplevel
        import transformers  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise MissingDependency(f"Comparing with transformers needs torch and transformers "
                                f"({e}); install them with: {INSTALL_HINT}") from e
    return torch, transformers


def _refuse_other_bundles(name: str) -> None:
    """A model of another bundle (the decoder-only code pair) is named as such, not as
    missing: the comparison runs EN->DE encoder-decoder T5 models on the EN->DE test
    sentences."""
    found = bundles.bundled(name)
    if found is not None and found.bundle is not bundles.ENDE:
        raise ValueError(
            f"{name!r} is a model of the {found.bundle.name!r} bundle; compare_peers compares "
            f"encoder-decoder T5 models on the EN->DE test sentences: use {mini.targets()} or "
            f"their drafts {[d for t in mini.targets() for d in mini.t5_drafts(t)]}.")


def config_for(spec: str, checkpoint: str) -> t5.T5Config:
    """The `T5Config` of a given checkpoint: a preset name (`t5.PRESETS`), a bundled model's
    name (its card config) or an HF `config.json` (checked against the checkpoint)."""
    if spec in t5.PRESETS:
        return t5.preset(spec)
    if spec.endswith(".json"):
        with open(spec) as f:
            return hf_checkpoints.config_from_hf(json.load(f),
                                                 checkpoints.load_metadata(checkpoint))
    _refuse_other_bundles(spec)
    try:
        return mini.config(spec)
    except (ValueError, FileNotFoundError, KeyError) as e:
        raise ValueError(f"config {spec!r} is neither a preset ({sorted(t5.PRESETS)}), a "
                         f"bundled T5 model nor an HF config.json ({e}).") from None


def _check_spec(spec: Spec) -> None:
    if isinstance(spec, Given):
        return
    if not isinstance(spec, str):
        raise TypeError(f"Model {spec!r} is invalid: give a bundled model name or peers.Given.")
    _refuse_other_bundles(spec)
    if not mini.is_t5(spec):  # unknown names raise here, with the bundle's list
        raise ValueError(f"{spec!r} is an n-gram draft; transformers runs T5 models only. Use "
                         f"a bundled T5 model: {mini.targets()} or their drafts "
                         f"{[d for t in mini.targets() for d in mini.t5_drafts(t)]}.")


def _load(spec: Spec) -> Tuple[str, contract.DecodeModel]:
    if isinstance(spec, Given):
        return spec.name, loading.load_model(spec.config, spec.checkpoint, seed=spec.seed)
    return spec, mini.load(spec)


def default_pairs() -> List[Tuple[str, str]]:
    """Each bundled target with its best draft: the compute-bound mini pair, then the
    memory-bound large pair."""
    return [(t, mini.best_t5_draft(t)) for t in (mini.MINI_TARGET, mini.LARGE_TARGET)
            if t in mini.targets()]


# ----------------------------------------------------------------------------------------------
# transformers' side.


def to_transformers(model: contract.DecodeModel, hf_dir: str):
    """`model` (a T5 DecodeModel) written by `checkpoints.hf.save_hf_t5` and loaded by
    transformers."""
    _, transformers = import_hf()
    hf_checkpoints.save_hf_t5(model.params, model.module.config, hf_dir)
    return transformers.T5ForConditionalGeneration.from_pretrained(hf_dir).eval()


def _count_calls(hf_model) -> List[int]:
    """A one-element counter that a forward hook on `hf_model` increments."""
    counter = [0]
    hf_model.register_forward_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    return counter


def _fresh_cache():
    """`generate`'s KV cache argument. For a T5 whose encoder is shallower than its decoder,
    transformers' default cache (sized by the encoder's layer count) fails with an IndexError,
    so an explicit, empty `EncoderDecoderCache` goes into every call."""
    _, transformers = import_hf()
    from transformers.generation import utils  # pylint: disable=import-outside-toplevel

    # transformers 5.x renamed `past_key_values` to `cache` (the old name warns on every call).
    name = "cache" if "cache" in getattr(utils, "ALL_CACHE_NAMES", ()) else "past_key_values"
    cache = transformers.EncoderDecoderCache(transformers.DynamicCache(),
                                             transformers.DynamicCache())
    return {name: cache}


def hf_program(hf_model, batches: Sequence[np.ndarray], counter: List[int], *,
               sampling: SamplingConfig, max_decode_len: int, seed: int, assistant=None,
               assistant_config=None) -> Callable[[], Tuple[List[np.ndarray], int]]:
    """A thunk that runs `hf_model.generate` on every batch (assisted by `assistant` with
    `assistant_config` when given); returns (new tokens [B, <= N] per batch, target calls)."""
    torch, _ = import_hf()
    inputs = [torch.from_numpy(np.asarray(b)).long() for b in batches]
    kwargs = dict(max_new_tokens=max_decode_len, eos_token_id=contract.EOS_ID,
                  pad_token_id=contract.PAD_ID, decoder_start_token_id=contract.BOS_ID,
                  do_sample=not sampling.greedy)
    if not sampling.greedy:  # top_k=0 turns transformers' default top-k of 50 off, as ours
        kwargs.update(temperature=sampling.temperature, top_k=sampling.top_k,
                      top_p=sampling.top_p)

    def run():
        torch.manual_seed(seed)
        start, out = counter[0], []
        for x in inputs:
            if assistant is not None:
                # transformers 5.x takes the draft length, its schedule and the confidence stop
                # only from the assistant's generation_config (not from generate's arguments),
                # and the "heuristic" schedule writes its state back there: a fresh copy per
                # call keeps every call (and repeat) the same program.
                assistant.generation_config = copy.deepcopy(assistant_config)
            seq = hf_model.generate(x, attention_mask=(x != contract.PAD_ID).long(),
                                    assistant_model=assistant, **_fresh_cache(), **kwargs)
            out.append(seq[:, 1:].numpy())  # without the decoder start token
        return out, counter[0] - start

    return run


def assistant_settings(config) -> Dict[str, Any]:
    """The draft length, schedule and confidence stop that transformers' assisted generation
    takes from the assistant's `generation_config`: its own values, else the built-in defaults
    (5.x leaves them unset in the config and fills them in `generate`), and whether the
    confidence threshold adapts during generation (5.x: only with scikit-learn installed)."""
    _, transformers = import_hf()
    builtin = getattr(config, "_get_default_generation_params", dict)()
    out = {k: builtin.get(k) if getattr(config, k, None) is None else getattr(config, k)
           for k in ("num_assistant_tokens", "num_assistant_tokens_schedule",
                     "assistant_confidence_threshold")}
    out["adaptive_threshold"] = bool(transformers.utils.is_sklearn_available())
    return out


def _sequences(tokens: np.ndarray, lengths: Optional[np.ndarray] = None) -> List[List[int]]:
    """Rows of tokens up to and including the first EOS (or `lengths` tokens)."""
    rows = []
    for b, row in enumerate(np.asarray(tokens).tolist()):
        end = row.index(contract.EOS_ID) + 1 if contract.EOS_ID in row else len(row)
        rows.append(row[:end if lengths is None else int(lengths[b])])
    return rows


# ----------------------------------------------------------------------------------------------
# Parity, timing and agreement for one pair.


def check_parity(models_: Dict[str, Tuple[Any, Any]], batches: Sequence[np.ndarray],
                 greedy: Sequence[decoding.DecodeResult], atol: float) -> Dict[str, float]:
    """Max abs logit difference of each (ours, transformers') model, teacher-forced on the
    encoder inputs `batches` and the target's greedy outputs `greedy`; raises `ParityError`
    above `atol`."""
    torch, _ = import_hf()
    enc = np.concatenate(batches)
    width = max(r.tokens.shape[1] for r in greedy)
    dec = np.zeros((enc.shape[0], width), np.int32)  # BOS = 0, then the output shifted right
    row = 0
    for r in greedy:
        tokens = np.asarray(r.tokens)
        dec[row:row + len(tokens), 1:tokens.shape[1]] = tokens[:, :-1]
        row += len(tokens)
    out = {"atol": atol}
    for name, (ours, theirs) in models_.items():
        mine = np.asarray(jax.jit(ours.module.apply)({"params": ours.params}, enc, dec))
        with torch.no_grad():
            ref = theirs(input_ids=torch.from_numpy(enc).long(),
                         attention_mask=torch.from_numpy(enc != contract.PAD_ID).long(),
                         decoder_input_ids=torch.from_numpy(dec).long()).logits.numpy()
        out[name] = float(np.max(np.abs(mine - ref)))
        out[f"{name}_max_abs_logit"] = float(np.max(np.abs(ref)))
        if not out[name] <= atol:
            raise ParityError(
                f"Logits of the {name} differ from transformers' by {out[name]:.3g} (max |logit| "
                f"{out[f'{name}_max_abs_logit']:.3g}) > parity_atol={atol:g} on the same weights: "
                "the conversion (checkpoints.hf.to_hf_t5 / hf_config_dict) or one of the two T5 "
                "implementations is wrong. Timings of different models would mean nothing.")
    return out


def check_pair(target, draft, batches: Sequence[np.ndarray]) -> None:
    """Refuses a pair transformers cannot run as given, before any work."""
    loading.check_same_vocab(target, draft)
    if batches and int(max(np.max(b) for b in batches)) >= target.vocab_size:
        raise ValueError(f"The target's vocab_size={target.vocab_size} is too small for the "
                         "inputs (the bundled vocabulary); use models of that vocabulary.")
    cfg = draft.module.config
    if cfg.num_encoder_layers < cfg.num_decoder_layers:
        raise ValueError(
            f"The draft has {cfg.num_encoder_layers} encoder and {cfg.num_decoder_layers} decoder "
            "layers: transformers builds an assistant's KV cache itself, by the encoder's depth, "
            "and fails (IndexError) on a deeper decoder. Use a draft whose encoder is at least "
            "as deep as its decoder.")


def _method(implementation: str, method: str, temperature: float, times, first, tokens: int,
            target_calls: Optional[int]) -> Dict[str, Any]:
    timing = measure.Timing(tuple(times), first).to_json()
    return {"implementation": implementation, "method": method, "temperature": temperature,
            "timing": timing, "tokens": tokens, "tokens_per_s": tokens / timing["median_s"],
            "target_calls": target_calls,
            "tokens_per_target_call": tokens / target_calls if target_calls else None}


def compare(target, draft, batches: Sequence[np.ndarray], *, gamma: int,
            temperatures: Sequence[float], max_decode_len: int, repeats: int,
            parity_atol: float, seed: int, progress: Optional[str] = None) -> Dict[str, Any]:
    """Parity, interleaved timings and greedy agreement of one pair (module docstring) on
    `batches` (encoder inputs, one program call decodes them all, one at a time)."""
    check_pair(target, draft, batches)
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        hf_target = to_transformers(target, os.path.join(tmp, "target"))
        hf_draft = to_transformers(draft, os.path.join(tmp, "draft"))
    counter = _count_calls(hf_target)
    greedy = SamplingConfig(0.0)
    reference = [decoding.autoregressive_decode(target, b, rng=jax.random.PRNGKey(seed),
                                                sampling=greedy, max_decode_len=max_decode_len)
                 for b in batches]  # the same program as the timed greedy baseline
    parity = check_parity({"target": (target, hf_target), "draft": (draft, hf_draft)}, batches,
                          reference, parity_atol)

    default_config = copy.deepcopy(hf_draft.generation_config)
    fixed_config = copy.deepcopy(default_config)
    fixed_config.num_assistant_tokens = gamma
    fixed_config.num_assistant_tokens_schedule = "constant"
    fixed_config.assistant_confidence_threshold = 0.0  # no early stop: gamma drafts every round
    programs = {}
    for temperature in temperatures:
        sampling = SamplingConfig(float(temperature))
        ours = costs_lib.decode_programs(target, [draft] * len(batches), batches,
                                         {SPECULATIVE: (gamma, 0.0)}, sampling=sampling,
                                         max_decode_len=max_decode_len, seed=seed)
        programs[(OURS, AUTOREGRESSIVE, temperature)] = ours["baseline"]
        programs[(OURS, SPECULATIVE, temperature)] = ours[SPECULATIVE]
        hf = dict(sampling=sampling, max_decode_len=max_decode_len, seed=seed)
        programs[(THEIRS, GENERATE, temperature)] = hf_program(hf_target, batches, counter, **hf)
        for method, config in ((ASSISTED_DEFAULT, default_config),
                               (assisted_fixed(gamma), fixed_config)):
            programs[(THEIRS, method, temperature)] = hf_program(
                hf_target, batches, counter, assistant=hf_draft, assistant_config=config, **hf)
    first, times, outputs = costs_lib.interleaved(programs, repeats, progress=progress)

    methods, sequences = {}, {}
    for key, out in outputs.items():
        implementation, method, temperature = key
        if implementation == OURS:
            stats = stats_lib.merge_stats([r.stats for r in out]).summary()
            tokens, calls = stats["generated"], stats["target_calls"]
            seqs = [s for r in out for s in _sequences(r.tokens, np.asarray(r.lengths))]
        else:
            seqs = [s for tokens in out[0] for s in _sequences(tokens)]
            tokens, calls = sum(map(len, seqs)), out[1]
        methods[key] = _method(implementation, method, temperature, times[key], first[key],
                               tokens, calls)
        if temperature == 0:
            sequences[f"{implementation} {method}"] = seqs

    comparisons = []
    for temperature in temperatures:
        for mine, theirs in ((AUTOREGRESSIVE, GENERATE), (SPECULATIVE, assisted_fixed(gamma)),
                             (SPECULATIVE, ASSISTED_DEFAULT)):
            a, b = methods[(OURS, mine, temperature)], methods[(THEIRS, theirs, temperature)]
            comparisons.append({
                "temperature": temperature, "ours": mine, "theirs": theirs,
                "ours_tokens_per_s": a["tokens_per_s"], "theirs_tokens_per_s": b["tokens_per_s"],
                "ours_tokens_per_target_call": a["tokens_per_target_call"],
                "theirs_tokens_per_target_call": b["tokens_per_target_call"],
                "ours_over_theirs": a["tokens_per_s"] / b["tokens_per_s"]})
    return {"sentences": int(sum(len(b) for b in batches)), "parity": parity,
            "assistant_default": assistant_settings(default_config),
            "methods": list(methods.values()), "comparisons": comparisons,
            "greedy": agreement(sequences, f"{OURS} {AUTOREGRESSIVE}")}


def agreement(sequences: Dict[str, List[List[int]]], reference: str) -> Dict[str, Any]:
    """Per sentence, whether every method's greedy output is the same; and each method's count
    of sentences equal to `reference`'s."""
    if not sequences:
        return {"sentences": 0, "identical": None, "methods": [], "identical_to": {}}
    names = list(sequences)
    rows = list(zip(*(sequences[n] for n in names)))
    ref = sequences[reference]
    return {"sentences": len(rows), "identical": sum(all(s == r[0] for s in r) for r in rows),
            "methods": names,
            "identical_to": {n: sum(a == b for a, b in zip(sequences[n], ref)) for n in names}}


# ----------------------------------------------------------------------------------------------
# The run: validation, models, inputs, outputs.


def _check_args(pairs, num_sentences, repeats, gamma, temperatures, max_decode_len,
                input_length, parity_atol, torch_threads) -> None:
    for name, value, what in (
            ("num_sentences", num_sentences, "test sentences"), ("repeats", repeats,
                                                                 "timed rounds"),
            ("gamma", gamma, "drafts per round"), ("max_decode_len", max_decode_len,
                                                   "tokens per sentence at most"),
            ("input_length", input_length, "encoder input tokens"),
            ("torch_threads", torch_threads, "torch's threads")):
        validation.positive_int(value, name, what)
    if not temperatures or any(isinstance(t, bool) or not t >= 0 for t in temperatures):
        raise ValueError(f"temperatures={list(temperatures)!r}: give one or more values >= 0 "
                         "(0 = greedy), e.g. --temperatures=0,1.")
    if not parity_atol > 0:
        raise ValueError(f"parity_atol={parity_atol!r} must be > 0 (max abs logit difference "
                         "allowed between ours and transformers'; 1e-3 is typical).")
    if not pairs:
        raise ValueError(f"pairs={pairs!r} is empty: give (target, draft) pairs, e.g. "
                         "--pairs=large_target:large_draft_kdtv.")
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"Pair {pair!r} is invalid: give (target, draft), e.g. "
                             "('large_target', 'large_draft_kdtv').")
        for spec in pair:
            _check_spec(spec)


def run(*, output_dir: str, pairs: Optional[Sequence[Tuple[Spec, Spec]]] = None,
        num_sentences: int = 24, repeats: int = 9, gamma: int = 4,
        temperatures: Sequence[float] = (0.0, 1.0), max_decode_len: int = 48,
        input_length: int = 48, parity_atol: float = 1e-3, torch_threads: Optional[int] = None,
        overwrite: bool = False, seed: int = 0) -> Dict[str, Any]:
    """Compares every pair (module docstring); writes `peers.json` and `peers.md` atomically
    into `output_dir` (an earlier `peers.json` is refused unless `overwrite`, before any work).

    Args:
      pairs: (target, draft) pairs, each a bundled T5 model name or a `Given` model; None =
        `default_pairs()`. Inputs are bundled test sentences in the bundled vocabulary.
      num_sentences: the first sentences of the bundled test split that fit `input_length`
        tokens, decoded one at a time (batch 1).
      gamma: drafts per round of ours and of transformers' constant schedule.
      torch_threads: torch's intra-op threads (None = os.cpu_count()).
    """
    pairs = default_pairs() if pairs is None else [tuple(p) for p in pairs]
    torch_threads = os.cpu_count() if torch_threads is None else torch_threads
    _check_args(pairs, num_sentences, repeats, gamma, temperatures, max_decode_len,
                input_length, parity_atol, torch_threads)
    if not overwrite and os.path.exists(os.path.join(output_dir, RESULTS_FILE)):
        raise FileExistsError(f"{os.path.join(output_dir, RESULTS_FILE)} holds an earlier run; "
                              "choose another --output_dir or pass --overwrite to replace it.")
    torch, transformers = import_hf()
    files.check_output_dir(output_dir)  # a path, writable
    torch.set_num_threads(torch_threads)
    batches = mini.source_batches(num_sentences, 1, input_length)
    if len(batches) < num_sentences:
        raise ValueError(f"Only {len(batches)} test sentences fit input_length={input_length}; "
                         f"lower num_sentences={num_sentences} or raise input_length.")

    loaded = [(_load(target), _load(draft)) for target, draft in pairs]
    for (_, target), (_, draft) in loaded:
        check_pair(target, draft, batches)  # every pair before the first one's long timing

    load = host.LoadAverage()
    results = []
    for (target_name, target), (draft_name, draft) in loaded:
        print(f"{target_name} + {draft_name}: parity, then timing ({repeats} repeats)",
              flush=True)
        results.append({"target": target_name, "draft": draft_name, **compare(
            target, draft, batches, gamma=gamma, temperatures=[float(t) for t in temperatures],
            max_decode_len=max_decode_len, repeats=repeats, parity_atol=parity_atol, seed=seed,
            progress=f"{target_name}: timing")})
        print(format_pair(results[-1]), flush=True)
    env = {**host.environment(), "torch_version": torch.__version__,
           "transformers_version": transformers.__version__,
           "torch_num_threads": torch.get_num_threads(),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
           "load_average_1m": load.record()}
    data = {"schema": SCHEMA, "config": {
        "pairs": [[r["target"], r["draft"]] for r in results], "num_sentences": num_sentences,
        "repeats": repeats, "gamma": gamma, "temperatures": [float(t) for t in temperatures],
        "max_decode_len": max_decode_len, "input_length": input_length,
        "parity_atol": parity_atol, "seed": seed}, "environment": env, "pairs": results,
        "provenance": host.provenance(load=env["load_average_1m"])}
    os.makedirs(output_dir, exist_ok=True)
    files.write_atomic(os.path.join(output_dir, TABLE_FILE), format_markdown(data))
    files.write_atomic(os.path.join(output_dir, RESULTS_FILE), json.dumps(
        files.json_ready(data), indent=1, allow_nan=False) + "\n")  # last: complete when present
    print(f"wrote {os.path.join(output_dir, RESULTS_FILE)} and {TABLE_FILE}", flush=True)
    record.index_run("peers", "+".join(r["target"] for r in results),
                     os.path.join(output_dir, RESULTS_FILE), data)
    return data


# ----------------------------------------------------------------------------------------------
# Markdown.


def _num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def format_pair(pair: Dict[str, Any]) -> str:
    """One pair's markdown: parity, greedy agreement and the ours-vs-transformers table."""
    p, g = pair["parity"], pair["greedy"]
    lines = [f"### {pair['target']} + {pair['draft']}", "",
             f"{pair['sentences']} test sentences at batch 1. Logits parity (max abs diff): "
             f"target {p['target']:.2g}, draft {p['draft']:.2g} (tolerance {p['atol']:g}). "
             f"Greedy outputs identical across all {len(g['methods'])} greedy methods: "
             f"{g['identical']}/{g['sentences']} sentences.", "",
             "| T | ours | tokens/s | tokens/call | transformers | tokens/s | tokens/call | "
             "ours / transformers |", "|---|---|---|---|---|---|---|---|"]
    for c in pair["comparisons"]:
        lines.append(
            f"| {c['temperature']:g} | {c['ours']} | {c['ours_tokens_per_s']:.1f} | "
            f"{_num(c['ours_tokens_per_target_call'])} | {c['theirs']} | "
            f"{c['theirs_tokens_per_s']:.1f} | {_num(c['theirs_tokens_per_target_call'])} | "
            f"{c['ours_over_theirs']:.2f}x |")
    d = pair["assistant_default"]
    lines += ["", (f"assisted (default): transformers' own settings, {d['num_assistant_tokens']} "
                   f"drafts per round at most, schedule {d['num_assistant_tokens_schedule']}, "
                   "drafting stops where the assistant's top probability falls below "
                   f"{d['assistant_confidence_threshold']} ("
                   + ("adapted during generation" if d["adaptive_threshold"] else
                      "fixed: scikit-learn, which adapts it, is not installed") + ").")]
    return "\n".join(lines)


def format_markdown(data: Dict[str, Any]) -> str:
    c, e = data["config"], data["environment"]
    head = [
        "## Ours vs transformers", "",
        f"`python scripts/compare_peers.py` ({e['time'][:10]}): our jitted decoders against "
        f"transformers {e['transformers_version']} (torch {e['torch_version']}, "
        f"{e['torch_num_threads']} threads) on the same converted models, sentences and "
        f"process, {c['repeats']} interleaved repeats, medians; gamma = {c['gamma']}, "
        f"max_decode_len = {c['max_decode_len']}. Load average "
        f"{e['load_average_1m']['before']:.2f} before, {e['load_average_1m']['after']:.2f} after "
        f"({e['cpu_count']} CPUs).", ""]
    return "\n".join(head + ["\n\n".join(format_pair(p) for p in data["pairs"])]) + "\n"
