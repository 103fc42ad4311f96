"""Decode throughput of c2jax.rollout.JaxEngine, with and without MTP speculation, and of
HF `transformers` generate on the same weights.

    python -m tools.bench.decode --variants tiny,small --batches 1,8,32
    python -m tools.bench.decode --hf_python "$C2JAX_TORCH_PYTHON"

Decode tokens/s counts the tokens sampled after every request's prefill (steady-state
decode; compile and prefill excluded: a one-token generate's time is subtracted, for the
engine as for HF; the engine's timings are each the best of 3), greedy by default.
With --drafts D the engine speculates D tokens per step with the model's MTP module; the
table gives tokens per sequence-step (1 + accepted drafts) and the speedup over plain
decoding. --temperature T > 0 samples instead (drafts are then kept by the standard
speculative-sampling rule): a small trained model's greedy output soon repeats a short
loop, which any drafter predicts.

Weights: random (per --variants) by default, where the MTP module accepts almost nothing
and speculation only shows its cost; or a trained run with --checkpoint WORKDIR (a
`c2jax pretrain` workdir, e.g. of configs/mtp.py), whose model config and newest
parameters (MTP module included) are loaded, with prompts cut from the run's held-out
corpus instead of random tokens:
    python -m tools.bench.decode --checkpoint runs/tiny/mtp --batches 1,8

Each row also gives the roofline bound of a decode step at that batch
(c2jax.plan.roofline.decode_step_cost at the mean context, prompt + new_tokens / 2):
the active weights the batch touches plus the KV cache read per step over HBM bandwidth,
or the FLOPs at peak if larger, on the device's datasheet row
(c2jax.plan.accelerators.by_device_kind; this machine as measured where the table has
no row), as tokens/s, and the measured rate as a fraction of it. On a GPU:
    python -m tools.bench.decode --variants moe_8b_a1b --batches 1,8,64 \
        --prompt_len 512 --new_tokens 128
`--smoke` runs tiny at batch 2 for 16 new tokens (the suite runs it).

--mesh 'fsdp=8' (the `c2jax serve --mesh` syntax) shards the engine over this process's
devices (c2jax.rollout.sharding). On a CPU, fake devices only check that it runs; they
share the same cores, so their tokens/s says nothing about multi-device speed:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
      python -m tools.bench.decode --variants tiny --batches 8 --drafts 0 --mesh fsdp=8

The HF side runs this same file by its path under another interpreter (`--hf_worker`),
with only the standard library imported at the top, so it needs no c2jax on its path and
imports decode_peer_workers from its own folder (searched first for a script run by its
path); it runs without PYTHONPATH and outside the checkout (the repo's top-level `kernels`
package shadows an HF one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


REPEATS = 3  # timed generates per length; the best counts


def _engine_rate(cfg, params, prompts_BxP, new_tokens: int, drafts: int,
                 temperature: float, mesh: str = ""):
  """Decode tokens/s as for HF below: (time of a `new_tokens` generate - time of a
  one-token generate) over the batch's new_tokens - 1 further tokens, so prefill (and the
  last token's drain step) cancel and every decode step is timed, whatever the engine's
  tokens per decode call."""
  from c2jax.rollout import JaxEngine, Request, SamplingParams, sharding
  batch, prompt_len = prompts_BxP.shape
  engine = JaxEngine(cfg, params, num_slots=batch, max_length=prompt_len + new_tokens + 8,
                     prefill_buckets=(prompt_len,), num_draft_tokens=drafts,
                     parallel=sharding.parse_mesh(mesh) if mesh else None)

  def timed(count):
    requests = [Request(prompt, SamplingParams(temperature=temperature, max_tokens=count,
                                                seed=row))
                for row, prompt in enumerate(prompts_BxP)]
    start = time.perf_counter()
    generations = engine.generate(requests)
    assert all(len(g.tokens) == count for g in generations), "a generation stopped early"
    return time.perf_counter() - start

  timed(2)  # compile prefill and decode
  engine.acceptance = type(engine.acceptance)()
  # Best of REPEATS each: the difference of two single timings of a few decode steps can
  # come out negative on a loaded machine when the run has few decode steps.
  decode = (min(timed(new_tokens) for _ in range(REPEATS))
            - min(timed(1) for _ in range(REPEATS)))
  if decode <= 0:
    raise RuntimeError(f"decode timing: {new_tokens} tokens took no longer than 1 (best of "
                       f"{REPEATS}); the machine is too busy to time this, or raise "
                       "--new_tokens.")
  return batch * (new_tokens - 1) / decode, engine.acceptance.tokens_per_step


def _random_models(args):
  """(name, cfg, params, prompts(batch)) per variant: random weights, random prompts."""
  import jax
  import numpy as np

  from c2jax import model
  from c2jax.model import variants
  for name in args.variants.split(","):
    cfg = variants.get(name, num_mtp_layers=1)
    params = jax.jit(lambda k, c=cfg: model.init(c, k))(jax.random.key(0))
    yield name, cfg, params, lambda batch, c=cfg: np.random.default_rng(0).integers(
        0, c.vocab_size, (batch, args.prompt_len))


def _trained_model(args):
  """(name, cfg, params, prompts(batch)) of a training workdir: its model config and
  newest parameters, and prompts cut from its held-out corpus."""
  import pathlib

  import jax

  from c2jax import config as configlib
  from c2jax import model
  from c2jax.model import config as model_config
  from c2jax.train import checkpoint as checkpoint_lib
  workdir = pathlib.Path(args.checkpoint).expanduser()
  if not (workdir / "config.json").is_file() or not (workdir / "checkpoints").is_dir():
    raise SystemExit(f"--checkpoint {workdir}: expected a `c2jax pretrain` workdir with "
                     "config.json and checkpoints/ (e.g. runs/tiny/mtp).")
  job = json.loads((workdir / "config.json").read_text())
  cfg = model_config.defaults()
  configlib.apply_overrides(cfg, job["model"])
  model_config.validate(cfg)
  if args.drafts and cfg.num_mtp_layers < 1:
    raise SystemExit(f"--checkpoint {workdir}: the run has no MTP modules "
                     "(model.num_mtp_layers = 0); train them with configs/mtp.py, or pass "
                     "--drafts 0.")
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shapes = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                          shapes)
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", async_save=False)
  if not ckpt.steps():
    raise SystemExit(f"--checkpoint {workdir}: no checkpoint saved yet.")
  step = ckpt.steps()[-1]
  params = ckpt.restore_params(step, abstract)
  ckpt.close()
  print(f"weights: {workdir} step {step}", file=sys.stderr, flush=True)
  yield f"{cfg.name} (trained, step {step})", cfg, params, lambda batch: _heldout_prompts(
      job["data"], batch, args.prompt_len)


def _heldout_prompts(data_fields: dict, batch: int, prompt_len: int):
  """The first prompt_len tokens of `batch` rows of the run's held-out corpus."""
  import numpy as np

  from c2jax import config as configlib
  from c2jax import data
  data_cfg = data.default_config()
  configlib.apply_overrides(data_cfg, data_fields)
  prepared = data.prepare_from_config(data_cfg)
  dataset = data.pretrain_dataset(prepared.corpus(), "heldout", prepared.tokenizer(),
                                  seq_len=prompt_len, batch_size=batch, shuffle=False,
                                  num_epochs=1)
  return np.asarray(next(iter(dataset))["inputs"])


