"""Hugging Face T5: state dicts, config.json and safetensors directories, to and from T5X names.

`from_hf_t5` / `to_hf_t5` map state dicts (HF kernels are `[out, in]`, T5X's `[in, out]`;
`shared.weight` is `token_embedder/embedding`; `lm_head.weight` is `decoder/logits_dense/kernel`
unless HF ties it to `shared`), `config_from_hf` / `hf_config_dict` map config.json to and from
`T5Config`, `load_hf_config` reads a directory's, and `save_hf_t5` writes `model.safetensors` +
`config.json` for transformers (`check_hf_target` refuses a directory it must not replace).
`checkpoints.load_params` reads an HF directory through `_hf_leaves` here; every public name is
also importable from `speculative.checkpoints`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

from speculative import files
from speculative.checkpoints.param_trees import (
    CheckpointError,
    Key,
    _ArrayLeaf,
    _dtype,
    _flatten,
    _name,
    _unflatten,
    validate_params,
)
from speculative.decode import contract
from speculative.models import layers, t5

__all__ = ["from_hf_t5", "to_hf_t5", "config_from_hf", "hf_config_dict", "load_hf_config",
           "check_hf_target", "save_hf_t5"]


# Per stack: T5X module of a layer -> (HF sublayer index j, HF module; None for its layer_norm).
_HF_LAYER = {
    "encoder": {"attention": (0, "SelfAttention"), "pre_attention_layer_norm": (0, None),
                "mlp": (1, "DenseReluDense"), "pre_mlp_layer_norm": (1, None)},
    "decoder": {"self_attention": (0, "SelfAttention"), "pre_self_attention_layer_norm": (0, None),
                "encoder_decoder_attention": (1, "EncDecAttention"),
                "pre_cross_attention_layer_norm": (1, None),
                "mlp": (2, "DenseReluDense"), "pre_mlp_layer_norm": (2, None)},
}
_ATTN = {"query": "q", "key": "k", "value": "v", "out": "o"}
_HF_IGNORED = re.compile(r"(encoder|decoder)\.embed_tokens\.weight|decoder\.block\.0\.layer\.1"
                         r"\.EncDecAttention\.relative_attention_bias\.weight")
_FFP = {"relu": ("relu",), "gated-gelu": ("gelu", "linear"), "gated-relu": ("relu", "linear"),
        "gated-silu": ("silu", "linear"), "silu": ("silu",), "gelu": ("gelu_exact",),
        "gelu_new": ("gelu",), "gated-gelu_new": ("gelu", "linear")}
# HF config.json key -> (T5Config field, transformers' default).
_HF_FIELDS = {"vocab_size": ("vocab_size", 32128), "d_model": ("emb_dim", 512),
              "num_heads": ("num_heads", 8), "d_kv": ("head_dim", 64), "d_ff": ("mlp_dim", 2048),
              "num_layers": ("num_encoder_layers", 6), "dropout_rate": ("dropout_rate", 0.1),
              "num_decoder_layers": ("num_decoder_layers", None),
              "relative_attention_num_buckets": ("relative_attention_num_buckets", 32),
              "relative_attention_max_distance": ("relative_attention_max_distance", 128)}
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}


def _hf_to_t5x_name(name: str) -> Optional[Key]:
    """T5X key of an HF T5 weight; None for HF's duplicates (`embed_tokens`, ...)."""
    if _HF_IGNORED.fullmatch(name):
        return None
    if name == "shared.weight":
        return ("token_embedder", "embedding")
    if m := re.fullmatch(r"(encoder|decoder)\.final_layer_norm\.weight", name):
        return (m[1], f"{m[1]}_norm", "scale")
    if m := re.fullmatch(r"(encoder|decoder)\.block\.0\.layer\.0\.SelfAttention\."
                         r"relative_attention_bias\.weight", name):
        return (m[1], "relpos_bias", "rel_embedding")
    m = re.fullmatch(r"(encoder|decoder)\.block\.(\d+)\.layer\.(\d+)\.(?:layer_norm|(\w+)\.(\w+))"
                     r"\.weight", name)
    for module, (j, hf_module) in _HF_LAYER[m[1]].items() if m else ():
        if j == int(m[3]) and hf_module == m[4]:
            if hf_module is None:
                return (m[1], f"layers_{m[2]}", module, "scale")
            subs = ({k: k for k in ("wi", "wi_0", "wi_1", "wo")} if hf_module == "DenseReluDense"
                    else {v: k for k, v in _ATTN.items()})
            if m[5] in subs:
                return (m[1], f"layers_{m[2]}", module, subs[m[5]], "kernel")
    raise CheckpointError(
        f"Unknown HF T5 weight {name!r}: only T5ForConditionalGeneration weights of T5 1.0/1.1 "
        "and Flan-T5 are supported (not umT5-style per-layer relative biases).")


