"""The one model factory: from configuration to a `DecodeModel`, optionally on a mesh.

    target = load_model(T5Config(...), checkpoint="/ckpts/t5_1_1_xxl/checkpoint_1000000")
    draft = load_model(T5Config(...), checkpoint=None, seed=1)    # random weights (tests, timing)
    mesh = partitioning.make_mesh(mesh_shape=(2, 4))
    target = load_model(config, checkpoint, mesh=mesh)            # sharded by T5X's rules
    draft = build_model("bigram.npz", name="draft", mesh=mesh)    # an n-gram draft, replicated

Every run (infer, benchmark, alpha, Table 2, the mini results and the demo), the trainer and the
notebook build their models through these names, so a new draft kind is one branch in
`build_model` (speculative/data/model_specs.py, where the factory lives) plus a test.

A checkpoint path is anything `checkpoints.load_params` accepts (T5X legacy or Orbax dir, step
dir, msgpack file, HF directory); its tree is validated against the config before use, so a
mismatched checkpoint fails with the list of wrong parameters rather than deep inside jit.
With a mesh, T5 parameters are placed by `rules` (a checkpoint is read block by block
straight into that layout: `checkpoints.load_params(shardings=...)`) (T5X's
`standard_logical_axis_rules` for a
target, `partitioning.replicated_rules()` for a draft by default) and the model's decode state
is pinned to batch over 'data' and heads over 'model' inside the jitted loops.
"""

from __future__ import annotations

from speculative.checkpoints.factory import load_model as load_model  # (re-exported)
from speculative.data.bundles import PROMPT_LOOKUP as PROMPT_LOOKUP
from speculative.data.bundles import Bundled as Bundled
from speculative.data.bundles import bundled as bundled
from speculative.data.bundles import bundled_names as bundled_names
from speculative.data.model_specs import build_draft as build_draft
from speculative.data.model_specs import build_model as build_model
from speculative.data.model_specs import check_same_vocab as check_same_vocab
from speculative.data.model_specs import describe_model as describe_model
from speculative.data.model_specs import is_decode_model as is_decode_model
from speculative.data.model_specs import source as source
from speculative.models.adapters import as_decode_model as as_decode_model  # (re-exported)
from speculative.models.adapters import make_module as make_module
