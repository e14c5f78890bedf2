"""The runs on a mesh of 8 host CPU devices: scripts' models, caches and inputs sharded, and the
same greedy tokens and statistics as on one device.

Runs in a subprocess because the device count must be set before jax initialises.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from speculative.runs import config as config_lib

OUTPUT = "mini_ende-predict.jsonl-00000-of-00001"  # T5X's name of infer's output file

SCRIPT = textwrap.dedent(r"""
    import json, os, sys, warnings
    import jax, numpy as np
    from speculative import decoding, partitioning
    from speculative.models import t5
    from speculative.runs import benchmark, config as config_lib, infer
    from speculative import loading
    assert jax.device_count() == 8, jax.devices()
    out, infer_gin, bench_gin, tiny_gin = sys.argv[1:5]
    infer_meshes = [None if m is None else tuple(m) for m in json.loads(sys.argv[5])]

    def infer_run(mesh):
        config_lib.parse_gin([infer_gin, tiny_gin], [
            "TARGET_MODEL = @tiny_target/t5.T5Config()", "DRAFT_MODEL = @tiny_draft/t5.T5Config()",
            "TARGET_CHECKPOINT = None", "DRAFT_CHECKPOINT = None",
            "MIXTURE_OR_TASK_NAME = 'mini_ende'",
            "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 8}",
            f"INFER_OUTPUT_DIR = {os.path.join(out, 'infer_' + str(mesh))!r}",
            "NUM_EXAMPLES = 6", "BATCH_SIZE = 2", "GAMMA = 3", "infer.infer.progress = False",
            f"MESH_SHAPE = {mesh!r}"])
        return infer.infer()

    report = {"infer": {}, "benchmark": {}}
    for mesh in [None] + infer_meshes:
        result = infer_run(mesh)
        report["infer"][str(mesh)] = [
            {k: r[k] for k in ("prediction_tokens", "generated", "target_calls", "draft_calls",
                               "drafted", "accepted", "tested", "beta_sum")}
            for r in result.records]

    # Per-device shapes: target weights split over 'model', the draft replicated, and the KV
    # caches with batch over 'data' and heads over 'model' inside the jitted init.
    settings = infer.infer(dry_run=True)
    settings = settings.__class__(**{**settings.__dict__, "mesh_shape": (2, 4)})
    target, draft = infer.load_models(settings)
    cfg = settings.target_config
    q = target.params["decoder"]["layers_0"]["self_attention"]["query"]["kernel"]
    dq = draft.params["decoder"]["layers_0"]["self_attention"]["query"]["kernel"]
    inputs = partitioning.shard_batch(np.full((2, 16), 5, np.int32), target.mesh)
    cache = jax.jit(target.init, static_argnums=2)(target.params, inputs, 12)
    k = cache.self_kv[0][0]
    report["shapes"] = {
        "query": [list(q.shape), list(q.sharding.shard_shape(q.shape))],
        "draft_query": [list(dq.shape), list(dq.sharding.shard_shape(dq.shape))],
        "cache": [list(k.shape), list(k.sharding.shard_shape(k.shape))],
        "heads": cfg.num_heads, "head_dim": cfg.head_dim, "emb": cfg.emb_dim}

    for mesh in (None, (2, 4)):
        config_lib.parse_gin([bench_gin, tiny_gin], [
            "TARGET_MODEL = @tiny_target/t5.T5Config()", "DRAFT_MODEL = @tiny_draft/t5.T5Config()",
            "TARGET_CHECKPOINT = None", "DRAFT_CHECKPOINT = None",
            f"OUTPUT_DIR = {os.path.join(out, 'bench_' + str(mesh))!r}", "GAMMAS = [2]",
            "BATCH_SIZES = [4]", "TEMPERATURES = [0.0]", "MAX_DECODE_LEN = 8",
            "INPUT_LENGTH = 8", "REPEATS = 1", "CALIBRATION_BATCHES = 0",
            "benchmark.run.cost_steps = 1", f"MESH_SHAPE = {mesh!r}"])
        runs = benchmark.run()["runs"]
        report["benchmark"][str(mesh)] = [
            {k: r[k] for k in ("alpha", "tokens_per_target_call", "baseline_tokens",
                               "speculative_tokens", "accepted_per_position")} for r in runs]

    # A checkpoint read straight into its sharding: every device's block is read on its own
    # (never the whole array), and the values equal an unsharded load.
    from speculative import checkpoints
    ckpt = checkpoints.save_t5x(jax.device_get(target.params), os.path.join(out, "ckpt"), step=1)
    blocks = []
    read = checkpoints._TsLeaf.read
    def spy(self, dtype=None, index=None):
        if self.name.endswith("decoder/layers_0/self_attention/query/kernel"):
            blocks.append(None if index is None else [[s.start, s.stop] for s in index])
        return read(self, dtype, index)
    checkpoints._TsLeaf.read = spy
    loaded = loading.load_model(cfg, ckpt, mesh=target.mesh)
    checkpoints._TsLeaf.read = read
    lq = loaded.params["decoder"]["layers_0"]["self_attention"]["query"]["kernel"]
    whole = checkpoints.load_params(ckpt)
    same = all(np.array_equal(np.asarray(a), b) for a, b in zip(
        jax.tree_util.tree_leaves(loaded.params), jax.tree_util.tree_leaves(whole)))
    report["checkpoint"] = {"same": bool(same), "blocks": blocks,
                            "spec": str(lq.sharding.spec), "mesh": loaded.mesh is target.mesh}

    # A rule that does not divide a dimension: replicated with a warning naming it, or refused.
    odd = t5.Transformer(t5.T5Config(vocab_size=32, emb_dim=12, num_heads=3, head_dim=6,
                                     mlp_dim=16, num_encoder_layers=1, num_decoder_layers=1))
    params = t5.init_params(odd, jax.random.PRNGKey(0))
    mesh = partitioning.make_mesh(mesh_shape=(2, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        placed = partitioning.shard_params(params, odd, mesh)
    report["warnings"] = [str(w.message) for w in caught]
    try:
        partitioning.shard_params(params, odd, mesh, strict=True)
        report["strict"] = None
    except ValueError as e:
        report["strict"] = str(e)
    oq = placed["decoder"]["layers_0"]["self_attention"]["query"]["kernel"]
    report["odd_query"] = list(oq.sharding.shard_shape(oq.shape))
    print("REPORT" + json.dumps(report))
""")

TINY = ("from __gin__ import dynamic_registration\nfrom speculative.models import t5\n" + "".join(
    f"{scope}/t5.T5Config:\n  vocab_size = 4000\n  emb_dim = 32\n  num_heads = 8\n"
    f"  head_dim = 4\n  mlp_dim = 64\n  num_encoder_layers = {n}\n  num_decoder_layers = {n}\n"
    "  relative_attention_num_buckets = 8\n  relative_attention_max_distance = 16\n"
    for scope, n in (("tiny_target", 2), ("tiny_draft", 1))))


def _report(tmp_path, infer_meshes):
    """SCRIPT's report, with infer run on one device and on each of `infer_meshes`."""
    gin_path = tmp_path / "tiny.gin"
    gin_path.write_text(TINY)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    runs = os.path.join(config_lib.REPO_ROOT, "configs", "runs")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), os.path.join(runs, "infer.gin"),
         os.path.join(runs, "benchmark.gin"), str(gin_path), json.dumps(infer_meshes)],
        env=env, capture_output=True, text=True, timeout=600, cwd=config_lib.REPO_ROOT)
    line = [x for x in proc.stdout.splitlines() if x.startswith("REPORT")]
    assert line, proc.stderr[-4000:]
    return json.loads(line[0][len("REPORT"):])


