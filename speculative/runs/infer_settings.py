"""The settings of one inference run (`runs/infer.py`), resolved from gin and checked before any
model is loaded: every refusal names the gin macro that sets the bad value and the fix.

    settings = InferSettings(target_config=..., draft_config=..., ...)   # raises on bad values
    settings.to_json()                     # what metrics.json records under "settings"

`with_overrides` gives every run function's settings (infer, benchmark, alpha) the fields bound
on the run itself (`--gin.infer.infer.progress=False`) or passed as keywords.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import gin

from speculative import loading
from speculative.decode import kernel as sampling_lib
from speculative.measure.speculation import AUTO
from speculative.models import partitioning, t5

MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "configs", "models")  # the repository's model gin files

# InferSettings field -> the infer.gin macro that sets it (for error messages).
MACROS = {"target_config": "TARGET_MODEL", "draft_config": "DRAFT_MODEL",
          "target_checkpoint": "TARGET_CHECKPOINT", "draft_checkpoint": "DRAFT_CHECKPOINT",
          "mixture_or_task_name": "MIXTURE_OR_TASK_NAME",
          "task_feature_lengths": "TASK_FEATURE_LENGTHS", "output_dir": "INFER_OUTPUT_DIR",
          "input_file": "INPUT_FILE", "checkpoint_period": "CHECKPOINT_PERIOD",
          "shard_id": "SHARD_ID", "num_shards": "NUM_SHARDS", "time_limit_s": "TIME_LIMIT_S",
          "infer_mode": "MODE"}
MODES = ("predict", "score")  # T5X's infer modes: decode targets, or score given ones


def model_gin(name: str) -> Optional[str]:
    """The configs/models/ file that binds the scope of bundled T5 `name` (e.g. large_draft.gin
    for large_draft_kdtv), as a relative path; None where there is none."""
    for stem in (name, name.rsplit("_", 1)[0]):
        if os.path.exists(os.path.join(MODELS_DIR, f"{stem}.gin")):
            return f"configs/models/{stem}.gin"
    return None


def architecture_source(config, checkpoint: Optional[str]) -> str:
    """Where a model's architecture comes from, for the log: the T5Config bound in gin, or (a
    config of None with a checkpoint) the T5X config.gin at, beside or above the checkpoint."""
    if config is None and checkpoint:
        return f"the T5X config.gin at, beside or above {checkpoint} (checkpoints.t5x_config)"
    return "the T5Config bound in gin"


def with_overrides(cls, settings, overrides: Dict[str, Any], run_name: str):
    """`settings` (a `cls` settings dataclass) with `overrides` (fields by name) replaced, or
    `cls(**overrides)` when `settings` is None: what `--gin.<run>.<field>=...` bindings and
    keyword calls of a run function give (`infer.infer`, `benchmark.run`, `alpha.run`)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"{run_name}: unknown settings {unknown}; the fields of {cls.__name__} "
                        f"are {sorted(names)}.")
    if settings is None:
        return cls(**overrides)
    return dataclasses.replace(settings, **overrides) if overrides else settings


