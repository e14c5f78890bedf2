"""T5X's own gin files as a `T5Config`: the `config.gin` T5X writes into every model directory,
and its model gin files (`t5x/examples/t5/t5_1_1/base.gin` style, or a decoder-only one).

    config = t5x_config('/ckpts/my_run')                  # my_run/config.gin
    config = t5x_config('/ckpts/my_run/checkpoint_5000')  # the config.gin above it
    found = t5x_model_config('gs://bucket/run/checkpoint_5000')
    found.config, found.decoder_only, found.source, found.skipped

What is read: the `network.T5Config` bindings (T5X's encoder-decoder,
`t5x/examples/t5/network.py`) or `network.TransformerConfig` (its decoder-only network, whose
`num_layers` is our `num_decoder_layers`, with no encoder), and the model class `MODEL =
@models.EncoderDecoderModel()` or `@models.DecoderOnlyModel()`. Macros (`%DROPOUT_RATE`) are
resolved, `include` lines are followed (relative to the including file's directories and
`search_paths`), scoped references (`@target/network.T5Config()`) apply their scope's
bindings. Everything else (optimizer, datasets, partitioner, checkpoint and trainer settings) is
skipped and named in one note. The text is parsed with gin's own parser, never executed:
nothing is imported and no configurable is registered.

A `T5Config` field this project does not model is refused by name rather than dropped, except
`float32_attention_logits` (this implementation computes attention logits in float32 always).
`dropout_rate` left `%gin.REQUIRED` (T5X's model files leave it to the run file) becomes 0.0:
decoding uses no dropout.

A config.gin is looked for at `path` (a .gin file), in `path` (a model dir), beside `path` (the
msgpack `checkpoint` file), and above a `checkpoint_N` (or Orbax `N`) dir that `path` is or
lies in; never in the parent of a model dir. Local and gs:// paths read through
`paths.open_file`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gin import config_parser

from speculative import files
from speculative.checkpoints import paths
from speculative.models import t5

CONFIG_GIN = "config.gin"

# T5X's configurables for the architecture (`network` is the module alias T5X's gin files use).
ENCODER_DECODER_CONFIG = "T5Config"
DECODER_ONLY_CONFIG = "TransformerConfig"
# T5X's T5Config / TransformerConfig field -> ours; `None` = accepted and not used.
_FIELDS = {"vocab_size": "vocab_size", "dtype": "dtype", "emb_dim": "emb_dim",
           "num_heads": "num_heads", "num_encoder_layers": "num_encoder_layers",
           "num_decoder_layers": "num_decoder_layers", "num_layers": "num_decoder_layers",
           "head_dim": "head_dim", "mlp_dim": "mlp_dim", "mlp_activations": "mlp_activations",
           "dropout_rate": "dropout_rate", "logits_via_embedding": "logits_via_embedding",
           "relative_attention_num_buckets": "relative_attention_num_buckets",
           "relative_attention_max_distance": "relative_attention_max_distance",
           "float32_attention_logits": None}
_STEP_DIR = re.compile(r"^(checkpoint_)?\d+$")


class ConfigGinError(ValueError):
    """A T5X gin file is missing, unreadable, or does not describe a T5 this project builds."""


@dataclasses.dataclass(frozen=True)
class T5XModel:
    """What a T5X gin file says the model is.

    Attributes:
      config: our `T5Config`.
      decoder_only: True for T5X's `DecoderOnlyModel` (build `t5.DecoderOnly`).
      source: the gin file read.
      skipped: one-line notes: what was read but does not apply here (the trainer's settings,
        a defaulted dropout rate).
    """

    config: t5.T5Config
    decoder_only: bool
    source: str
    skipped: Tuple[str, ...] = ()

    def describe(self) -> str:
        """One log line: the architecture and where it came from."""
        kind = "decoder-only" if self.decoder_only else "encoder-decoder"
        return f"{kind} {self.config} from {self.source}"


# ---------------------------------------------------------------- finding config.gin
def config_gin_candidates(path) -> List[str]:
    """Where a config.gin for `path` may be, in the order they are tried."""
    path = os.fspath(path).rstrip("/") or "/"
    if path.endswith(".gin"):
        return [path]
    # In a directory, or beside a file (the msgpack `checkpoint`); never beside a directory
    # that is not a step: a model dir's parent may hold another run's config.gin.
    out = [paths.join(paths.parent(path) if paths.is_file(path) else path, CONFIG_GIN)]
    node = path
    for _ in range(3):  # .../run/checkpoint_N/state, .../checkpoint_N/checkpoint
        name, up = node.rstrip("/").rsplit("/", 1)[-1], paths.parent(node)
        if _STEP_DIR.match(name):
            out.append(paths.join(paths.parent(node), CONFIG_GIN))
        if up == node:
            break
        node = up
    return list(dict.fromkeys(out))


def find_config_gin(path) -> Optional[str]:
    """The first config.gin of `config_gin_candidates(path)` that exists, or None."""
    for candidate in config_gin_candidates(path):
        if paths.is_file(candidate):
            return candidate
    return None


def no_config_message(path, candidates: Sequence[str]) -> str:
    return (f"No T5X config.gin for the checkpoint {os.fspath(path)} (looked for "
            f"{', '.join(candidates)}), so its architecture is unknown. Give the config one of "
            "two ways: (1) a T5Config: load_model(t5.preset('t5_1_1_small'), checkpoint), or in "
            "gin TARGET_MODEL = @t5_1_1_small/t5.T5Config() with --gin_file=configs/models/"
            "t5_1_1_small.gin (or T5X's own model gin file); (2) the config.gin that T5X wrote "
            "into the training run's model directory, copied beside checkpoint_N/ (or its path "
            "to checkpoints.t5x_config).")


def t5x_model_config(path, search_paths: Sequence[str] = ()) -> T5XModel:
    """The model of the T5X gin file at, beside or above `path` (module docstring); a `path`
    that does not exist is a FileNotFoundError saying so."""
    if not paths.exists(os.fspath(path)):
        raise FileNotFoundError(
            f"The checkpoint {os.fspath(path)} does not exist, so there is no config.gin beside "
            "it to read the architecture from: check the path (in gin, TARGET_CHECKPOINT or "
            "CHECKPOINT_PATH).")
    found = find_config_gin(path)
    if found is None:
        raise ConfigGinError(no_config_message(path, config_gin_candidates(path)))
    return read_t5x_gin(found, search_paths)


def t5x_config(path) -> t5.T5Config:
    """The `T5Config` of a T5X checkpoint or model dir `path`, from the config.gin T5X wrote
    at, beside or above it (or `path` itself when it is a .gin file); local or gs://. Whether
    the model is decoder-only: `t5x_model_config(path).decoder_only`."""
    return t5x_model_config(path).config


# ---------------------------------------------------------------- parsing
@dataclasses.dataclass(frozen=True)
class _Ref:
    name: str  # scope/selector
    evaluate: bool


@dataclasses.dataclass(frozen=True)
class _Macro:
    name: str


class _Delegate(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name, evaluate):
        return _Ref(scoped_configurable_name, evaluate)

    def macro(self, macro_name):
        return _Macro(macro_name)


_REQUIRED = object()


def _statements(path: str, search_paths: Sequence[str], seen: Tuple[str, ...] = ()):
    """The binding statements of `path` and its includes, in gin's order (later wins)."""
    if path in seen:
        raise ConfigGinError(f"{path} includes itself (through {' -> '.join(seen)}).")
    try:
        text = paths.read_text(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ConfigGinError(f"Cannot read the gin file {path}: {e}") from None
    try:
        parsed = list(config_parser.ConfigParser(text, _Delegate()))
    except SyntaxError as e:
        raise ConfigGinError(f"{path}:{e.lineno}: not a gin file ({e.msg}): "
                             f"{(e.text or '').strip()!r}") from None
    for statement in parsed:
        if isinstance(statement, config_parser.IncludeStatement):
            yield from _statements(_find_include(statement.filename, path, search_paths),
                                   search_paths, seen + (path,))
        elif isinstance(statement, config_parser.BindingStatement):
            yield statement


def _find_include(name: str, including: str, search_paths: Sequence[str]) -> str:
    """An `include` target: absolute, under a search path, or (T5X's repository-relative
    'include t5x/examples/...') under an ancestor of the including file's directory."""
    if paths.is_gcs(name) or os.path.isabs(name):
        return name
    tried, node = [], paths.parent(including)
    for base in list(search_paths) + ["."] + [None] * 8:
        if base is None:
            base, node = node, paths.parent(node)
        candidate = paths.join(base, name)
        if candidate not in tried:
            tried.append(candidate)
            if paths.is_file(candidate):
                return candidate
    raise ConfigGinError(f"{including}: include {name!r} not found (tried {tried[:4]} ...); "
                         "pass the directory that holds it as a gin search path.")


class _Bindings:
    """Macros and `(scope, selector) -> {arg: value}` of a parsed gin file."""

    def __init__(self, statements, source: str):
        self.source = source
        self.macros: Dict[str, Any] = {}
        self.params: Dict[Tuple[str, str], Dict[str, Any]] = {}
        for st in statements:
            if not st.arg_name:
                self.macros[f"{st.scope}/{st.selector}" if st.scope else st.selector] = st.value
            else:
                self.params.setdefault((st.scope, st.selector), {})[st.arg_name] = st.value

    def resolve(self, value, what: str, depth: int = 0):
        """`value` with every macro replaced by its value (references are kept)."""
        if depth > 50:
            raise ConfigGinError(f"{self.source}: {what} has macros that refer to each other "
                                 "in a loop.")
        if isinstance(value, _Macro):
            if value.name == "gin.REQUIRED":
                return _REQUIRED
            if value.name not in self.macros:
                raise ConfigGinError(f"{self.source}: {what} = %{value.name}, a macro the file "
                                     f"does not set; set {value.name} = ... in it.")
            return self.resolve(self.macros[value.name], what, depth + 1)
        if isinstance(value, (list, tuple)):
            return type(value)(self.resolve(v, what, depth + 1) for v in value)
        return value

    def find(self, short: str) -> List[Tuple[str, str]]:
        """Bound `(scope, selector)`s whose configurable is `short` (any module prefix)."""
        return [k for k in self.params if k[1] == short or k[1].endswith("." + short)]

    def args(self, ref_name: str, selector: str) -> Dict[str, Any]:
        """The arguments `@ref_name()` is called with: the unscoped bindings of `selector`,
        then those of each enclosing scope of the reference (outer to inner)."""
        scopes = ref_name.split("/")[:-1]
        out = dict(self.params.get(("", selector), {}))
        for i in range(1, len(scopes) + 1):
            out.update(self.params.get(("/".join(scopes[:i]), selector), {}))
        return out


def _model_choice(b: _Bindings) -> Optional[bool]:
    """decoder_only from `MODEL = @models.X()` (or a bound models.X); None if unsaid."""
    model = b.resolve(b.macros.get("MODEL"), "MODEL")
    names = [model.name] if isinstance(model, _Ref) else [s for _, s in b.params]
    kinds = {n.rsplit(".", 1)[-1] for n in names} & {"EncoderDecoderModel", "DecoderOnlyModel"}
    if len(kinds) == 1:
        return kinds.pop() == "DecoderOnlyModel"
    return None


def _config_ref(b: _Bindings, decoder_only: Optional[bool]) -> Tuple[str, str]:
    """(reference name, selector) of the architecture config the model is built with."""
    if decoder_only is None:
        wanted = [ENCODER_DECODER_CONFIG, DECODER_ONLY_CONFIG]
    else:
        wanted = [DECODER_ONLY_CONFIG if decoder_only else ENCODER_DECODER_CONFIG]
    for short in wanted:
        # Followed from the module: network.Transformer.config = @scope/network.T5Config()
        for (_, selector), args in b.params.items():
            ref = args.get("config")
            if selector.rsplit(".", 1)[-1] in ("Transformer", "DecoderWrapper") and \
                    isinstance(ref, _Ref) and ref.name.rsplit("/", 1)[-1].endswith(short):
                return ref.name, ref.name.rsplit("/", 1)[-1]
        found = sorted(b.find(short))  # the unscoped binding first
        scopes = sorted({scope for scope, _ in found})
        if len(scopes) > 1 and found[0][0]:
            raise ConfigGinError(
                f"{b.source} binds {found[0][1]} in several scopes ({', '.join(scopes)}) and "
                "nothing says which builds the model (no network.Transformer.config = "
                "@scope/...): give a T5Config instead.")
        if found:
            scope, selector = found[0]
            return (f"{scope}/{selector}" if scope else selector), selector
    what = "network.TransformerConfig" if decoder_only else "network.T5Config"
    raise ConfigGinError(
        f"{b.source} binds no {what}: it does not describe one of T5X's example T5 networks "
        "(a flaxformer model's gin binds other configurables). Give a T5Config instead.")


_MODEL_PARTS = (".Transformer", ".DecoderWrapper", ".EncoderDecoderModel", ".DecoderOnlyModel")


def read_t5x_gin(path, search_paths: Sequence[str] = ()) -> T5XModel:
    """The model a T5X gin file (a written config.gin, or a model gin file like
    `t5x/examples/t5/t5_1_1/small.gin` with its includes) describes."""
    path = os.fspath(path)
    b = _Bindings(_statements(path, search_paths), path)
    decoder_only = _model_choice(b)
    ref_name, selector = _config_ref(b, decoder_only)
    if decoder_only is None:
        decoder_only = selector.endswith(DECODER_ONLY_CONFIG)
    raw = b.args(ref_name, selector)
    fields, notes = {}, []
    for name, value in raw.items():
        if name not in _FIELDS:
            raise ConfigGinError(
                f"{path}: {selector}.{name} is not a field this project's T5 has "
                f"({sorted(k for k, v in _FIELDS.items() if v)}); a network with it would "
                "decode differently. Give a T5Config for the nearest model instead.")
        value = b.resolve(value, f"{selector}.{name}")
        if _FIELDS[name] is None:
            continue
        if value is _REQUIRED:
            if name != "dropout_rate":
                raise ConfigGinError(f"{path}: {selector}.{name} is %gin.REQUIRED; set it in "
                                     "the gin file (T5X's run files do).")
            notes.append("dropout_rate is %gin.REQUIRED there (set by T5X's run files): 0.0 "
                         "here, as decoding uses no dropout")
            value = 0.0
        if isinstance(value, _Ref):  # e.g. dtype = @jnp.bfloat16
            value = value.name.rsplit(".", 1)[-1]
        if isinstance(value, list):
            value = tuple(value)
        fields[_FIELDS[name]] = value
    if "vocab_size" not in fields:
        raise ConfigGinError(f"{path}: {selector}.vocab_size is not set; T5X requires it.")
    if decoder_only:
        if fields.get("num_encoder_layers"):
            raise ConfigGinError(f"{path}: a decoder-only model with {selector}."
                                 f"num_encoder_layers={fields['num_encoder_layers']}.")
        fields["num_encoder_layers"] = 0
        fields.setdefault("num_decoder_layers", 6)  # TransformerConfig.num_layers' default
    try:
        config = t5.T5Config(**fields)
    except (TypeError, ValueError) as e:
        raise ConfigGinError(f"{path}: the {selector} bindings do not make a T5Config: {e}") \
            from None
    other = sorted({s for (_, s) in b.params if s != selector and not s.endswith(_MODEL_PARTS)})
    if other:
        notes.append(f"skipped {len(other)} configurable(s) only T5X's trainer and runs read: "
                     + ", ".join(other[:12]) + (f" and {len(other) - 12} more" if len(other) > 12
                                               else ""))
    return T5XModel(config, bool(decoder_only), path, tuple(notes))


def is_t5x_gin(path, search_paths: Sequence[str] = ()) -> bool:
    """Whether `path` is one of T5X's gin files (it imports from `t5x`, or binds T5X's network
    configs) rather than one of this project's, which bind `t5.T5Config` in a scope."""
    try:
        text = paths.read_text(os.fspath(path))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return bool(re.search(r"^\s*(from\s+t5x[\s.]|import\s+t5x)|network\.(T5Config|"
                          r"TransformerConfig)\b", text, re.M))


# ---------------------------------------------------------------- writing config.gin
# T5X's example networks fix the relative-attention buckets at 32 and their distance at 128.
_T5X_FIXED = {"relative_attention_num_buckets": 32, "relative_attention_max_distance": 128}


def t5x_gin_text(config: t5.T5Config, decoder_only: bool = False, source: str = "") -> str:
    """A config.gin in T5X's written form for `config`: the model and its network config only
    (the trainer's settings are T5X's to write), readable by `read_t5x_gin` and by T5X's
    example networks (`t5x/examples/t5` or `t5x/examples/decoder_only`). `source` names where
    the config came from in the header comment."""
    if not isinstance(config, t5.T5Config):
        raise TypeError(f"config={config!r} is not a speculative.models.t5.T5Config.")
    if decoder_only and config.num_encoder_layers:
        raise ValueError(f"decoder_only=True but config.num_encoder_layers="
                         f"{config.num_encoder_layers}; a decoder-only model has no encoder.")
    network = "decoder_only" if decoder_only else "t5"
    model, module, net_config = (("DecoderOnlyModel", "DecoderWrapper", DECODER_ONLY_CONFIG)
                                 if decoder_only else
                                 ("EncoderDecoderModel", "Transformer", ENCODER_DECODER_CONFIG))
    values = dataclasses.asdict(config)
    if values["head_dim"] is None:
        values["head_dim"] = config.emb_dim // config.num_heads
    if decoder_only:
        values["num_layers"] = values.pop("num_decoder_layers")
        del values["num_encoder_layers"]
    for name, fixed in _T5X_FIXED.items():
        if values[name] == fixed:  # T5X's value: unsaid, as T5X's networks take no such field
            del values[name]
    lines = ["from __gin__ import dynamic_registration",
             "from t5x import models",
             f"from t5x.examples.{network} import network", "",
             "# The architecture of the checkpoints in this directory, as T5X writes config.gin.",
             "# Written by speculative.checkpoints.config_gin.t5x_gin_text"
             + (f" from {source}" if source else "") + ".",
             "# Read by speculative.loading.load_model(None, <this directory>).", "",
             f"MODEL = @models.{model}()",
             f"models.{model}.module = @network.{module}()",
             f"network.{module}.config = @network.{net_config}()"]
    for name, value in values.items():
        lines.append(f"network.{net_config}.{name} = {value!r}")
    return "\n".join(lines) + "\n"


def write_config_gin(directory, config: t5.T5Config, decoder_only: bool = False,
                     source: str = "") -> str:
    """Writes `directory/config.gin` (`t5x_gin_text`) atomically; returns its path. The
    directory is a T5X model dir: the one holding checkpoint_<step>/."""
    return files.write_atomic(os.path.join(os.fspath(directory), CONFIG_GIN),
                              t5x_gin_text(config, decoder_only, source))


def gin_bindings(model: T5XModel, scope: str = "network") -> str:
    """Our gin for `model`: `scope/t5.T5Config` bound field by field, so a run picks it as
    `TARGET_MODEL = @network/t5.T5Config()` (what `--gin_file=<T5X model gin>` should parse)."""
    lines = ["from __gin__ import dynamic_registration", "from speculative.models import t5", "",
             f"# From {model.source}" + ("" if not model.decoder_only else
                                         " (decoder-only: set DECODER_ONLY = True)"),
             f"{scope}/t5.T5Config:"]
    for field in dataclasses.fields(model.config):
        lines.append(f"  {field.name} = {getattr(model.config, field.name)!r}")
    return "\n".join(lines) + "\n"
