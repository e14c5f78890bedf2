"""Meshes, T5X logical-axis rules, and shardings for parameters and decode inputs.

T5X annotates every parameter with logical axis names (`('embed', 'joined_kv')`, ...) and maps
them to mesh axes with `standard_logical_axis_rules` (t5x/partitioning.py). We do the same with
flax's logical partitioning, so a checkpoint laid out for T5X's `PjitPartitioner(num_partitions=N)`
shards the same way here:

    mesh = partitioning.make_mesh(num_partitions=4)             # ('data', 'model') = (n/4, 4)
    params = partitioning.shard_params(params, module, mesh)    # model-parallel weights
    inputs = partitioning.shard_batch(inputs, mesh)             # batch over 'data'
    result = decoding.speculative_decode(target, draft, inputs, ...)   # jit follows the shardings

Runs take a mesh from gin (`MESH_SHAPE = (data, model)`) and build their models through
`loading.load_model(..., mesh=mesh)`, which places the parameters with `shard_params` and
gives the model the mesh: its KV caches are then pinned inside the jitted loops to batch over
'data' and heads over 'model' (`cache_spec`), so the verify forward runs model-parallel with
every step's cache where its heads are. A draft is replicated by default (`replicated_rules`: a
tiny model gains nothing from splitting its matrices; its batch still splits over 'data').

A rule that does not divide a dimension (6 heads over 4 devices) replicates that dimension and
warns, naming the parameter, the axis and the sizes; `strict=True` refuses instead.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from speculative.models import layers, t5

LogicalRules = Sequence[Tuple[str, Optional[str]]]


def standard_logical_axis_rules(activation_partitioning_dims: int = 1,
                                parameter_partitioning_dims: int = 1) -> LogicalRules:
    """T5X's `standard_logical_axis_rules` (t5x/partitioning.py) for 1-D or 2-D sharding.

    1-D (the default): vocab, mlp, heads and joined_kv are split over 'model'; embed is
    replicated; batch is split over 'data'. 2-D parameters additionally split embed over 'data'.
    """
    if activation_partitioning_dims not in (1, 2) or parameter_partitioning_dims not in (1, 2):
        raise ValueError(
            f"partitioning dims must be 1 or 2; got activation={activation_partitioning_dims}, "
            f"parameter={parameter_partitioning_dims}.")
    rules = [
        ("batch", "data"),
        ("vocab", "model"),
        ("mlp", "model"),
        ("heads", "model"),
        ("kv", None),
        ("joined_kv", "model"),
        ("relpos_buckets", None),
        ("abspos_buckets", None),
        ("length", None),
        ("layers", None),
        ("stack", None),
        ("mlp_activations", None),
    ]
    if parameter_partitioning_dims == 2:
        rules.append(("embed", "data"))
    elif activation_partitioning_dims == 2:
        rules.append(("embed", "model"))
    else:
        rules.append(("embed", None))
    return rules


def replicated_rules() -> LogicalRules:
    """Every parameter replicated, batch over 'data': the layout of a small draft."""
    return [(name, "data" if name == "batch" else None)
            for name, _ in standard_logical_axis_rules()]


def make_mesh(num_partitions: int = 1, devices: Optional[Sequence[jax.Device]] = None, *,
              mesh_shape: Optional[Sequence[int]] = None) -> Mesh:
    """A ('data', 'model') mesh: `num_partitions` devices per model replica, the rest data; or,
    with `mesh_shape = (data, model)`, exactly that grid of the first data * model devices
    (T5X's explicit mesh; `data = -1` takes all the devices left)."""
    devices = list(jax.devices() if devices is None else devices)
    if mesh_shape is not None:
        shape = tuple(mesh_shape)
        if (len(shape) != 2 or not all(isinstance(d, int) and not isinstance(d, bool)
                                         for d in shape) or shape[1] < 1
                or (shape[0] < 1 and shape[0] != -1)):
            raise ValueError(f"mesh_shape={mesh_shape!r} is invalid: give (data, model) as two "
                             "ints >= 1 (data may be -1: all the devices left), e.g. (2, 4).")
        data, model = shape
        if data == -1:
            data = len(devices) // model
        if data < 1 or data * model > len(devices):
            raise ValueError(
                f"mesh_shape={mesh_shape!r} needs {max(data, 1) * model} devices but "
                f"{len(devices)} are available; use a smaller mesh (e.g. (1, {len(devices)})) "
                "or more devices (on CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N).")
        return Mesh(np.asarray(devices[:data * model]).reshape(data, model), ("data", "model"))
    if num_partitions < 1 or len(devices) % num_partitions:
        raise ValueError(
            f"num_partitions={num_partitions} must divide the {len(devices)} available devices; "
            f"choose one of {[d for d in range(1, len(devices) + 1) if len(devices) % d == 0]}.")
    grid = np.asarray(devices).reshape(len(devices) // num_partitions, num_partitions)
    return Mesh(grid, ("data", "model"))


def param_partition_specs(module: nn.Module,
                          rules: Optional[LogicalRules] = None) -> Any:
    """`PartitionSpec` of every parameter of `module`, from its logical axes and `rules`."""
    rules = standard_logical_axis_rules() if rules is None else rules
    axes = t5.param_axes(module)
    return jax.tree_util.tree_map(
        lambda names: nn.logical_to_mesh_axes(names, rules), axes,
        is_leaf=lambda x: isinstance(x, tuple))


def fit_spec(spec: PartitionSpec, shape, mesh: Mesh, name: str = "array",
             strict: bool = False) -> PartitionSpec:
    """`spec` for an array of `shape`, with a mesh axis that does not divide its dimension
    dropped (that dimension replicated) and a warning naming `name`, the dimension and the
    axis; `strict=True` raises a ValueError instead."""
    out = []
    for i, (dim, axis) in enumerate(zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)))):
        if axis is not None and dim % mesh.shape[axis]:
            message = (f"{name}: dimension {i} of size {dim} does not divide over mesh axis "
                       f"{axis!r} of size {mesh.shape[axis]}")
            if strict:
                raise ValueError(f"{message}; choose a mesh whose {axis!r} size divides {dim}, "
                                 "or map the logical axis to None in the rules.")
            warnings.warn(f"{message}: that dimension is replicated.", stacklevel=3)
            axis = None
        out.append(axis)
    return PartitionSpec(*out)