def _hf_scaled(hf_config: Optional[Mapping], untied: bool) -> bool:
    """Whether HF scales the decoder output by d_model**-0.5 before `lm_head`: transformers 5.x
    says so in `scale_decoder_outputs`, 4.x in `tie_word_embeddings`; with no config, T5's
    conventions (1.0: tied and scaled; 1.1: untied, unscaled)."""
    if hf_config is None:
        return not untied
    tie = hf_config.get("tie_word_embeddings", True) is not False
    return bool(hf_config.get("scale_decoder_outputs", tie))


def _hf_plan(shapes: Mapping[str, tuple], get: Callable[[str], np.ndarray],
             hf_config: Optional[Mapping]) -> Dict[Key, Tuple[str, bool, Optional[float]]]:
    """T5X key -> (HF name, transpose, scale). Every 2-D HF weight but `shared` is `[out, in]`.
    The output layer is `logits_dense` unless HF ties it to `shared` and scales (T5 1.0)."""
    if "shared.weight" not in shapes:
        raise CheckpointError("The HF T5 weights have no `shared.weight` (token embedding).")
    plan = {}
    for name, shape in shapes.items():
        if name != "lm_head.weight" and (key := _hf_to_t5x_name(name)) is not None:
            plan[key] = (name, len(shape) == 2 and name != "shared.weight", None)
    untied = "lm_head.weight" in shapes and not (
        shapes["lm_head.weight"] == shapes["shared.weight"]
        and np.array_equal(get("lm_head.weight"), get("shared.weight")))
    scaled = _hf_scaled(hf_config, untied)
    if untied or not scaled:  # a scaled untied head folds the scale into the kernel
        scale = shapes["shared.weight"][1] ** -0.5 if scaled else None
        head = "lm_head.weight" if untied else "shared.weight"
        plan[("decoder", "logits_dense", "kernel")] = (head, True, scale)
    return plan


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor; bfloat16 keeps its bits
        x = x.detach().cpu().contiguous()
        if str(x.dtype) == "torch.bfloat16":
            import torch  # pylint: disable=import-outside-toplevel  # only ever for torch inputs
            return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return x.numpy()
    return np.asarray(x)


def from_hf_t5(state_dict: Mapping[str, Any], hf_config: Optional[Mapping] = None,
               dtype=None) -> Dict[str, Any]:
    """HF T5 state dict (torch tensors or numpy arrays) -> T5X-named numpy params.

    Kernels are transposed; `shared.weight [V, E]` is `token_embedder/embedding`; block 0's
    `relative_attention_bias [32, H]` is the stack's `relpos_bias/rel_embedding [H, 32]`;
    `lm_head.weight` is `decoder/logits_dense/kernel` unless tied to `shared` (a T5 1.0 model,
    `logits_via_embedding=True`). Without `hf_config` (config.json as a dict) an untied head is
    taken as unscaled (T5 1.1) and a tied one as scaled by d_model**-0.5 (T5 1.0).
    """
    get = functools.lru_cache(maxsize=None)(lambda name: _to_numpy(state_dict[name]))
    plan = _hf_plan({k: tuple(v.shape) for k, v in state_dict.items()}, get, hf_config)
    return _unflatten({key: _ArrayLeaf(functools.partial(get, hf), get(hf).shape, get(hf).dtype,
                                       tr, scale).read(dtype)
                       for key, (hf, tr, scale) in plan.items()})


