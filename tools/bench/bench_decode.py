"""Decode throughput of c2jax.rollout.JaxEngine, with and without MTP speculation, and of
HF `transformers` generate on the same weights.

    PYTHONPATH=. python tools/bench/bench_decode.py --variants tiny,small --batches 1,8,32
    PYTHONPATH=. python tools/bench/bench_decode.py --hf_python /work/venvs/py311/bin/python

Decode tokens/s counts the tokens sampled after every request's prefill (steady-state
decode; compile and prefill excluded), greedy, random weights. With --drafts D the engine
speculates D tokens per step with the model's MTP module; the table gives tokens per
sequence-step (1 + accepted drafts) and the speedup over plain decoding. Random MTP
weights accept almost nothing, so on an untrained model speculation only shows its cost.

The HF side runs this same file under another interpreter (`--hf_worker`), with only the
standard library imported at the top, so it needs no c2jax on its path: run it without
PYTHONPATH set to this repo (the repo's top-level `kernels` package shadows an HF one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _engine_rate(cfg, params, batch: int, prompt_len: int, new_tokens: int, drafts: int):
  import numpy as np

  from c2jax.rollout import JaxEngine, Request, SamplingParams
  engine = JaxEngine(cfg, params, num_slots=batch, max_length=prompt_len + new_tokens + 8,
                     prefill_buckets=(prompt_len,), num_draft_tokens=drafts)
  rng = np.random.default_rng(0)
  requests = [Request(rng.integers(0, cfg.vocab_size, prompt_len),
                      SamplingParams(temperature=0.0, max_tokens=new_tokens))
              for _ in range(batch)]
  engine.generate(requests[:1])  # compile prefill and decode
  engine.acceptance = type(engine.acceptance)()
  ids = [engine.submit(r) for r in requests]
  done = {g.seq_id: g for g in engine.step()}  # admits every request (prefill)
  sampled_before = batch  # each prefill sampled one token
  start = time.perf_counter()
  while len(done) < len(ids):
    done.update({g.seq_id: g for g in engine.step()})
  elapsed = time.perf_counter() - start
  total = sum(len(g.tokens) for g in done.values())
  return (total - sampled_before) / elapsed, engine.acceptance.tokens_per_step


def _run_jax(args) -> list[dict]:
  import jax

  from c2jax import model
  from c2jax.model import mtp, variants
  rows = []
  for name in args.variants.split(","):
    cfg = variants.get(name, num_mtp_layers=1)
    params = jax.jit(lambda k, c=cfg: model.init(c, k))(jax.random.key(0))
    params[mtp.PARAMS_KEY] = jax.jit(lambda k, c=cfg: mtp.init(c, k))(jax.random.key(1))
    for batch in map(int, args.batches.split(",")):
      base, _ = _engine_rate(cfg, params, batch, args.prompt_len, args.new_tokens, 0)
      row = {"variant": name, "batch": batch, "c2jax tok/s": base}
      if args.drafts:
        spec, per_step = _engine_rate(cfg, params, batch, args.prompt_len, args.new_tokens,
                                      args.drafts)
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
  import torch
  from transformers import AutoModelForCausalLM
  torch.manual_seed(0)
  hf_model = AutoModelForCausalLM.from_pretrained(args.hf_worker, torch_dtype=torch.float32)
  hf_model.eval()
  batch = int(args.batches)
  vocab = hf_model.config.vocab_size
  inputs = torch.randint(0, vocab, (batch, args.prompt_len))

  def timed(new):
    start = time.perf_counter()
    with torch.no_grad():
      hf_model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False,
                        max_new_tokens=new, min_new_tokens=new, use_cache=True,
                        pad_token_id=0)
    return time.perf_counter() - start

  timed(2)  # warm-up
  # Decode-only: the difference to a one-token generate removes the prefill.
  decode = timed(args.new_tokens) - timed(1)
  print(batch * (args.new_tokens - 1) / decode)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variants", default="tiny,small")
  parser.add_argument("--batches", default="1,8,32")
  parser.add_argument("--prompt_len", type=int, default=16)
  parser.add_argument("--new_tokens", type=int, default=32)
  parser.add_argument("--drafts", type=int, default=1,
                      help="MTP draft tokens per step (0: no speculation)")
  parser.add_argument("--hf_python", default="",
                      help="interpreter with torch + transformers for the HF comparison")
  parser.add_argument("--hf_worker", default="", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.hf_worker:
    _hf_worker(args)
    return
  rows = _run_jax(args)
  columns = list(dict.fromkeys(k for row in rows for k in row))
  print("| " + " | ".join(columns) + " |")
  print("|" + "---|" * len(columns))
  for row in rows:
    print("| " + " | ".join(f"{row[c]:.2f}" if isinstance(row.get(c), float)
                            else str(row.get(c, "")) for c in columns) + " |")


if __name__ == "__main__":
  sys.exit(main())
