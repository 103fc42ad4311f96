"""`c2jax plan --target=<TPU slice>`: topology names, the Pallas kernels through Mosaic, and
the tiny train step compiled by the real TPU compiler for compile-only v5p devices (GPU
targets: test_plan_gpu_target.py)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.plan import shardings as plan
from c2jax.plan import topologies
from tools.compile import ep_exchange
from tools.compile import kernels as compile_kernels

pytest.importorskip("libtpu", reason='the TPU compiler: pip install -e ".[tpu-compile]"')

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name, chips, grid, accel", [
    ("v5p-8", 4, (2, 2, 1), "TPU v5p"),
    ("v5p-16", 8, (2, 2, 2), "TPU v5p"),
    ("v5p-128", 64, (4, 4, 4), "TPU v5p"),
    ("v5p-1024", 512, (8, 8, 8), "TPU v5p"),
    ("v4-8", 4, (2, 2, 1), "TPU v4"),
    ("v5e-16", 16, (4, 4), "TPU v5e"),
    ("v5litepod-8", 8, (2, 4), "TPU v5e"),
    ("v6e-256", 256, (16, 16), "TPU v6e"),
])
def test_cloud_names_give_cloud_slice_shapes(name, chips, grid, accel):
  target = topologies.parse_target(name)
  assert (target.chips, target.grid, target.accelerator.name) == (chips, grid, accel)


@pytest.mark.parametrize("name", ["v5p-6", "v5p-4", "v7x-8", "h100", "v6e-3"])
def test_bad_names_say_what_is_expected(name):
  with pytest.raises(ValueError, match=r"e\.g\. v"):
    topologies.parse_target(name)


def test_multislice_devices_carry_their_slice(v5p_devices):
  assert len(v5p_devices) == 8 and v5p_devices[0].platform == "tpu"
  assert sorted({d.slice_index for d in v5p_devices}) == [0, 1]


def test_tpu_granules_are_slices_not_hosts(v5p_devices):
  """A v5p-16 slice spans two hosts on one ICI torus: one granule, a plain mesh; two
  v5p-8 slices are two granules, joined over the data-like axes."""
  from c2jax.parallel import mesh as mesh_lib

  one_slice = topologies.parse_target("v5p-16").devices()
  assert len({d.process_index for d in one_slice}) == 2
  assert mesh_lib.num_granules(one_slice) == (1, False)
  assert mesh_lib.num_granules(v5p_devices) == (2, False)
  mesh = mesh_lib.make_mesh({"data": 1, "fsdp": -1, "expert": 2, "context": 1,
                             "tensor": 1}, v5p_devices)
  assert dict(mesh.shape)["fsdp"] == 4
  # fsdp spans the slices: its two halves lie in different slices
  fsdp_slices = {d.slice_index for d in mesh.devices[0, :, 0, 0, 0]}
  assert fsdp_slices == {0, 1}


# The suite's persistent cache looks the program up first; an executable for compile-only
# devices cannot be loaded from it (no client), which JAX reports and then compiles.
@pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry")
def test_grouped_matmul_kernels_compile_through_mosaic(v5p_devices):
  """Forward, input-gradient and weight-gradient megablox kernels, picked by the mesh's
  platform (not the CPU process's), compile as Mosaic custom calls."""
  # (The block-scaled recipe runs the same three kernels on dequantised operands; its
  # fake-quantisation compiles slowly, so tools/compile/kernels.py covers it.)
  result = compile_kernels.compile_one(v5p_devices, "grouped", compile_kernels.SHAPES["tiny"],
                                       jnp.bfloat16)
  assert result["mosaic_calls"] == 3, result
  assert result["cost_model_s"] > 0 and result["temp_bytes"] > 0


@pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry")
def test_tokamax_gmm_v2_compiles_through_mosaic(v5p_devices):
  """impl='tokamax' on TPU: tokamax's gmm_v2 for the forward, input gradient and weight
  gradient (which needs the local group count passed in), each a Mosaic call."""
  result = compile_kernels.compile_one(v5p_devices, "grouped:tokamax",
                                       compile_kernels.SHAPES["small"], jnp.bfloat16)
  assert result["mosaic_calls"] == 3, result
  assert result["cost_model_s"] > 0 and result["temp_bytes"] > 0


def test_tokamax_on_tpu_refuses_rows_narrower_than_a_dma(v5p_devices):
  with pytest.raises(ValueError, match="at least 512 bytes.*impl='megablox'"):
    compile_kernels.compile_one(v5p_devices, "grouped:tokamax",
                                compile_kernels.SHAPES["tiny"], jnp.bfloat16)


@pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry")
def test_tokamax_lm_head_loss_runs_per_token_shard_through_mosaic(v5p_devices):
  """train.loss_impl='tokamax' on four v5p chips with the batch over 'fsdp': the loss and
  its backward are tokamax's Mosaic kernels, one call each, run per token shard inside
  shard_map (XLA cannot partition a Mosaic call)."""
  import flax.linen as nn

  from c2jax.model import token_logprobs
  from c2jax.plan import target as target_lib
  mesh = jax.sharding.Mesh(np.asarray(v5p_devices[:4]), ("fsdp",))
  spec = lambda *axes: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))
  args = (jax.ShapeDtypeStruct((4, 256, 256), jnp.bfloat16, sharding=spec("fsdp")),
          jax.ShapeDtypeStruct((256, 1024), jnp.float32, sharding=spec()),
          jax.ShapeDtypeStruct((4, 256), jnp.int32, sharding=spec("fsdp")))
  loss = lambda h, w, y: token_logprobs.library_nll(h, w, y).sum()
  with jax.set_mesh(mesh), nn.logical_axis_rules([("batch", "fsdp"), ("length", None)]):
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args).compile()
  assert target_lib.mosaic_calls(compiled.as_text()) == 2