@pytest.mark.slow  # the same script again, with a third infer run: ~80 s
def test_infer_on_a_1x8_mesh_matches_one_device(tmp_path):
    """Pure model parallelism (every weight split 8 ways, the batch not split) decodes the same
    tokens with the same statistics as one device."""
    report = _report(tmp_path, [[1, 8]])
    one = report["infer"]["None"]
    assert len(one) == 6 and report["infer"]["(1, 8)"] == one


@pytest.mark.slow  # ~50 s: both scripts end to end on 8 devices
def test_infer_and_benchmark_on_a_2x4_mesh_match_one_device(tmp_path):
    report = _report(tmp_path, [[2, 4]])
    one = report["infer"]["None"]
    assert len(one) == 6 and all(r["prediction_tokens"] for r in one)
    assert report["infer"]["(2, 4)"] == one
    assert report["benchmark"]["(2, 4)"] == report["benchmark"]["None"]

    shapes = report["shapes"]
    emb, hd = shapes["emb"], shapes["heads"] * shapes["head_dim"]
    assert shapes["query"] == [[emb, hd], [emb, hd // 4]]  # joined_kv over 'model' (4)
    assert shapes["draft_query"] == [[emb, hd], [emb, hd]]  # the draft is replicated
    batch, heads, length, dim = shapes["cache"][0]  # head-major [B, H, L, D]
    assert heads == shapes["heads"] and dim == shapes["head_dim"]
    assert shapes["cache"][1] == [batch // 2, heads // 4, length, dim]

    ck = report["checkpoint"]
    assert ck["same"] and ck["mesh"] and ck["spec"] == "P(None, 'model')"
    blocks = {tuple(map(tuple, b)) for b in ck["blocks"]}  # 4 column blocks of the query kernel
    assert blocks == {((None, None), (i * hd // 4, (i + 1) * hd // 4)) for i in range(4)}, blocks

    assert report["warnings"] and all("does not divide over mesh axis 'model'" in w
                                      for w in report["warnings"])
    assert any("self_attention/query/kernel: dimension 1 of size 18" in w
               for w in report["warnings"]), report["warnings"]
    assert report["strict"] and "size 18" in report["strict"]
    assert report["odd_query"] == [12, 18]  # 3 heads x 6 over 4 devices: replicated


def _free_port() -> int:
    import socket  # pylint: disable=g-import-not-at-top

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # three processes start jax and compile: ~30 s
def test_two_processes_split_a_batch_and_write_what_one_process_writes(tmp_path):
    """scripts/infer.py as a 2-process job on localhost (jax.distributed, gloo collectives, 2
    CPU devices each, a 2x2 mesh: each process holds one row of every batch) writes, from
    process 0 only, exactly the predictions and statistics of a one-device run."""
    gin_path = tmp_path / "tiny.gin"
    gin_path.write_text(TINY)
    runs = os.path.join(config_lib.REPO_ROOT, "configs", "runs")
    script = os.path.join(config_lib.REPO_ROOT, "scripts", "infer.py")
    bindings = ["TARGET_MODEL = @tiny_target/t5.T5Config()",
                "DRAFT_MODEL = @tiny_draft/t5.T5Config()", "TARGET_CHECKPOINT = None",
                "DRAFT_CHECKPOINT = None", "MIXTURE_OR_TASK_NAME = 'mini_ende'",
                "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 8}", "NUM_EXAMPLES = 4",
                "BATCH_SIZE = 2", "GAMMA = 3", "infer.infer.progress = False"]

    def cmd(out, extra=()):
        return ([sys.executable, script, f"--gin_file={os.path.join(runs, 'infer.gin')}",
                 f"--gin_file={gin_path}"]
                + [f"--gin_bindings={b}" for b in bindings + [f"INFER_OUTPUT_DIR = '{out}'"]]
                + list(extra))

    base_env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    one = subprocess.run(cmd(tmp_path / "one"), env=base_env, capture_output=True, text=True,
                         timeout=600, cwd=config_lib.REPO_ROOT)
    assert one.returncode == 0, one.stderr[-3000:]

    port = _free_port()
    env = dict(base_env, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    procs = [subprocess.Popen(
        cmd(tmp_path / "two", ["--gin_bindings=MESH_SHAPE = (2, 2)",
                               f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                               f"--process_id={i}"]),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=config_lib.REPO_ROOT) for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]

    def read(run):
        records = [json.loads(line) for line in (tmp_path / run / OUTPUT)
                   .read_text().splitlines()]
        metrics = json.loads((tmp_path / run / "metrics.json").read_text())
        return records, metrics["decoding"], metrics["metrics"]

    assert read("two") == read("one")
    assert sorted(os.listdir(tmp_path)) == ["one", "tiny.gin", "two"]  # process 1 wrote nothing
