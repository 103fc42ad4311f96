"""`c2jax plan --target=<TPU slice>` for an RL run's actors: one actor's engine planned on
its own mesh with the fleet line, and tools/compile/actor_weights' table of engine bytes
by weights_quant, compiled by the real TPU compiler for compile-only v5p devices (the
train step's plan: test_plan_target.py)."""

import pathlib

import jax
import pytest

from c2jax.plan import shardings as plan
from c2jax.plan import topologies

pytest.importorskip("libtpu", reason='the TPU compiler: pip install -e ".[tpu-compile]"')

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry")
@pytest.mark.slow
def test_the_actor_engine_is_planned_on_its_own_mesh_with_the_fleet_line(v5p_devices, capsys):
  """An RL config plans one actor's engine (actors.parallel: fsdp=2, on 2 of v5p-8's 4
  chips) with its slots x actors.max_length cache: prefill and decode through the TPU
  compiler, the bytes the engine holds per device, tokens/s per chip and the fleet line
  against a learner step of 1 ms."""
  from c2jax import config as configlib
  from c2jax import model
  from c2jax.commands import plan_target
  from c2jax.plan import fleet

  del v5p_devices  # libtpu loaded; _plan_actors takes its devices from the target
  v5p8 = topologies.parse_target("v5p-8")
  cfg = configlib.load_config_file(REPO / "configs/rl.py", "test")
  cfg.model.scan_unroll = cfg.model.num_layers  # unrolled already: one compile a program
  cfg.actors.parallel.mesh.fsdp, cfg.actors.slots, cfg.actors.max_length = 2, 2, 64
  out = plan_target._plan_actors(cfg, v5p8, {"cost_model_seconds": 1e-3}, costed=True,
                                 cost_attention="as_configured")
  assert (out["chips"], out["mesh"]["fsdp"], out["slots"], out["max_length"]) == (2, 2, 2, 64)
  plans = plan.param_plans(cfg.model, cfg.actors.parallel, 2)
  assert out["weights_bytes"] == sum(p.shard_bytes for p in plans)
  experts = out["weight_groups"]["routed experts"]
  assert experts["bytes_per_device"] * 2 == experts["bytes"]  # split over fsdp=2
  assert out["weights_dtypes"] == ["float32"]
  cache = jax.eval_shape(lambda: model.init_cache(cfg.model, 2, 64))
  cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
  assert out["cache_bytes"] == cache_bytes // 2  # the slots split over fsdp
  for name in ("prefill", "decode"):
    assert out[name]["fits"] and out[name]["cost_model_seconds"] > 0, out[name]
  assert out["decode"]["loops_costed_once"] >= 1  # the token loop at least: one step
  assert out["decode_step_seconds"] == out["decode"]["cost_model_seconds"]
  assert out["tokens_per_s_per_chip"] == pytest.approx(2 / out["decode_step_seconds"] / 2)
  expected = fleet.fleet(
      fleet.RolloutShape.of(cfg), learner_step_s=1e-3, rollouts_per_step=1 * 2,
      actor=fleet.ActorSpeed(slots=2, chips=2, decode_step_s=out["decode_step_seconds"],
                             prefill_tokens=64,
                             prefill_s=out["prefill"]["cost_model_seconds"]),
      max_lag=cfg.rl.queue.max_lag)
  assert out["fleet"]["meshes"] == expected.meshes >= 1
  assert out["fleet"]["max_lag"] == 3 and out["fleet"]["rollout_tokens"] == 64
  text = capsys.readouterr().out
  assert "actor engine on v5p-8" in text and "on 2 of its 4 chips" in text
  assert expected.line() in text and "actor engine weights " in text
  # The routed experts held int4 (actors.weights_quant): an eighth of float32's bytes
  # plus a float32 scale per 32 values, still split over fsdp (the int4 engine's
  # compile: test_actor_weights_table_counts_quantised_experts).
  from c2jax.plan import target as target_lib
  placement = target_lib.actor_placement(cfg, v5p8.devices())
  held = target_lib.engine_state_bytes(cfg.model, placement, slots=2, max_length=64,
                                       weights_quant="int4")["weight_groups"]["routed experts"]
  assert held["dtypes"] == ["float32", "int4"]
  assert held["bytes"] == experts["bytes"] // 8 + experts["bytes"] // 4 // 32 * 4
  assert held["bytes_per_device"] * 2 == held["bytes"]
  # A mesh that cannot split the slots names the key.
  cfg.actors.slots = 3
  with pytest.raises(SystemExit, match="actors.parallel.mesh"):
    plan_target._plan_actors(cfg, v5p8, {"cost_model_seconds": 1e-3}, costed=True,
                             cost_attention="as_configured")


def test_actor_weights_reports_a_program_the_compiler_cannot_fit():
  from tools.compile import actor_weights

  # The TPU compiler's words (libtpu 0.0.50.1, DeepSeek-V3 fp8 on v5p-32).
  error = RuntimeError(
      "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total "
      "memory required for HLO temporaries (109.14G) exceeds available HBM (95.73G). HLO "
      "module: jit_prefill_chunk.\nSee https://openxla.org/xla/errors/error_1000 for more.")
  assert actor_weights._out_of_memory(error) == (  # pylint: disable=protected-access
      "jit_prefill_chunk needs 109.14 GB of temporaries, 95.73 GB available")
  assert actor_weights._out_of_memory(ValueError("shapes")) is None  # pylint: disable=protected-access


@pytest.mark.slow
def test_actor_weights_table_counts_quantised_experts(v5p_devices, capsys):
  """tools/compile/actor_weights: per-chip engine bytes by weights_quant on a v5p actor
  mesh; the experts shrink by the formats' bytes per value (plus their scales); with
  --compile the TPU compiler takes the int4 engine (the dequantising grouped matmul in
  its prefill and decode) and it fits."""
  from tools.compile import actor_weights

  del v5p_devices
  got = {r["weights_quant"]: r for r in actor_weights.rows(
      ["tiny"], [actor_weights.parse_actor("v5p-8:expert=4")], ["none", "fp8", "int4"],
      dtype="bfloat16", slots=8, max_length=64)}
  assert got["none"]["chips"] == 4 and got["none"]["mesh"] == {"expert": 4}
  none, fp8, int4 = (got[q]["experts_gb"] for q in ("none", "fp8", "int4"))
  assert int4 < fp8 < none and fp8 == pytest.approx(none / 2, rel=0.01)
  assert int4 == pytest.approx(none * (0.5 + 4 / 32) / 2, rel=1e-6)
  assert got["int4"]["cache_gb"] == got["none"]["cache_gb"] > 0
  actor_weights.main(["--models", "tiny", "--actors", "v5p-8:expert=4", "--slots", "8",
                      "--max_length", "640", "--quant", "int4", "--compile"])
  text = capsys.readouterr().out
  assert "| tiny | v5p-8 (4, {'expert': 4}) | int4 |" in text
  assert text.rstrip().endswith("GB, fits, no estimate |"), text  # --cost gives the time