@dataclasses.dataclass(frozen=True)
class InferSettings:
    """Everything one inference run needs, resolved from gin (`infer(dry_run=True)` returns it).

    A model is given in one of three forms (TARGET_MODEL / TARGET_CHECKPOINT; the draft's alike):
    a bundled model's name with checkpoint None (its trained weights); a T5Config with a
    checkpoint path; a T5Config with None (random weights, seeded). TARGET_MODEL = None with a
    checkpoint reads the architecture from the T5X config.gin beside the checkpoint.

    Attributes:
      target_config, draft_config: each model in one of three forms with its checkpoint (gin:
        TARGET_MODEL, DRAFT_MODEL): a bundled model's name with checkpoint None (its trained
        weights); a `T5Config` with a checkpoint path (or None with a checkpoint: the
        architecture from the T5X config.gin beside it); a `T5Config` with None (random
        weights, seed `seed` and `seed + 1`; tests and timing only). The draft may also be an
        n-gram file or 'prompt_lookup', and is unused (and may be None) when
        `speculative=False`.
      target_checkpoint, draft_checkpoint: paths `checkpoints.load_params` reads, or None.
      mixture_or_task_name: a registered seqio task (not a mixture).
      task_feature_lengths: {'inputs': L_in, 'targets': max_decode_len}.
      output_dir: where the T5X-named output file, metrics.json and config.gin go (None:
        write nothing); `infer_output` names them.
      gamma: draft tokens per round, or 'auto' (gin: GAMMA; the default): the run times the
        baseline, the chain at a few gammas, a block draft's block and the chooser's token
        tree on its first inputs (`speculation.choose_speculation`) and runs the fastest, which may
        be no speculation at all; metrics.json records the choice (`speculation_choice`). With
        BEAM_SIZE, 'auto' lets `choose_beam_search` choose the gamma.
      sampling: applied to both models (temperature 0 = argmax; top_k / top_p).
      batch_size: rows per decode call (the paper used 1).
      split: the task split to read.
      num_examples: the first N examples of the split; None = all.
      seed: PRNG seed of the decode keys (batch i uses fold_in(key, i)) and of random weights.
      speculative: False decodes with the target alone through the same pipeline (the baseline).
      decoder_only: decoder-only (GPT-like) models, `t5.DecoderOnly` (gin: DECODER_ONLY). A
        config's `num_encoder_layers` must be 0 with it and at least 1 without it (checked
        before any work). The task's inputs are prompts the decoder continues (e.g.
        stdlib_code); too-long ones keep their last L_in tokens. No beam search.
      lenience: paper A.5; 1 is exact.
      truncate_inputs: truncate (and count) too-long inputs (an encoder input to its first
        L_in - 1 tokens + EOS, a decoder-only prompt to its last L_in); False makes them an error.
      param_dtype: cast parameters on load (e.g. 'bfloat16').
      tfds_data_dir: where the paper tasks' prepared TFDS data lives.
      progress: show the tqdm bar over batches.
      overwrite: replace an earlier run in `output_dir` (otherwise a directory holding files is
        refused before any work starts).
      mesh_shape: (data, model) devices (gin: MESH_SHAPE): the target's parameters shard by
        T5X's standard rules, KV caches batch over 'data' and heads over 'model', and each
        batch's rows split over 'data'; None decodes on one device.
      draft_partitioned: shard the draft like the target (default: replicated, batch split).
      beam_size: T5X-style beam search of this width instead of sampling (gin: BEAM_SIZE;
        TEMPERATURE must be 0). Speculative: `beam_lib.speculative_beam_search` (paper A.4),
        whose output equals the target's own `beam_lib.beam_search`; gamma steps per round.
      draft_beam: the width of the draft's beam search proposing paths each round, beside
        every alive beam's greedy path (gin: DRAFT_BEAM; 0 = greedy paths only; None = the run
        chooses it and GAMMA by timing, see force_speculative_beam).
      length_penalty: T5X's ((5 + length) / 6) ** length_penalty (gin: LENGTH_PENALTY).
      input_file: read the inputs from this file instead of the task's split (gin:
        INPUT_FILE): text (one input a line), .tsv (input, optional reference) or .jsonl
        ({"input": ..., optional "target" or "reference"}); encoded with the task's
        vocabulary and prefix (`infer_inputs.read_input_file`).
      checkpoint_period: batches per output chunk (gin: CHECKPOINT_PERIOD, T5X's
        checkpoint_period): each chunk is written with a completion marker, and a rerun of the
        same command resumes after the last complete one.
      shard_id, num_shards: this process decodes examples i with i % num_shards == shard_id
        (gin: SHARD_ID, NUM_SHARDS; T5X's), writing `...-<shard_id>-of-<num_shards>`.
      infer_mode: 'predict' (decode) or 'score' (the target's log-likelihood of each given
        target; gin: MODE, T5X's `infer.mode`; no draft is needed).
      time_limit_s: the most worst-case seconds one decode call may take before it is refused
        (gin: TIME_LIMIT_S; None: no limit; `decode.validation.TIME_LIMIT_S` for the run).
      force_speculative_beam: with SPECULATIVE and BEAM_SIZE, run speculative_beam_search with
        DRAFT_BEAM (None = BEAM_SIZE) and GAMMA (gin: FORCE_SPECULATIVE_BEAM). Without it the
        run times the plain search against the speculative proposals on its first inputs
        (`choose_beam_search`), runs the speculative one only where it was faster, says which
        in the log and records the timings in metrics.json (`beam_choice`); the beams are the
        same either way.
    """

    target_config: Optional[t5.T5Config]
    draft_config: Optional[t5.T5Config]
    target_checkpoint: Optional[str]
    draft_checkpoint: Optional[str]
    mixture_or_task_name: str
    task_feature_lengths: Mapping[str, int]
    output_dir: Optional[str]
    gamma: Union[int, str] = AUTO
    sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(temperature=0.0)
    batch_size: int = 1
    split: str = "test"
    num_examples: Optional[int] = None
    seed: int = 0
    speculative: bool = True
    decoder_only: bool = False
    lenience: float = 1.0
    truncate_inputs: bool = True
    param_dtype: Optional[str] = None
    tfds_data_dir: Optional[str] = None
    progress: bool = True
    overwrite: bool = False
    mesh_shape: Optional[Tuple[int, int]] = None
    draft_partitioned: bool = False
    beam_size: Optional[int] = None
    draft_beam: Optional[int] = None
    draft_branch: int = 1  # chosen with draft_beam by infer.choose_beam_search
    length_penalty: float = 0.6
    force_speculative_beam: bool = False
    input_file: Optional[str] = None
    checkpoint_period: int = 100
    shard_id: int = 0
    num_shards: int = 1
    infer_mode: str = "predict"
    time_limit_s: Optional[float] = 600.0

    def __post_init__(self):
        def fail(name, value, fix):
            raise ValueError(f"infer: {name}={value!r} is invalid: {fix}")

        # A macro left at %gin.REQUIRED arrives as the gin.REQUIRED sentinel (gin only checks
        # macros when the config is finalized).
        missing = [MACROS.get(f.name, f.name) for f in dataclasses.fields(self)
                   if getattr(self, f.name) is gin.REQUIRED]
        if missing:
            raise ValueError(
                f"infer: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                "%gin.REQUIRED and not set; bind them, e.g. "
                + " ".join(f"--gin.{m}=..." for m in missing) + " (see configs/runs/infer.gin).")

        if self.mesh_shape is not None:  # gin gives a list
            object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        lengths = self.task_feature_lengths
        if (not isinstance(lengths, Mapping) or set(lengths) < {"inputs", "targets"}
                or not all(isinstance(lengths[k], int) and lengths[k] >= 1
                           for k in ("inputs", "targets"))):
            fail("TASK_FEATURE_LENGTHS", lengths,
                 "give positive ints for both features, e.g. {'inputs': 64, 'targets': 64}.")
        self._resolve_bundled("target", fail)
        if self.drafts:
            self._resolve_bundled("draft", fail)
        from_checkpoint = self.target_config is None and bool(self.target_checkpoint)
        if not (isinstance(self.target_config, t5.T5Config) or from_checkpoint):
            fail("TARGET_MODEL", self.target_config,
                 "bind a T5Config, e.g. TARGET_MODEL = @t5_1_1_xxl/t5.T5Config(), a bundled "
                 f"T5's name (one of {sorted(loading.bundled_names())}), or None with a "
                 "TARGET_CHECKPOINT whose T5X config.gin gives the architecture.")
        if not isinstance(self.decoder_only, bool):
            fail("DECODER_ONLY", self.decoder_only,
                 "use True (decoder-only language models) or False (encoder-decoder T5).")
        if not from_checkpoint:
            self._check_model_kind(fail, "TARGET_MODEL", self.target_config)
        if self.drafts:
            self._check_draft_spec(fail)
            if self.gamma != AUTO and (not isinstance(self.gamma, int)
                                       or isinstance(self.gamma, bool) or self.gamma < 1):
                fail("GAMMA", self.gamma, "draft at least one token per round (an int >= 1), "
                     f"or {AUTO!r} to time the choices on the first inputs and run the fastest.")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            fail("BATCH_SIZE", self.batch_size, "use an int >= 1.")
        if self.num_examples is not None and (not isinstance(self.num_examples, int)
                                              or self.num_examples < 1):
            fail("NUM_EXAMPLES", self.num_examples, "use an int >= 1, or None for the whole split.")
        if not isinstance(self.sampling, sampling_lib.SamplingConfig):
            fail("sampling", self.sampling, "bind a @sampling.SamplingConfig().")
        if self.beam_size is not None:
            self._check_beam(fail)
        self._check_run_shape(fail)
        if self.mesh_shape is not None:
            data = self.make_mesh().shape["data"]  # raises for a shape the devices cannot hold
            if self.batch_size % data:
                fail("BATCH_SIZE", self.batch_size,
                     f"MESH_SHAPE={tuple(self.mesh_shape)} splits each batch over {data} data "
                     f"shards; use a multiple of {data}.")

    def _resolve_bundled(self, role: str, fail) -> None:
        """A bundled T5's name (e.g. TARGET_MODEL = 'large_target') becomes its config and
        checkpoint, so the run is the same as with the two spelled out."""
        found = loading.bundled(getattr(self, f"{role}_config"))
        if found is None or not found.is_t5:
            return  # n-gram and target-aware drafts are built by name in load_models
        checkpoint = getattr(self, f"{role}_checkpoint")
        if checkpoint:
            model, ckpt = MACROS[f"{role}_config"], MACROS[f"{role}_checkpoint"]
            gin_file = model_gin(found.name)
            scope = os.path.splitext(os.path.basename(gin_file))[0] if gin_file else None
            own = (f"--gin_file={gin_file} --gin.{model}=\"@{scope}/t5.T5Config()\" "
                   f"--gin.{ckpt}=\\\"{checkpoint}\\\"" if gin_file else
                   f"--gin.{model}=None --gin.{ckpt}=\\\"{checkpoint}\\\" (the architecture "
                   "from the T5X config.gin beside the checkpoint)")
            fail(ckpt, checkpoint,
                 f"{model}={found.name!r} is a bundled model, which brings its own checkpoint: "
                 f"set {ckpt} = None for its trained weights, or for your own checkpoint of "
                 f"that architecture bind its config: {own}.")
        object.__setattr__(self, f"{role}_config", found.config)
        object.__setattr__(self, f"{role}_checkpoint", found.checkpoint)

    def _check_draft_spec(self, fail) -> None:
        """A draft is a T5Config, an n-gram file (.npz), 'prompt_lookup' or a bundled model's
        name; its vocabulary is checked against the target's when it is built."""
        spec = self.draft_config
        if spec is None and self.draft_checkpoint:
            return  # the architecture from the T5X config.gin beside the checkpoint
        if isinstance(spec, t5.T5Config):
            if (self.target_config is not None
                    and spec.vocab_size != self.target_config.vocab_size):
                fail("DRAFT_MODEL.vocab_size", spec.vocab_size,
                     f"the draft must share the target's vocabulary "
                     f"(vocab_size={self.target_config.vocab_size}).")
            self._check_model_kind(fail, "DRAFT_MODEL", spec)
            return
        if isinstance(spec, str) and spec.endswith(".npz"):
            if not os.path.exists(spec):
                fail("DRAFT_MODEL", spec, "no such n-gram draft file; give the path of a .npz "
                     "written by UnigramDraft/BigramDraft.save.")
            return
        if spec == loading.PROMPT_LOOKUP or loading.bundled(spec) is not None:
            return
        fail("DRAFT_MODEL", spec,
             "speculative decoding needs a draft: a T5Config (e.g. DRAFT_MODEL = "
             "@t5_1_1_small/t5.T5Config()), an n-gram file ('.../mini_bigram.npz'), "
             "'prompt_lookup', or a bundled model's name (e.g. 'large_draft_kdtv'); or "
             "SPECULATIVE = False for the baseline.")

    def _check_model_kind(self, fail, macro: str, config: t5.T5Config) -> None:
        """The config must be of the kind DECODER_ONLY builds. T5Config itself accepts both
        (`t5.DecoderOnly` ignores `num_encoder_layers`, and `t5.Transformer` runs with none), so
        a mismatch would otherwise decode silently with a model of the wrong shape: a decoder-only
        checkpoint loaded as an encoder-decoder fails only at the parameter check, and random
        weights not at all."""
        layers = config.num_encoder_layers
        if self.decoder_only and layers > 0:
            fail(f"{macro}.num_encoder_layers", layers,
                 "DECODER_ONLY = True builds t5.DecoderOnly, which has no encoder: bind a "
                 "decoder-only config (num_encoder_layers = 0, e.g. @code_target/t5.T5Config() "
                 "of configs/models/code_target.gin), or set DECODER_ONLY = False for an "
                 "encoder-decoder T5.")
        if not self.decoder_only and layers == 0:
            fail(f"{macro}.num_encoder_layers", layers,
                 "an encoder-decoder T5 (DECODER_ONLY = False) needs at least one encoder "
                 "layer; a config without any is a decoder-only language model: set "
                 "DECODER_ONLY = True (with a prompt -> continuation task such as stdlib_code).")

    def _check_beam(self, fail) -> None:
        def positive(value):
            return isinstance(value, int) and not isinstance(value, bool) and value >= 1

        if not positive(self.beam_size):
            fail("BEAM_SIZE", self.beam_size, "use an int >= 1 (None decodes without beams).")
        if self.decoder_only:
            fail("BEAM_SIZE", self.beam_size,
                 "beam search (decoding.beam_search, speculative_beam_search) scores "
                 "encoder-decoder T5 models only, and DECODER_ONLY = True: use BEAM_SIZE = None "
                 "(argmax or sampling) with decoder-only models.")
        if self.sampling.temperature != 0:
            fail("TEMPERATURE", self.sampling.temperature,
                 f"beam search (BEAM_SIZE={self.beam_size}) is deterministic: use 0.")
        if self.mesh_shape is not None:
            fail("MESH_SHAPE", self.mesh_shape, "beam search runs on one device; "
                 "use MESH_SHAPE = None with BEAM_SIZE.")
        if self.speculative and self.draft_beam is not None and (
                isinstance(self.draft_beam, bool) or not isinstance(self.draft_beam, int)
                or self.draft_beam < 0):
            fail("DRAFT_BEAM", self.draft_beam,
                 "use an int >= 0 (the width of the draft's beam search; 0 = only each alive "
                 "beam's greedy path), or None to let the run choose it with GAMMA.")
        if not isinstance(self.length_penalty, (int, float)) or not math.isfinite(
                self.length_penalty):
            fail("LENGTH_PENALTY", self.length_penalty, "use a finite float (T5X's 0.6).")

    def _check_run_shape(self, fail) -> None:
        """INPUT_FILE, CHECKPOINT_PERIOD, SHARD_ID / NUM_SHARDS, the mode and TIME_LIMIT_S."""
        def count(value):
            return isinstance(value, int) and not isinstance(value, bool)

        if self.input_file is not None and not (isinstance(self.input_file, str)
                                                and os.path.isfile(self.input_file)):
            fail("INPUT_FILE", self.input_file, "no such file; give the path of a text file "
                 "(one input a line), a .tsv (input<TAB>reference) or a .jsonl "
                 '({"input": ..., "target": ...} a line), or None to read the task\'s split.')
        if not count(self.checkpoint_period) or self.checkpoint_period < 1:
            fail("CHECKPOINT_PERIOD", self.checkpoint_period,
                 "use an int >= 1 (batches per output chunk; T5X's default is 100).")
        if not count(self.num_shards) or self.num_shards < 1:
            fail("NUM_SHARDS", self.num_shards, "use an int >= 1.")
        if not count(self.shard_id) or not 0 <= self.shard_id < self.num_shards:
            fail("SHARD_ID", self.shard_id,
                 f"use an int in [0, NUM_SHARDS={self.num_shards}).")
        if self.infer_mode not in MODES:
            fail("MODE", self.infer_mode,
                 f"use one of {MODES} ('score' writes the target's log-likelihood of each "
                 "given target, as T5X's infer.mode = 'score').")
        if self.infer_mode == "score" and self.beam_size is not None:
            fail("BEAM_SIZE", self.beam_size, "mode 'score' decodes nothing; use None.")
        if self.time_limit_s is not None and (
                isinstance(self.time_limit_s, bool)
                or not isinstance(self.time_limit_s, (int, float))
                or not self.time_limit_s > 0):
            fail("TIME_LIMIT_S", self.time_limit_s,
                 "give seconds > 0 (the most a decode call may take), or None for no limit.")

    def make_mesh(self):
        """The ('data', 'model') mesh of MESH_SHAPE, or None (one device)."""
        if self.mesh_shape is None:
            return None
        try:
            return partitioning.make_mesh(mesh_shape=self.mesh_shape)
        except ValueError as e:
            raise ValueError(f"infer: MESH_SHAPE={self.mesh_shape!r}: {e}") from None

    @property
    def input_length(self) -> int:
        return int(self.task_feature_lengths["inputs"])

    @property
    def max_decode_len(self) -> int:
        return int(self.task_feature_lengths["targets"])

    @property
    def drafts(self) -> bool:
        """Whether the run needs a draft (speculative, and not mode 'score')."""
        return self.speculative and self.infer_mode != "score"

    @property
    def auto_gamma(self) -> bool:
        """Whether the run chooses how to speculate by timing (GAMMA = 'auto')."""
        return self.gamma == AUTO

    @property
    def mode(self) -> str:
        """How the settings decode as given (GAMMA 'auto' and beam choices are the plan's:
        `infer_choice.DecodePlan.mode`)."""
        if self.infer_mode == "score":
            return "score"
        if self.beam_size is not None:
            # The speculative search runs when asked for (FORCE_SPECULATIVE_BEAM) or when the
            # run found it faster here (`choose_beam_search`, which sets the flag).
            return ("speculative_beam_search" if self.speculative and self.force_speculative_beam
                    else "beam_search")
        return "speculative" if self.speculative else "autoregressive"

    def to_json(self) -> Dict[str, Any]:
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[field.name] = value
        return out