def _accelerator():
  """The roofline's device: the datasheet row of this device kind, else measured here."""
  import jax

  from c2jax.plan import accelerators
  device = jax.devices()[0]
  known = accelerators.by_device_kind(device.device_kind)
  if known is not None:
    return known
  return accelerators.Accelerator(
      f"this {device.platform} (measured)", accelerators.matmul_ceiling(n=512) / 1e12, None,
      accelerators.copy_bandwidth(32 << 20) / 1e12, 0.0, float("inf"))


def _bound_rate(cfg, batch: int, context: int, acc) -> tuple[float, str]:
  """(tokens/s at the roofline's lower bound for one decode step, what bounds it)."""
  from c2jax.plan import roofline
  bound = roofline.bound(roofline.decode_step_cost(cfg, batch, context), acc)
  return batch / bound.lower_s, bound.bound_by


def _run_jax(args) -> list[dict]:
  rows = []
  acc = _accelerator()
  print(f"decode, {time.strftime('%Y-%m-%d', time.gmtime())}, roofline device {acc.name} "
        f"({acc.hbm_tb_s:.3f} TB/s, {acc.bf16_tflops:.3f} TFLOP/s)", file=sys.stderr,
        flush=True)
  models = _trained_model(args) if args.checkpoint else _random_models(args)
  for name, cfg, params, prompts in models:
    for batch in map(int, args.batches.split(",")):
      prompts_BxP = prompts(batch)
      base, _ = _engine_rate(cfg, params, prompts_BxP, args.new_tokens, 0, args.temperature,
                             args.mesh)
      bound, bound_by = _bound_rate(cfg, batch, args.prompt_len + args.new_tokens // 2, acc)
      row = {"variant": name, "batch": batch, "c2jax tok/s": base, "bound tok/s": bound,
             "bound by": bound_by, "of bound": base / bound}
      if args.drafts:
        spec, per_step = _engine_rate(cfg, params, prompts_BxP, args.new_tokens, args.drafts,
                                      args.temperature, args.mesh)
        row.update({"MTP tok/s": spec, "tokens/step": per_step, "speedup": spec / base})
      if args.hf_python:
        row["HF tok/s"] = _hf_rate(args, cfg, params, batch)
      rows.append(row)
      print(json.dumps(row), flush=True)
  return rows


def _hf_rate(args, cfg, params, batch: int) -> float:
  from c2jax import hf
  from c2jax.model import mtp
  main = {k: v for k, v in params.items() if k != mtp.PARAMS_KEY}
  main_cfg = cfg.copy_and_resolve_references()
  main_cfg.num_mtp_layers = 0
  with tempfile.TemporaryDirectory() as tmp:
    hf.save(main_cfg, jax_to_numpy(main), tmp)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [args.hf_python, os.path.abspath(__file__), "--hf_worker", tmp, "--batches",
         str(batch), "--prompt_len", str(args.prompt_len), "--new_tokens",
         str(args.new_tokens)], capture_output=True, text=True, env=env, cwd=tmp, check=True)
  return float(out.stdout.strip().splitlines()[-1])


