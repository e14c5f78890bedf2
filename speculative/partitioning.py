"""Meshes, T5X logical-axis rules, and shardings for parameters and decode inputs.

T5X annotates every parameter with logical axis names (`('embed', 'joined_kv')`, ...) and maps
them to mesh axes with `standard_logical_axis_rules` (t5x/partitioning.py). We do the same with
flax's logical partitioning, so a checkpoint laid out for T5X's `PjitPartitioner(num_partitions=N)`
shards the same way here:

    mesh = partitioning.make_mesh(num_partitions=4)             # ('data', 'model') = (n/4, 4)
    params = partitioning.shard_params(params, module, mesh)    # model-parallel weights
    inputs = partitioning.shard_batch(inputs, mesh)             # batch over 'data'
    result = decoding.speculative_decode(target, draft, inputs, ...)   # jit follows the shardings

The decode loops need no change: `jax.jit` propagates the input shardings through the loop, and
the per-row caches inherit the batch sharding of the inputs.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from speculative.models import t5

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


def make_mesh(num_partitions: int = 1, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """A ('data', 'model') mesh: `num_partitions` devices per model replica, the rest data."""
    devices = list(jax.devices() if devices is None else devices)
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


def _fits(spec: PartitionSpec, shape, mesh: Mesh) -> PartitionSpec:
    """Drops a mesh axis from a dimension it does not divide (e.g. 6 heads over 4 devices)."""
    out = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        out.append(axis if axis is None or dim % mesh.shape[axis] == 0 else None)
    return PartitionSpec(*out)


def shard_params(params: Any, module: nn.Module, mesh: Mesh,
                 rules: Optional[LogicalRules] = None) -> Any:
    """Places `params` on `mesh` following T5X's logical rules.

    A dimension that the mesh axis does not divide is replicated instead (T5X would refuse);
    this keeps odd head counts usable on small meshes.
    """
    specs = param_partition_specs(module, rules)
    return jax.tree_util.tree_map(
        lambda x, spec: jax.device_put(x, NamedSharding(mesh, _fits(spec, x.shape, mesh))),
        params, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def shard_batch(array: Any, mesh: Mesh) -> jax.Array:
    """Splits the leading (batch) axis of `array` over the mesh's 'data' axis."""
    array = np.asarray(array) if not isinstance(array, jax.Array) else array
    if array.shape[0] % mesh.shape["data"]:
        raise ValueError(
            f"Batch size {array.shape[0]} is not divisible by the mesh's data axis "
            f"({mesh.shape['data']} devices); pad the batch or use more model partitions.")
    spec = PartitionSpec("data", *([None] * (array.ndim - 1)))
    return jax.device_put(array, NamedSharding(mesh, spec))