def test_tokamax_lm_head_loss_is_right_in_tpu_interpret_mode(v5p_devices):
  """Its TPU kernel in Pallas' TPU interpreter, rows padded to its 1,024-row block (1,000
  here): loss and both gradients against the full-logits loss; the hidden state's
  gradient comes back in bfloat16, as the hidden state."""
  from jax.experimental.pallas import tpu as pltpu
  import optax

  from c2jax_kernels import lm_head_loss
  keys = jax.random.split(jax.random.key(0), 3)
  h = jax.random.normal(keys[0], (1000, 256), jnp.bfloat16)
  w = jax.random.normal(keys[1], (256, 1024), jnp.float32) / 4
  y = jax.random.randint(keys[2], (1000,), 0, 1024)
  weights = jnp.arange(1000) / 1000

  def value_and_grads(fn):
    return jax.value_and_grad(lambda h, w: jnp.sum(fn(h, w) * weights), argnums=(0, 1))(h, w)

  want = value_and_grads(lambda h, w: optax.softmax_cross_entropy_with_integer_labels(
      jnp.dot(h, w.astype(h.dtype), preferred_element_type=jnp.float32), y))
  abstract = jax.sharding.Mesh(np.asarray(v5p_devices[:1]), ("x",)).abstract_mesh
  with jax.sharding.use_abstract_mesh(abstract), pltpu.force_tpu_interpret_mode():
    got = value_and_grads(lambda h, w: lm_head_loss.linear_cross_entropy(h, w, y))
  rel = lambda a, b: float(jnp.linalg.norm(jnp.float32(a) - jnp.float32(b))
                           / jnp.linalg.norm(jnp.float32(b)))
  assert rel(got[0], want[0]) < 1e-6
  assert got[1][0].dtype == jnp.bfloat16 and rel(got[1][0], want[1][0]) < 1e-2
  assert got[1][1].dtype == jnp.float32 and rel(got[1][1], want[1][1]) < 1e-3
  with pytest.raises(ValueError, match="multiple of 128; model.vocab_size is 1000"):
    with jax.sharding.use_abstract_mesh(abstract):
      lm_head_loss.linear_cross_entropy(h, w[:, :1000], y)
  # On a GPU its chunked XLA loss would count DeepSeek-V3's padded columns.
  with pytest.raises(ValueError, match="multiple of 2048; model.vocab_size is 129280"):
    lm_head_loss.check_vocab(129280, "gpu")
  lm_head_loss.check_vocab(163840, "gpu")


@pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry")
def test_ragged_ep_exchange_compiles_for_tpu_and_moves_less_than_fixed_buckets(capsys):
  """A dropless expert-parallel MoE layer (forward and backward) on v5p-8, expert 4: the
  ragged exchange compiles to ragged all-to-alls that send less than the fixed
  worst-case buckets' all-to-alls, and the compiler sees fewer bytes accessed."""
  ep_exchange.main(["--shape=tiny", "--target=v5p-8", "--expert=4", "--seq_len=256",
                    "--exchanges=ragged:0,fixed:0"])
  ragged, fixed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
  assert (ragged["exchange"], fixed["exchange"]) == ("ragged", "fixed")
  sent = ragged["collective_operand_bytes"]
  assert sent["ragged-all-to-all"] > 0
  assert sent.get("all-to-all", 0) < 1024  # offsets only: no token rows in fixed buckets
  assert sent["ragged-all-to-all"] < fixed["collective_operand_bytes"]["all-to-all"]
  assert 0 < ragged["bytes_accessed"] < fixed["bytes_accessed"]
  assert ragged["cost_model_seconds"] > 0