def to_hf_t5(params, config: Optional[t5.T5Config] = None) -> Dict[str, np.ndarray]:
    """T5X-named params -> HF T5 state dict of numpy arrays (the inverse of `from_hf_t5`).

    Any subset of the tree maps (e.g. `DecoderOnly` params); a tied model (no `logits_dense`) gets
    no `lm_head.weight` (HF ties it). With `config`, params are validated first. Kernels in
    `layers.transpose_kernels`' layout (a model loaded for decoding on a CPU) are read back in
    T5X's."""
    params = layers.untranspose_kernels(params)
    if config is not None:
        validate_params(params, config)
    out = {}
    for keys, v in _flatten(params).items():
        a, stack = np.asarray(v), keys[0]
        layer = _HF_LAYER.get(stack, {}).get(keys[2]) if len(keys) > 3 else None
        if keys == ("token_embedder", "embedding"):
            out["shared.weight"] = a
        elif keys == ("decoder", "logits_dense", "kernel"):
            out["lm_head.weight"] = a.T
        elif keys[1:] == ("relpos_bias", "rel_embedding"):
            out[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = a.T
        elif keys[1:] == (f"{stack}_norm", "scale"):
            out[f"{stack}.final_layer_norm.weight"] = a
        elif layer and keys[1].startswith("layers_") and (layer[1] is None) == (len(keys) == 4):
            prefix = f"{stack}.block.{keys[1][len('layers_'):]}.layer.{layer[0]}"
            if layer[1] is None:
                out[f"{prefix}.layer_norm.weight"] = a
            else:
                out[f"{prefix}.{layer[1]}.{_ATTN.get(keys[3], keys[3])}.weight"] = a.T
        else:
            raise CheckpointError(f"Parameter {_name(keys)} has no HF T5 counterpart.")
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def config_from_hf(hf_config: Mapping[str, Any], params=None) -> t5.T5Config:
    """An HF T5 `config.json` dict -> `T5Config`, cross-checked against `params` if given.

    `logits_via_embedding` comes from the weights when given (no `decoder/logits_dense`), else
    from `scale_decoder_outputs` / `tie_word_embeddings`.
    """
    get = hf_config.get
    ffp, eps = get("feed_forward_proj", "relu"), get("layer_norm_epsilon", 1e-6)
    if ffp not in _FFP or abs(eps - 1e-6) > 1e-12:
        raise CheckpointError(f"Unsupported HF T5 config: feed_forward_proj={ffp!r} (supported: "
                              f"{sorted(_FFP)}), layer_norm_epsilon={eps} (T5 uses 1e-6).")
    fields = {ours: get(hf, default) for hf, (ours, default) in _HF_FIELDS.items()}
    fields["num_decoder_layers"] = fields["num_decoder_layers"] or fields["num_encoder_layers"]
    heads, d_kv = fields["num_heads"], fields["head_dim"]
    via_embedding = _hf_scaled(hf_config, untied=False)
    if params is not None:
        flat = _flatten(params)
        via_embedding = ("decoder", "logits_dense", "kernel") not in flat
        for key in (("encoder", "layers_0", "attention", "query", "kernel"),
                    ("decoder", "layers_0", "self_attention", "query", "kernel")):
            if key in flat and flat[key].shape[1] != heads * d_kv:
                raise CheckpointError(
                    f"HF config num_heads * d_kv = {heads} * {d_kv} = {heads * d_kv}, but the "
                    f"weight {_name(key)} has {flat[key].shape[1]} columns: fix num_heads or d_kv "
                    "in config.json.")
    return t5.T5Config(**fields, mlp_activations=_FFP[ffp], logits_via_embedding=via_embedding)


def hf_config_dict(config: t5.T5Config) -> Dict[str, Any]:
    """`T5Config` -> HF `config.json` dict (read alike by transformers 4.x and 5.x)."""
    ffp = next((k for k, v in _FFP.items() if v == tuple(config.mlp_activations)), None)
    if ffp is None:
        raise CheckpointError(f"mlp_activations={config.mlp_activations} has no HF equivalent.")
    tied = bool(config.logits_via_embedding)
    return {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
            **{hf: getattr(config, ours) for hf, (ours, _) in _HF_FIELDS.items()},
            "feed_forward_proj": ffp, "layer_norm_epsilon": 1e-6, "is_encoder_decoder": True,
            "pad_token_id": contract.PAD_ID, "eos_token_id": contract.EOS_ID,
            "decoder_start_token_id": contract.BOS_ID, "tie_word_embeddings": tied,
            "scale_decoder_outputs": tied}


def load_hf_config(hf_dir, as_dict: bool = False):
    """An HF dir's `config.json` as a `T5Config` (checked against the weights), or as a dict."""
    path = os.path.join(os.fspath(hf_dir), "config.json")
    with open(path) as f:
        try:
            cfg = json.load(f)
        except ValueError as e:
            raise CheckpointError(f"{path} is not valid JSON ({e}).") from None
    if cfg.get("model_type", "t5") != "t5":
        raise CheckpointError(f"{path}: model_type {cfg.get('model_type')!r} is not 't5'.")
    if as_dict:
        return cfg
    return config_from_hf(cfg, _unflatten(_hf_leaves(os.fspath(hf_dir))[0]))


def _hf_leaves(hf_dir: str):
    """T5X-named leaves over the safetensors of an HF T5 dir, and its config.json dict."""
    if hf_dir.startswith("gs://"):
        raise CheckpointError(f"{hf_dir}: HF directories must be local; copy it first.")
    hf_config = load_hf_config(hf_dir, as_dict=True)
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if not os.path.exists(index) and not os.path.exists(os.path.join(hf_dir, "model.safetensors")):
        raise FileNotFoundError(f"{hf_dir} has no model.safetensors (nor its index); an HF model "
                                "saved as pytorch_model.bin needs save_pretrained again.")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    tensors = {}  # HF name -> (shape, dtype, reader)
    for fname in files:
        path = os.path.join(hf_dir, fname)
        try:
            f = safetensors.safe_open(path, "np")
            for name in f.keys():
                s = f.get_slice(name)
                tensors[name] = (s.get_shape(), _dtype(_ST_DTYPES[s.get_dtype()]),
                                 functools.partial(f.get_tensor, name))
        except Exception as e:  # pylint: disable=broad-except  # SafetensorError, missing file
            raise CheckpointError(f"{path} is not a readable safetensors file ({e}); download "
                                  "or save it again.") from None
    plan = _hf_plan({k: v[0] for k, v in tensors.items()}, lambda k: tensors[k][2](), hf_config)
    return {path: _ArrayLeaf(tensors[hf][2], *tensors[hf][:2], tr, scale, copy=False)
            for path, (hf, tr, scale) in plan.items()}, hf_config


# What an HF model directory holds (weights, their index, configs): what overwrite may replace.
_HF_MODEL_FILE = re.compile(r"(config|generation_config)\.json|model(-[0-9]+-of-[0-9]+)?"
                            r"\.safetensors(\.index\.json)?|pytorch_model(-[0-9]+-of-[0-9]+)?"
                            r"\.bin(\.index\.json)?")


def check_hf_target(hf_dir, overwrite: bool = False, source=None) -> None:
    """Refuses an HF output directory that holds files unless `overwrite` (call it before
    loading anything: conversions of large models take minutes), and always one that is, holds
    or lies inside `source` (the checkpoint being converted: replacing the directory would
    delete it), or holds files an HF model does not (a user's notes: replacing would delete
    them)."""
    hf_dir = os.fspath(hf_dir)
    if source is not None and not os.fspath(source).startswith("gs://"):
        out, src = os.path.realpath(hf_dir), os.path.realpath(os.fspath(source))
        if os.path.commonpath([out, src]) in (out, src):
            raise ValueError(f"--hf_dir {hf_dir} and the source checkpoint {source} overlap: "
                             "writing the HF directory would replace the source. Choose an "
                             "--hf_dir outside it (e.g. a new sibling directory).")
    if os.path.isdir(hf_dir) and os.listdir(hf_dir) and not overwrite:
        raise FileExistsError(f"{hf_dir} already holds {sorted(os.listdir(hf_dir))[:5]}; choose "
                              "an empty directory or pass overwrite=True (--overwrite), which "
                              "replaces the whole directory.")
    foreign = sorted(n for n in os.listdir(hf_dir) if not _HF_MODEL_FILE.fullmatch(n)) \
        if os.path.isdir(hf_dir) else []
    if foreign:  # overwrite replaces the directory whole: never a user's other files
        raise FileExistsError(
            f"{hf_dir} holds {foreign[:5]}, which are not an HF model's files; overwrite "
            "replaces the whole directory, so it refuses one holding anything else. Choose a "
            "new --hf_dir.")


def save_hf_t5(params, config: t5.T5Config, hf_dir, *, overwrite: bool = False,
               source=None) -> str:
    """Writes `model.safetensors` + `config.json` for transformers' T5ForConditionalGeneration.

    A directory that holds files is refused unless `overwrite`, which replaces it whole: files
    of an earlier model (a sharded `model.safetensors.index.json`, which readers would prefer)
    never survive next to the new weights. Written to a staging directory, then swapped in.
    """
    hf_dir = os.path.abspath(os.fspath(hf_dir))
    check_hf_target(hf_dir, overwrite, source)
    tensors = to_hf_t5(params, config)
    staging = f"{hf_dir}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    try:
        safetensors.numpy.save_file(tensors, os.path.join(staging, "model.safetensors"),
                                    metadata={"format": "pt"})
        with open(os.path.join(staging, "config.json"), "w") as f:
            json.dump(hf_config_dict(config), f, indent=2)
        for name in os.listdir(staging):  # readable by others, as any file a user writes
            os.chmod(os.path.join(staging, name), 0o644)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files.replace_directory(staging, hf_dir)
    return hf_dir