def jax_to_numpy(tree):
  import jax
  import numpy as np
  return jax.tree.map(np.asarray, tree)


def _hf_worker(args) -> None:
  # Run by path (_hf_rate): this folder is searched first for imports, the checkout root not.
  import decode_peer_workers  # pylint: disable=g-import-not-at-top  (imports no jax at the top)

  batch = int(args.batches)
  timed, _, _ = decode_peer_workers.hf_builder(
      {"hf_dir": args.hf_worker, "batch": batch, "prompt_len": args.prompt_len})
  timed(2)  # warm-up
  # Decode-only: the difference to a one-token generate removes the prefill.
  decode = timed(args.new_tokens) - timed(1)
  print(batch * (args.new_tokens - 1) / decode)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variants", default="tiny,small")
  parser.add_argument("--batches", default="1,8,32")
  parser.add_argument("--prompt_len", type=int, default=16)
  parser.add_argument("--new_tokens", type=int, default=32)
  parser.add_argument("--drafts", type=int, default=1,
                      help="MTP draft tokens per step (0: no speculation)")
  parser.add_argument("--temperature", type=float, default=0.0,
                      help="sampling temperature (0: greedy); the HF side is always greedy")
  parser.add_argument("--checkpoint", default="",
                      help="a training workdir: benchmark its trained weights (MTP included) "
                      "on held-out prompts instead of random --variants")
  parser.add_argument("--hf_python", default="",
                      help="interpreter with torch + transformers for the HF comparison")
  parser.add_argument("--mesh", default="",
                      help="shard the engine over local devices, e.g. fsdp=8 (default: one)")
  parser.add_argument("--hf_worker", default="", help=argparse.SUPPRESS)
  parser.add_argument("--smoke", action="store_true",
                      help="tiny, batch 2, 8-token prompts, 16 new tokens")
  args = parser.parse_args(argv)
  if args.hf_worker:
    _hf_worker(args)
    return
  from c2jax import host_memory
  # As `c2jax` does at start-up (C2JAX_RETAIN_FREED_MEMORY=0 measures without it).
  host_memory.retain_freed_memory()
  if args.smoke:
    # 16 tokens: the rate is a difference of two timings, which 3 decode steps (~1 ms
    # at tiny) could turn negative under a loaded test run.
    args.variants, args.batches, args.prompt_len, args.new_tokens = "tiny", "2", 8, 16
  import jax
  device = jax.devices()[0]
  print(f"decode throughput, {time.strftime('%Y-%m-%d', time.gmtime())}, {device.platform} "
        f"({device.device_kind}), jax {jax.__version__}")
  rows = _run_jax(args)
  columns = list(dict.fromkeys(k for row in rows for k in row))
  print("| " + " | ".join(columns) + " |")
  print("|" + "---|" * len(columns))
  for row in rows:
    print("| " + " | ".join(f"{row[c]:.2f}" if isinstance(row.get(c), float)
                            else str(row.get(c, "")) for c in columns) + " |")


if __name__ == "__main__":
  sys.exit(main())