@pytest.mark.slow
def test_a_time_estimate_that_is_not_positive_is_reported_as_none_with_the_reason():
  """The TPU cost model has no estimate for gathers/scatters it offloads to the SparseCore
  and then returns a negative `optimal_seconds` (seen for Kimi-K2.5's expert-parallel
  step): the report says so instead of printing a negative time and MFU."""
  from c2jax.plan import target as target_lib

  hlo = """  %gather.1071 = s32[1024]{0:T(1024)} gather(%param_0.89, %transpose.1259)
  ROOT %scatter_offload_custom_fusion.63 = s32[9]{0:T(128)} fusion(%p0, %p1), kind=kCustom
  %gather_offload_custom_fusion.42 = s32[1280]{0:T(1024)} fusion(%p2, %p3), kind=kCustom
  %fusion.7 = f32[8]{0} fusion(%gather_offload_custom_fusion.42), kind=kLoop
"""
  assert target_lib.offloaded_ops(hlo) == 2
  seconds, note = target_lib.time_estimate({"optimal_seconds": -0.5844}, hlo)
  assert seconds is None
  assert "-584.400 ms" in note and "2 gather/scatter op(s) offloaded" in note
  assert target_lib.time_estimate({"optimal_seconds": 0.0123}, hlo) == (0.0123, "")
  assert target_lib.time_estimate({"optimal_seconds": 0.0}, "")[0] is None
  assert target_lib.time_estimate(None, hlo)[0] is None


def test_the_cost_compile_unrolls_the_layers_and_the_losses_vocabulary_loops():
  from c2jax.plan import target as target_lib
  from configs import pretrain

  cfg = pretrain.get_config("small")  # 8 layers, vocabulary 16,384, chunks of 4,096
  cost = target_lib.cost_config(cfg)
  assert cost.model.scan_unroll == cfg.model.num_layers
  assert cost.train.loss_vocab_chunk == cost.train.mtp_vocab_chunk == cfg.model.vocab_size
  assert cfg.model.scan_unroll == 1 and cfg.train.loss_vocab_chunk == 4096  # untouched
  engine = target_lib.cost_config(cfg, losses=False)
  assert engine.train.loss_vocab_chunk == 4096 and engine.model.scan_unroll == 8
  cfg.model.scan_unroll, cfg.train.loss_vocab_chunk = 8, 0  # 0: the full-logits path
  cfg.train.mtp_vocab_chunk = cfg.model.vocab_size
  assert target_lib.cost_config(cfg) is None  # nothing to unroll: one compile
  # Blockwise tiles are a loop too: costed dense on request, as configured otherwise.
  cfg.model.attention_impl = "blockwise"
  assert target_lib.cost_config(cfg) is None
  dense = target_lib.cost_config(cfg, attention="dense")
  assert dense.model.attention_impl == "dense" and cfg.model.attention_impl == "blockwise"
  cfg.model.attention_impl = "dense"
  assert target_lib.cost_config(cfg, attention="dense") is None
  with pytest.raises(ValueError, match="cost attention 'flash'"):
    target_lib.cost_config(cfg, attention="flash")


def test_a_report_without_its_cost_compile_says_why():
  """--notarget_cost: memory and collectives only; the text names the flag, not a
  compiler without a cost model."""
  from c2jax.plan import target as target_lib

  memory = dict(argument_bytes=1e9, output_bytes=1e9, alias_bytes=1e9, temp_bytes=2e9,
                code_bytes=1e8, total_bytes=3.1e9)
  report = dict(step="train step", compile_seconds=1.0, memory=memory, fits=True,
                mosaic_calls=0, mfu_estimate=None, flops=None, model_flops=1e12)
  text = target_lib.format_report(report, topologies.parse_target("v5p-8"))
  assert "no cost analysis (--notarget_cost: no cost compile)" in text


