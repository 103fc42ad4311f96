"""`c2jax plan --memory`: XLA memory analysis of the real train step on fake devices, and
the HLO communication-volume parser checked against volumes derived by hand."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from c2jax import config as configlib
from c2jax.plan import hlo_comms, memory, shardings as plan

REPO = pathlib.Path(__file__).resolve().parents[2]

# An HLO module as XLA prints it: an all-reduce inside a while body that runs 5 times,
# an all-gather in the entry, and the three replica_groups spellings.
_HLO = textwrap.dedent("""\
    HloModule jit_f, entry_computation_layout={(f32[2,16]{1,0})->f32[8,16]{1,0}}

    %add (x: f32[], y: f32[]) -> f32[] {
      %x = f32[] parameter(0)
      %y = f32[] parameter(1)
      ROOT %s = f32[] add(%x, %y)
    }

    %body (p: (s32[], bf16[4,8])) -> (s32[], bf16[4,8]) {
      %p = (s32[], bf16[4,8]{1,0}) parameter(0)
      %v = bf16[4,8]{1,0} get-tuple-element(%p), index=1
      %ar = bf16[4,8]{1,0} all-reduce(%v), channel_id=1, replica_groups=mesh['a'=2,'b'=4] {'b'}, to_apply=%add
      ROOT %t = (s32[], bf16[4,8]{1,0}) tuple(%i, %ar)
    }

    %cond (p: (s32[], bf16[4,8])) -> pred[] {
      %p = (s32[], bf16[4,8]{1,0}) parameter(0)
      ROOT %lt = pred[] constant(true)
    }

    ENTRY %main (x: f32[2,16]) -> f32[8,16] {
      %x = f32[2,16]{1,0} parameter(0)
      %init = (s32[], bf16[4,8]{1,0}) tuple(%zero, %w)
      %loop = (s32[], bf16[4,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
      %cp = f32[2,16]{1,0} collective-permute(%x), channel_id=3, source_target_pairs={{0,1},{1,0}}
      %ags = (f32[2,16]{1,0}, f32[8,16]{1,0}) all-gather-start(%x), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}
      %agd = f32[8,16]{1,0} all-gather-done(%ags)
      ROOT %rs = f32[2,16]{1,0} reduce-scatter(%agd), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, to_apply=%add
    }
    """)


def test_parser_counts_loop_trips_async_starts_and_group_spellings():
  volumes = hlo_comms.comm_volume(_HLO)
  ar, ag = volumes["all-reduce"], volumes["all-gather"]
  # bf16[4,8] = 64 bytes, 5 trips, group of 4 ('b'): ring sends 2 * 3/4 * 64 per trip.
  assert (ar.ops, ar.executions, ar.operand_bytes) == (1, 5, 5 * 64)
  assert ar.wire_bytes == pytest.approx(5 * 2 * 0.75 * 64)
  # f32[2,16] = 128 bytes in, f32[8,16] = 512 out, group of 4 ([2,4]<=[8]).
  assert (ag.ops, ag.executions, ag.operand_bytes) == (1, 1, 128)
  assert ag.wire_bytes == pytest.approx(0.75 * 512)
  rs = volumes["reduce-scatter"]  # the gathered 512 bytes, groups listed, 4 each
  assert (rs.operand_bytes, rs.wire_bytes) == (512, pytest.approx(0.75 * 512))
  assert volumes["collective-permute"].wire_bytes == 128
  assert volumes["all-to-all"].executions == 0


# libtpu's compiled HLO has no known_trip_count: a windowed einsum's loop, as it prints
# it (the counter starts at a copied constant and is copied before each step, the
# bound sits on the left, GT).
_TPU_LOOP = textwrap.dedent("""\
    HloModule jit_g

    %wbody (wp: (u32[], bf16[8,32])) -> (u32[], bf16[8,32]) {
      %wp = (u32[], bf16[8,32]{1,0}) parameter(0)
      %i = u32[] get-tuple-element(%wp), index=0
      %v = bf16[8,32]{1,0} get-tuple-element(%wp), index=1
      %cps = (bf16[8,32]{1,0}, bf16[8,32]{1,0}, u32[]) collective-permute-start(%v), channel_id=7, source_target_pairs={{0,1},{1,0}}
      %cpd = bf16[8,32]{1,0} collective-permute-done(%cps)
      %two = u32[] constant(2)
      %icopy = u32[] copy(%i)
      %next = u32[] add(%two, %icopy)
      ROOT %wt = (u32[], bf16[8,32]{1,0}) tuple(%next, %cpd)
    }

    %wcond (cp: (u32[], bf16[8,32])) -> pred[] {
      %cp = (u32[], bf16[8,32]{1,0}) parameter(0)
      %limit = u32[] constant(9)
      %j = u32[] get-tuple-element(%cp), index=0
      ROOT %gt = pred[] compare(%limit, %j), direction=GT
    }

    %dcond (dp: (u32[], bf16[8,32])) -> pred[] {
      %dp = (u32[], bf16[8,32]{1,0}) parameter(0)
      ROOT %flag = pred[] constant(true)
    }

    ENTRY %main (x: bf16[8,32]) -> bf16[8,32] {
      %x = bf16[8,32]{1,0} parameter(0)
      %c1 = u32[] constant(1)
      %start = u32[] copy(%c1)
      %init = (u32[], bf16[8,32]{1,0}) tuple(%start, %x)
      %loop = (u32[], bf16[8,32]{1,0}) while(%init), condition=%wcond, body=%wbody
      %out = bf16[8,32]{1,0} get-tuple-element(%loop), index=1
      %loop2 = (u32[], bf16[8,32]{1,0}) while(%init), condition=%dcond, body=%wbody
      ROOT %y = bf16[8,32]{1,0} get-tuple-element(%loop2), index=1
    }
    """)


# libtpu's reduce-scatter, as its compiled HLO prints it: an all-reduce and the slice of
# this device's part, fused (the head's gradient of `tiny` on v5p-8, fsdp 4).
_TPU_REDUCE_SCATTER = textwrap.dedent("""\
    HloModule jit_train_step

    %add (x: f32[], y: f32[]) -> f32[] {
      %x = f32[] parameter(0)
      %y = f32[] parameter(1)
      ROOT %s = f32[] add(%x, %y)
    }

    %all-reduce-scatter.6 (input.6: f32[64,8192]) -> f32[16,8192] {
      %input.6 = f32[64,8192]{1,0:T(8,128)} parameter(0)
      %all-reduce.129 = f32[64,8192]{1,0:T(8,128)} all-reduce(%input.6), channel_id=103, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
      %partition-id.36 = u32[] partition-id()
      %constant.1079 = u32[] constant(16)
      %multiply.202 = u32[]{:T(128)} multiply(%partition-id.36, %constant.1079)
      %constant.1080 = u32[] constant(0)
      ROOT %dynamic-slice.171 = f32[16,8192]{1,0:T(8,128)} dynamic-slice(%all-reduce.129, %multiply.202, %constant.1080), dynamic_slice_sizes={16,8192}
    }

    ENTRY %main (g: f32[64,8192], l: f32[]) -> (f32[16,8192], f32[]) {
      %g = f32[64,8192]{1,0:T(8,128)} parameter(0)
      %l = f32[]{:T(128)} parameter(1)
      %fusion.6 = f32[16,8192]{1,0:T(8,128)} fusion(%g), kind=kCustom, calls=%all-reduce-scatter.6
      %all-reduce.7 = f32[]{:T(128)} all-reduce(%l), channel_id=104, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
      ROOT %t = (f32[16,8192]{1,0:T(8,128)}, f32[]{:T(128)}) tuple(%fusion.6, %all-reduce.7)
    }
    """)


def test_libtpu_reduce_scatter_fusions_count_as_reduce_scatters():
  """The fused all-reduce + slice moves a reduce-scatter's bytes, (n-1)/n of the summand,
  not an all-reduce's twice that; a plain all-reduce (the loss) stays one."""
  volumes = hlo_comms.comm_volume(_TPU_REDUCE_SCATTER)
  rs, ar = volumes["reduce-scatter"], volumes["all-reduce"]
  summand = 64 * 8192 * 4
  assert (rs.ops, rs.executions, rs.operand_bytes) == (1, 1, summand)
  assert rs.wire_bytes == pytest.approx(0.75 * summand)
  assert (ar.ops, ar.operand_bytes, ar.wire_bytes) == (1, 4, pytest.approx(2 * 0.75 * 4))


# A ragged all-to-all as libtpu prints it (async start and done): operands are the send
# buffer, the receive buffer and four offset arrays; the start returns them and the result.
_TPU_RAGGED = textwrap.dedent("""\
    HloModule jit_r, entry_computation_layout={(bf16[32,2,64]{2,1,0})->bf16[128,2,64]{2,1,0}}

    ENTRY %main (x: bf16[32,2,64], o: s32[4], s: s32[4]) -> bf16[128,2,64] {
      %x = bf16[32,2,64]{2,1,0:T(2,128)(2,1)} parameter(0)
      %o = s32[4]{0:T(128)} parameter(1)
      %s = s32[4]{0:T(128)} parameter(2)
      %zeros = bf16[128,2,64]{2,1,0:T(2,128)(2,1)} broadcast(%c), dimensions={}
      %ragged-all-to-all-start = ((bf16[32,2,64]{2,1,0:T(2,128)(2,1)}, bf16[128,2,64]{2,1,0:T(2,128)(2,1)}, s32[4]{0:T(128)}, s32[4]{0:T(128)}, s32[4]{0:T(128)}, /*index=5*/s32[4]{0:T(128)}), bf16[128,2,64]{2,1,0:T(2,128)(2,1)}, u32[]{:S(2)}) ragged-all-to-all-start(%x, %zeros, %o, %s, %o, /*index=5*/%s), channel_id=7, replica_groups={{0,1,2,3}}
      ROOT %ragged-all-to-all-done = bf16[128,2,64]{2,1,0:T(2,128)(2,1)} ragged-all-to-all-done(%ragged-all-to-all-start)
    }
    """)


def test_ragged_all_to_all_counts_its_send_buffer_not_the_receive_buffer():
  """What may leave the device is the send buffer (8 KB here) and the offsets, not the
  4x larger buffer it receives into; wire bytes: (n-1)/n of that, an upper bound."""
  ragged = hlo_comms.comm_volume(_TPU_RAGGED)["ragged-all-to-all"]
  sent = 32 * 2 * 64 * 2 + 4 * 4 * 4
  assert (ragged.ops, ragged.executions, ragged.operand_bytes) == (1, 1, sent)
  assert ragged.wire_bytes == pytest.approx(0.75 * sent)


def test_loops_without_a_trip_count_are_counted_from_their_condition():
  """i = 1; 9 > i; i += 2: 4 trips of the body's permute. A loop whose condition is not
  of that form (the second, `true`) stays unknown, so its collectives are an error."""
  computations, entry = hlo_comms.parse_module(_TPU_LOOP)
  defs = {ins.name: ins for body in computations.values() for ins in body}
  loops = [ins for ins in computations[entry] if ins.opcode == "while"]
  assert [hlo_comms.counted_loop_trips(loop, computations, defs) for loop in loops] == [
      4, None]
  with pytest.raises(ValueError, match="no known trip count"):
    hlo_comms.comm_volume(_TPU_LOOP)
  counted = _TPU_LOOP.replace("%loop2 = (u32[], bf16[8,32]{1,0}) while(%init), "
                              "condition=%dcond, body=%wbody",
                              "%loop2 = (u32[], bf16[8,32]{1,0}) tuple(%init)")
  permute = hlo_comms.comm_volume(counted)["collective-permute"]
  assert (permute.ops, permute.executions, permute.operand_bytes) == (1, 4, 4 * 512)


def test_parser_rejects_text_without_entry():
  with pytest.raises(ValueError, match="ENTRY"):
    hlo_comms.comm_volume("HloModule m\n")


_SHARD_MAP_PROGRAMS = textwrap.dedent("""\
    import json
    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    from c2jax.plan import hlo_comms

    mesh = jax.make_mesh((4,), ("x",))
    def comms(fn, *shapes):
      sharding = jax.sharding.NamedSharding(mesh, P("x"))
      args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=sharding) for s in shapes]
      text = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                   check_vma=False)).lower(*args).compile().as_text()
      return {k: [v.executions, v.operand_bytes, v.wire_bytes]
              for k, v in hlo_comms.comm_volume(text, 4).items() if v.executions}

    def gather(x):  # local f32[2,16] -> f32[8,16] on every device
      return jax.lax.all_gather(x, "x", tiled=True)[:2] * 2
    def scanned_psum(x):  # a psum of the local f32[2,16] in each of 3 scan steps
      def step(carry, _):
        return jax.lax.psum(carry, "x") * 0.5, None
      return jax.lax.scan(step, x, None, length=3)[0]
    def to_all(x):  # local f32[4,16] exchanged in 4 blocks of 64 bytes
      return jax.lax.all_to_all(x, "x", 0, 0, tiled=True)
    print(json.dumps({"gather": comms(gather, (8, 16)),
                      "scanned_psum": comms(scanned_psum, (8, 16)),
                      "to_all": comms(to_all, (16, 16))}))
    """)


@pytest.fixture(scope="module")
def compiled_programs():
  out = subprocess.run([sys.executable, "-c", _SHARD_MAP_PROGRAMS], cwd=REPO,
                       env=memory.fake_device_env(4, {**os.environ, "PYTHONPATH": str(REPO)}),
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_comm_volume_of_compiled_collectives_matches_hand_derivation(compiled_programs):
  # all-gather: 128 bytes in per device; a ring sends 3/4 of the 512-byte result.
  assert compiled_programs["gather"] == {"all-gather": [1, 128, 384.0]}
  # all-reduce of 128 bytes, once per scan step (the while loop's trip count).
  assert compiled_programs["scanned_psum"] == {"all-reduce": [3, 384, 3 * 2 * 0.75 * 128]}
  # all-to-all of the local 256 bytes: 3/4 leaves the device.
  assert compiled_programs["to_all"] == {"all-to-all": [1, 256, 192.0]}


def _plan(*args):
  """`c2jax plan ARGS --memory --device_memory_gb=0.001`: (its output, its JSON line)."""
  command = [sys.executable, "-m", "c2jax.cli", "plan", *args, "--memory",
             "--device_memory_gb=0.001"]
  out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=400,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout, json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_plan():
  return _plan("--config=configs/pretrain.py:tiny", "--mesh=fsdp=2,expert=2",
               "--config.train.batch_size=4", "--config.train.seq_len=32",
               "--config.model.num_layers=4")


@pytest.mark.slow
def test_memory_plan_reports_sharded_state_and_batch(tiny_plan):
  text, result = tiny_plan
  assert result["devices"] == 4 and result["mesh"]["fsdp"] == 2
  cfg = configlib.load_config_file(REPO / "configs/pretrain.py", "tiny")
  cfg.parallel.mesh.update({"fsdp": 2, "expert": 2})
  cfg.model.num_layers = 4  # 3 MoE layers: a scan XLA keeps as a while loop
  plans = plan.param_plans(cfg.model, cfg.parallel, 4)
  params = sum(p.shard_bytes for p in plans)
  trained = sum(p.shard_bytes for p in plans if "correction_bias" not in p.path)
  # Parameters, Adam's two float32 moments of the trained ones (sharded alike), and 5
  # int32/float32 [4, 32] batch arrays split 4 ways; what is left is scalar counters.
  state = params + 2 * trained
  expected = state + 5 * 4 * 32 * 4 // 4
  mem = result["memory"]
  assert expected <= mem["argument_bytes"] <= expected + 64
  assert mem["alias_bytes"] >= state  # the donated train state is updated in place
  assert mem["temp_bytes"] > 0
  assert mem["total_bytes"] == (mem["argument_bytes"] + mem["output_bytes"]
                                - mem["alias_bytes"] + mem["temp_bytes"]
                                + mem["code_bytes"])
  assert not mem["fits"] and "does NOT fit in 0.001 GB" in text
  # The state by role, in the mixed-precision policy's dtypes (float32 for tiny).
  assert mem["param_bytes"] == params
  assert 2 * trained <= mem["opt_state_bytes"] <= 2 * trained + 16  # + step counters
  assert (mem["param_dtype"], mem["opt_state_dtype"]) == ("float32", "float32")
  assert "of which parameters (float32 masters)" in text
  # FSDP gathers parameters (per layer, inside the scan's while loop) and reduces
  # gradients.
  comms = result["comms"]
  assert comms["all-gather"]["executions"] > comms["all-gather"]["ops"]
  assert comms["all-reduce"]["operand_bytes"] + comms["reduce-scatter"]["operand_bytes"] > 0


def test_mesh_flag_is_checked():
  assert memory.parse_mesh_flag("data=1, fsdp=-1,expert=8") == {"data": 1, "fsdp": -1,
                                                                 "expert": 8}
  with pytest.raises(ValueError, match="AXIS=SIZE"):
    memory.parse_mesh_flag("model=4")
  cfg = configlib.load_config_file(REPO / "configs/pretrain.py", "tiny").parallel.mesh
  with pytest.raises(ValueError, match="--devices"):
    memory.mesh_devices(cfg, None)
  assert memory.mesh_devices(cfg, 8) == 8


@pytest.fixture(scope="module")
def rl_plan():
  return _plan("--config=configs/rl.py:test", "--mesh=fsdp=2,expert=2,context=2",
               "--config.actors.max_length=32", "--config.agent.max_turn_tokens=8",
               "--config.rl.kl.coef=0.01")


@pytest.mark.slow
def test_memory_plan_of_the_rl_learner_step(rl_plan):
  """configs/rl.py (task 'rl'): the RL step on the shared runtime, sharded like
  pretraining, with the KL reference policy and a packed batch as arguments."""
  text, result = rl_plan
  assert "compiled the RL learner step" in text
  assert result["step"] == "RL learner step" and result["devices"] == 8
  cfg = configlib.load_config_file(REPO / "configs/rl.py", "test")
  cfg.parallel.mesh.update({"fsdp": 2, "expert": 2, "context": 2})
  # 1 group x 2 rollouts, rounded up to the 4 batch ways (fsdp x expert).
  assert (result["batch_size"], result["seq_len"]) == (4, 32)
  plans = plan.param_plans(cfg.model, cfg.parallel, 8)
  params = sum(p.shard_bytes for p in plans)
  trained = sum(p.shard_bytes for p in plans if "correction_bias" not in p.path)
  state = params + 2 * trained
  # tokens, valid, loss_mask, sampler_logprobs [4, 32] and router indices [4, 32, Lm, K]
  # split over 4 batch ways x 2 context shards; advantages [4] over the batch ways.
  moe_layers = cfg.model.num_layers - cfg.model.first_k_dense
  batch = (4 * 4 * 32 * 4 + 4 * 32 * moe_layers * cfg.model.moe.num_experts_per_tok * 4) // 8
  expected = state + params + batch + 4  # + the reference policy's parameters
  mem = result["memory"]
  assert expected <= mem["argument_bytes"] <= expected + 64
  assert mem["alias_bytes"] >= state  # the donated learner state is updated in place
  assert mem["param_bytes"] == params
  assert result["comms"]["all-to-all"]["executions"] > 0  # expert parallelism engaged


def test_rl_plan_refuses_roofline():
  command = [sys.executable, "-m", "c2jax.cli", "plan", "--config=configs/rl.py:test",
             "--roofline"]
  out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
  assert out.returncode != 0 and "--memory covers the RL learner" in out.stderr


def test_rl_plan_rows_must_split_over_the_batch_ways():
  command = [sys.executable, "-m", "c2jax.cli", "plan", "--config=configs/rl.py:test",
             "--memory", "--mesh=fsdp=2", "--rl_rows=3"]
  out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
  assert out.returncode != 0
  assert "--rl_rows = 3" in out.stderr and "multiple" in out.stderr