def param_shardings(module: nn.Module, mesh: Mesh, rules: Optional[LogicalRules] = None,
                    strict: bool = False) -> Any:
    """`NamedSharding` of every parameter of `module` on `mesh` (`fit_spec` for dimensions the
    mesh does not divide), computed from shapes alone: what `checkpoints.load_params` needs to
    read a checkpoint straight into its layout."""
    return jax.tree_util.tree_map_with_path(
        lambda path, spec, x: NamedSharding(mesh, fit_spec(
            spec, x.shape, mesh, "/".join(str(getattr(k, "key", k)) for k in path), strict)),
        param_partition_specs(module, rules), t5.param_shapes(module),
        is_leaf=lambda x: isinstance(x, PartitionSpec))


def shard_params(params: Any, module: nn.Module, mesh: Mesh,
                 rules: Optional[LogicalRules] = None, strict: bool = False) -> Any:
    """Places `params` on `mesh` following T5X's logical rules (`fit_spec` for dimensions
    that the mesh does not divide)."""
    return jax.tree_util.tree_map(put, params, param_shardings(module, mesh, rules, strict))


def put(x: Any, sharding: NamedSharding) -> jax.Array:
    """`x` placed with `sharding`; across processes (a mesh spanning hosts) each process
    places the blocks of its own devices from its copy of `x` (identical everywhere)."""
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def cache_spec(shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """Decode-state layout: batch (axis 0) over 'data' and, for `[B, H, L, D]` key/value
    caches, heads (axis 1) over 'model'; an axis that does not divide is left replicated (the
    warning, if any, came with the parameters: heads are split like the attention kernels)."""
    spec = [None] * len(shape)
    if len(shape) and shape[0] % mesh.shape["data"] == 0:
        spec[0] = "data"
    if len(shape) == 4 and shape[1] % mesh.shape["model"] == 0:
        spec[1] = "model"
    return PartitionSpec(*spec)


def constrain_state(state: Any, mesh: Mesh) -> Any:
    """Pins every array of a decode state (`t5.DecodeCache`) to `cache_spec` (inside jit)."""
    return jax.tree_util.tree_map(
        lambda x: jax.lax.with_sharding_constraint(
            x, NamedSharding(mesh, cache_spec(x.shape, mesh))), state)


def place_model(model: Any, mesh: Mesh, rules: Optional[LogicalRules] = None,
                strict: bool = False) -> Any:
    """A `DecodeModel` on `mesh`: a T5 model's parameters sharded by `rules` (T5X's standard
    rules by default) and its decode state pinned to `cache_spec`; any other model (n-gram
    drafts) replicated. A T5 model's kernels are sharded in T5X's layout, which the rules
    name (a model loaded for a CPU holds them transposed: `layers.transpose_kernels`)."""
    if isinstance(getattr(model, "module", None), (t5.Transformer, t5.DecoderOnly)):  # T5's
        # adapters (models/adapters.py, which imports this module) hold a T5 network
        params = layers.untranspose_kernels(model.params)
        return dataclasses.replace(
            model, params=shard_params(params, model.module, mesh, rules, strict), mesh=mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    return model.replace(params=jax.tree_util.tree_map(lambda x: put(x, replicated),
                                                       model.params))


def shard_batch(array: Any, mesh: Mesh) -> jax.Array:
    """Splits the leading (batch) axis of `array` over the mesh's 'data' axis."""
    array = np.asarray(array) if not isinstance(array, jax.Array) else array
    if array.shape[0] % mesh.shape["data"]:
        raise ValueError(
            f"Batch size {array.shape[0]} is not divisible by the mesh's data axis "
            f"({mesh.shape['data']} devices); pad the batch or use more model partitions.")
    spec = PartitionSpec("data", *([None] * (array.ndim - 1)))
    sharding = NamedSharding(mesh, spec)
    # In a multi-process job every process holds the same global batch and places only the
    # rows of its own devices.
    return put(array, sharding)