@pytest.mark.slow
def test_plan_memory_target_v5p8_tiny():
  """The tiny train step for v5p-8 with expert and context parallelism (expert=2,
  context=2; dropless, so tokens travel by ragged all-to-all): the JSON fields; a positive time estimate with no op offloaded to the
  SparseCore (a boolean all-reduce over the split length, the router's gather and the EP
  dispatch's bincount once made the cost model return a negative time); per-device
  arguments that are the sharding plan's parameter and optimizer shards plus the batch
  shard, up to the TPU's tile padding of small arrays."""
  env = dict(os.environ, PYTHONPATH=str(REPO))
  layers = 2  # tiny's; unrolled already, so the cost compile is the only compile
  # moe_impl='pallas': the megablox kernels through Mosaic inside the sharded step (each
  # token shard's rows in a shard_map: XLA cannot partition a Mosaic call).
  args = ["--config=configs/pretrain.py:tiny", "--memory", "--target=v5p-8",
          f"--config.model.scan_unroll={layers}", "--config.train.batch_size=8",
          "--config.train.seq_len=64", "--config.model.moe_impl=pallas",
          "--config.parallel.mesh.expert=2", "--config.parallel.mesh.context=2",
          "--config.train.loss_vocab_chunk=8192",  # one chunk: no loop left to unroll
          "--target_cost_attention=dense"]  # tiny attends dense already: still one compile
  result = subprocess.run([sys.executable, "-m", "c2jax.cli", "plan", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout.strip().splitlines()[-1])
  for key in ("target", "device_kind", "memory", "fits", "flops", "cost_model_seconds",
              "mfu_estimate", "collectives"):
    assert key in out, key
  assert (out["target"], out["device_kind"], out["devices"]) == ("v5p-8", "TPU v5", 4)
  mesh = out["mesh"]
  assert (mesh["fsdp"], mesh["expert"], mesh["context"], out["fits"]) == (1, 2, 2, True)
  assert out["flops"] > 0 and 0 < out["cost_model_seconds"] < 1
  assert 0 < out["mfu_estimate"] < 1 and out["sparsecore_offloads"] == 0
  assert out["cost_attention"] == "dense"
  assert out["collectives"]["all-gather"]["executions"] > 0  # sharded params are gathered
  # Dropless expert parallelism on a TPU exchanges tokens with ragged all-to-alls.
  assert out["collectives"]["ragged-all-to-all"]["executions"] >= 2
  assert out["mosaic_calls"] >= 3  # megablox forward and both gradients, through Mosaic

  from configs import pretrain

  cfg = pretrain.get_config("tiny")
  cfg.parallel.mesh.update(expert=2, context=2)
  summary = plan.summarize(plan.param_plans(cfg.model, cfg.parallel, 4))
  mem = out["memory"]
  assert mem["param_bytes"] == summary["param_bytes_per_device"]
  assert mem["param_bytes"] < summary["param_bytes_total"] / 2  # sharded, not copied
  batch_shard = 5 * (8 // 2) * (64 // 2) * 4  # five 4-byte [B, L] fields: B/fsdp, L/CP
  exact = mem["param_bytes"] + mem["opt_state_bytes"] + batch_shard
  assert exact <= mem["argument_bytes"] <= 1.5 * exact
  assert "compiler estimate" in result.stdout
  assert "moe_impl pallas" in result.stdout


@pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry")
def test_tokamax_attention_compiles_through_mosaic_per_shard(v5p_devices):
  """model.attention_impl='tokamax': tokamax's flash attention, forward and backward, for
  MLA's heads (q/k 192, v 128 as they are) with a packed-documents mask, batch split over
  four v5p chips: its Mosaic kernels run per shard (a Mosaic call cannot be partitioned)."""
  import flax.linen as nn
  from c2jax.model import fused_attention as fused
  from c2jax_kernels import platform as kernel_platform

  if not kernel_platform.library_installed():
    pytest.skip("tokamax: pip install -e '.[kernels]'")
  mesh = jax.sharding.Mesh(np.asarray(v5p_devices[:4]), ("fsdp",))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  shape = lambda *dims, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(dims, dtype, sharding=rows)

  def loss(q, k, v, segments):
    mask = fused.document_mask(segments, segments)
    out = fused.library_attention(q, k, v, mask, causal=True, scale=192 ** -0.5)
    return out.astype(jnp.float32).sum()

  with jax.set_mesh(mesh), nn.logical_axis_rules((("batch", "fsdp"),)):
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
        shape(4, 256, 2, 192), shape(4, 256, 2, 192), shape(4, 256, 2, 128),
        shape(4, 256, dtype=jnp.int32)).compile()
  text = compiled.as_text()
  assert text.count('custom_call_target="tpu_custom_call"') >= 2  # forward and backward
