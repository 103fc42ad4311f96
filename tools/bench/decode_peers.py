"""Decode and prefill of c2jax's JaxEngine against the JAX peers on the same shapes, side
by side: Tunix's sampler (google-tunix, Qwen3 family), MaxText's MaxEngine (DeepSeek-V3
family) and, as a second column, HF `generate` (torch eager); each peer in its own
virtualenv with the same jax/jaxlib/flax.

    python -m tools.bench.decode_peers \
        --tunix_python $TUNIX_VENV/bin/python --hf_python $TORCH_VENV/bin/python \
        --models qwen3_tiny,qwen3_small,qwen3_moe_tiny,qwen3_moe_small --batches 1,8,32
    python -m tools.bench.decode_peers --tunix_python ... \
        --models qwen3_small --batches 1 --prompt_lens 512,4096 --method split --warmup none
    python -m tools.bench.decode_peers --tunix_python ... --tunix_logprobs \
        --c2jax_no_logprobs --models qwen3_tiny,qwen3_moe_tiny --repeats 3   # median of 3
    python -m tools.bench.decode_peers --maxtext_python $MAXTEXT_VENV/bin/python \
        --models deepseek_v3_tiny,deepseek_v3_small --batches 1,8,32
    python -m tools.bench.decode_peers --smoke   # no peer needed

$TUNIX_VENV: a Python 3.12 venv with `pip install google-tunix==0.1.7 jax==0.12.0.1
jaxlib==0.12.0.1 flax==0.12.12` (c2jax's pins); $MAXTEXT_VENV: a Python 3.12 venv with
`pip install "maxtext[tpu]==0.2.5"` (the one tools/compile/vs_maxtext.py uses; it
brings jax 0.12.0.1); $TORCH_VENV: one with torch and transformers
(tools/fixtures/make_hf_fixtures.py's).

MaxText runs at its fastest CPU settings: layers unrolled (`scan_layers=false`), MLA with
the absorbed, compressed KV cache (`mla_naive_kvcache=false use_mla_absorbed_mqa=true`),
dot-product attention, float32 as c2jax's variants, and both MoE paths as two columns:
`maxtext` (`sparse_matmul=false`: every expert on every token) and `maxtext_sparse`
(`sparse_matmul=true megablox=false`: sorted tokens, `ragged_dot`). Its MaxEngine is
driven as its own `decode.py` drives it: a prefill and an insert per row, then one
`generate` call per token. Without JetStream installed, MaxText's stand-in `ResultTokens`
is not a pytree and its jitted prefill cannot return it; the worker registers it.

Method (the same for every side): random weights of the same shapes and parameter count,
random prompts of --prompt_lens tokens (16 by default), greedy, --new_tokens new tokens
(64); a side's decode rate is batch * (new_tokens - 1) / (t(new_tokens) - t(1)), where
t(n) is the wall time of one whole generate call for n new tokens, so prefill and compile
drop out; each t is the best of --rounds (or, --stat median, their median), and the
rounds interleave the sides (c2jax, then each peer, per round) so the machine's load falls
on all alike. Before each timed call the machine idles --settle_s (0.2 s) and the side
makes an untimed call of the same length (--warmup same): without the idle, a side timed
right after another process's call ran beside that process's still-spinning threads
(measured 2026-11-28 at `qwen3_small` batch 1: c2jax's prefill 595 tokens/s alone, 174
with the Tunix workers beside it); without a full-length warm-up, the timed call runs in
the slow state that follows an idle spell on this VM, which lasts longer than a one-token
call (measured 2026-12-02 at `qwen3_tiny` batch 8, one process, median of 15: c2jax's
64-token call after 0.2 s idle and a one-token call decoded at 8.5-10.1k tokens/s, after
a 64-token warm-up at 16.9-17.4k, back to back at 18.2-19.4k; Tunix's at 8.7-9.7k after
the one-token call, 10.5-15.4k back to back). Before 2026-12-02 the warm-up was one token
(--warmup one), so those rows timed both sides in that slow state. Prefill tokens/s
is batch * prompt_len / t(1) (a one-token generate: the prefill, one sampled token).
With --method split (for long prompts) each call's prefill and its decode from the
prefilled cache are timed apart: with a 4,096-token prompt t(1) and t(64) both hold a
prefill of seconds against about one second of decode between them, so a few percent of
prefill noise moved the decode rate by tens of percent (runs of the same command gave
0.71x, 2.17x and 0.82x, 2026-12-03). Each side prefills the prompts and samples the
first token (timed: p), then decodes the rest from that cache (timed: d): c2jax's engine
keeps the sequences alive and extends each by its first token (a multi-turn call),
Tunix's sampler runs its prefill program and then its decode program, MaxText runs its
prefill + insert per row and then its generate calls; the HF side has no split. Decode
tokens/s is batch * (n - 2) / (d(n) - d(2)), prefill tokens/s batch * prompt_len / p
over both calls. The prefill before each decode keeps the machine busy, so --warmup none
is the usual setting there.
Compare ratios from one run, not rates across runs. A process's memory layout moves a tiny
model's rates by up to ~30% from one process to the next (the same program, measured
2026-11-28), which interleaving cannot remove: --repeats N runs everything N times in
fresh processes and reports the median ratio. Where a side's t(1) is long beside its
decode (Tunix's one-token call at `qwen3_tiny` takes ~14 ms, its 63 decode steps ~7 ms)
the best of a few rounds is decided by the rare fast round of either call: on a shared
2-core VM (2026-12-02) Tunix's best-of-15 decode rate at batch 1 came out at 6,531 and
31,212 tokens/s in two runs a minute apart, its median-of-15 at 8,065 and 6,557. There,
--stat median with 15 rounds or more is the steadier figure.

Every peer is a persistent worker process, tools/bench/decode_peer_workers.py run by the
peer's interpreter (it needs no c2jax on its path): it builds a model from the JSON shape
the driver sends and answers timing requests over its stdin / stdout, one JSON object a
line.

Models (c2jax variant table, c2jax/model/variants.py, plus the MoE rows' overrides):
  qwen3_tiny / qwen3_small        dense Qwen3 (GQA + q/k norm, dense MLP every layer)
  qwen3_moe_tiny / qwen3_moe_small  the same attention, every layer MoE, softmax top-2,
                                  renormalised (Tunix's Qwen3-MoE always renormalises)
  deepseek_v3_tiny / _small       c2jax's `tiny` / `small` (MLA, first layer dense, then
                                  sigmoid-routed top-2 + a shared expert): MaxText's
                                  `deepseek3-tiny` with these dimensions as overrides
A peer times only the family it implements (Tunix: Qwen3; MaxText: DeepSeek-V3; HF: all).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODELS = {
    "qwen3_tiny": ("qwen3_tiny", {}),
    "qwen3_small": ("qwen3_small", {}),
    "qwen3_moe_tiny": ("qwen3_tiny", dict(
        first_k_dense=0, moe=dict(num_experts=8, num_experts_per_tok=2, num_shared_experts=0,
                                  intermediate_size=32, router="softmax",
                                  norm_topk_prob=True))),
    "qwen3_moe_small": ("qwen3_small", dict(
        first_k_dense=0, moe=dict(num_experts=16, num_experts_per_tok=2,
                                  num_shared_experts=0, intermediate_size=256,
                                  router="softmax", norm_topk_prob=True))),
    "deepseek_v3_tiny": ("tiny", {}),
    "deepseek_v3_small": ("small", {}),
}
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode_peer_workers.py")
# "tunix_logprobs": Tunix's sampler asked for each token's log-prob (return_logprobs),
# the work c2jax's engine does by default (RL needs them); "tunix" does not compute them
# (c2jax_nolp, --c2jax_no_logprobs, is c2jax's like-for-like side for it).
PEERS = ("tunix", "tunix_logprobs", "maxtext", "maxtext_sparse", "hf")
# The model family each peer implements (None: every family).
PEER_FAMILY = {"tunix": "qwen3", "tunix_logprobs": "qwen3", "maxtext": "deepseek_v3",
               "maxtext_sparse": "deepseek_v3", "hf": None}


def peers_for(name: str) -> list[str]:
  """The peers that implement model `name`'s family."""
  family = "deepseek_v3" if name.startswith("deepseek_v3") else "qwen3"
  return [peer for peer in PEERS if PEER_FAMILY[peer] in (None, family)]


# ---- the driver (c2jax's interpreter) --------------------------------------------------
def _c2jax_model(name: str):
  import jax

  from c2jax import model
  from c2jax.model import counting, variants
  variant, overrides = MODELS[name]
  cfg = variants.get(variant, **overrides)
  params = jax.jit(lambda k: model.init(cfg, k))(jax.random.key(0))
  return cfg, params, counting.count_params(cfg)["total_params"]


def _shape(cfg) -> dict:
  """What a peer needs to build the same model."""
  moe = cfg.num_layers > cfg.first_k_dense
  shape = dict(
      vocab=cfg.vocab_size, hidden=cfg.hidden_size, layers=cfg.num_layers,
      ffn=cfg.moe.intermediate_size if moe else cfg.intermediate_size,
      heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
      rope_theta=cfg.rope.theta, eps=cfg.rms_norm_eps,
      experts=cfg.moe.num_experts if moe else None,
      top_k=cfg.moe.num_experts_per_tok if moe else None)
  if cfg.attention == "mla":  # DeepSeek-V3's fields
    shape.update(dense_ffn=cfg.intermediate_size, first_dense=cfg.first_k_dense,
                 shared=cfg.moe.num_shared_experts, scaling=cfg.moe.routed_scaling_factor,
                 q_lora=cfg.q_lora_rank, kv_lora=cfg.kv_lora_rank,
                 nope=cfg.qk_nope_head_dim, rope=cfg.qk_rope_head_dim, v=cfg.v_head_dim)
  return shape


class C2jaxSide:
  """JaxEngine.generate over `batch` random prompts, as a user runs it."""

  def __init__(self, cfg, params, batch: int, prompt_len: int, new_tokens: int,
               max_decode_steps: int | None = None, logprobs: bool = True):
    import numpy as np

    from c2jax.rollout import JaxEngine
    # A 16-token bucket besides the prompt's: split() appends one token to a prefilled
    # sequence, which must not run as a prompt-wide chunk.
    self.engine = JaxEngine(cfg, params, num_slots=batch,
                            max_length=prompt_len + new_tokens + 8,
                            prefill_buckets=sorted({16, prompt_len}),
                            max_decode_steps=max_decode_steps)
    self.prompts = np.random.default_rng(0).integers(1, cfg.vocab_size, (batch, prompt_len))
    self.logprobs = logprobs

  def time(self, count: int) -> float:
    from c2jax.rollout import Request, SamplingParams
    requests = [Request(p, SamplingParams(temperature=0.0, max_tokens=count,
                                          logprobs=self.logprobs))
                for p in self.prompts]
    start = time.perf_counter()
    generations = self.engine.generate(requests)
    seconds = time.perf_counter() - start
    assert all(len(g.tokens) == count for g in generations), "a generation stopped early"
    return seconds

  def split(self, count: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds): the prompts prefilled and their first tokens
    sampled (kept alive), then each sequence extended by its first token and `count` - 1
    more sampled from the cache, as a user's multi-turn call continues one."""
    from c2jax.rollout import Request, SamplingParams

    def sampling(tokens):
      return SamplingParams(temperature=0.0, max_tokens=tokens, logprobs=self.logprobs)
    start = time.perf_counter()
    firsts = self.engine.generate([Request(p, sampling(1), keep_alive=True)
                                   for p in self.prompts])
    middle = time.perf_counter()
    generations = self.engine.generate([Request(g.tokens[-1:], sampling(count - 1), g.seq_id)
                                        for g in firsts])
    seconds = time.perf_counter() - middle
    assert all(len(g.tokens) == count - 1 for g in generations), "a generation stopped early"
    return middle - start, seconds

  def close(self):
    pass


class PeerSide:
  """A peer's worker process, kept alive across rounds (its compiled programs too)."""

  def __init__(self, peer: str, python: str, request: dict):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    self.process = subprocess.Popen(
        [python, WORKERS, peer], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env=env)
    self.info = self._ask(request)

  def _ask(self, message: dict) -> dict:
    self.process.stdin.write(json.dumps(message) + "\n")
    self.process.stdin.flush()
    line = self.process.stdout.readline()
    if not line:
      raise RuntimeError(f"peer worker exited (code {self.process.wait()}); see its stderr.")
    return json.loads(line)

  def time(self, count: int) -> float:
    return self._ask({"op": "time", "count": count})["seconds"]

  def split(self, count: int) -> tuple[float, float]:
    reply = self._ask({"op": "split", "count": count})
    return reply["prefill"], reply["decode"]

  def close(self):
    self.process.stdin.close()
    self.process.wait(60)


STATS = {"best": min, "median": statistics.median}


def _measure(sides: dict, batch: int, prompt_len: int, new_tokens: int, rounds: int,
             settle_s: float = 0.0, stat: str = "best", warmup: str = "same",
             method: str = "whole"):
  """{side: (decode tokens/s, prefill tokens/s)} from interleaved rounds, each time the
  `stat` (STATS) of its rounds. With settle_s, each timed call follows settle_s of
  idleness (the previous side's threads wind down) and then, unless warmup is 'none', an
  untimed call of its own side: of the same n (warmup 'same': the side runs in its steady
  state), or of one token (warmup 'one', the method before 2026-12-02: a decode loop timed
  after it runs in the slow state that follows an idle spell, see the module docstring).

  method 'whole' times whole generate calls of 1 and n tokens (t(1), t(n)); 'split' times
  each call's prefill and its decode from the prefilled cache apart, for 2 and n tokens:
  decode = batch (n - 2) / (d(n) - d(2)), prefill = batch prompt / p over both calls."""
  short = 1 if method == "whole" else 2

  def call(side, count):
    return (side.time(count),) if method == "whole" else side.split(count)
  for side in sides.values():  # compile both programs of every side first
    call(side, short), call(side, new_tokens)

  def timed(side, count):
    if settle_s:
      time.sleep(settle_s)
      if warmup != "none":
        call(side, count if warmup == "same" else short)
    return call(side, count)
  times = {name: ([], []) for name in sides}
  for _ in range(rounds):
    for name, side in sides.items():
      times[name][0].append(timed(side, short))
      times[name][1].append(timed(side, new_tokens))
  out = {}
  for name, (shorts, fulls) in times.items():
    if method == "whole":
      one, full = STATS[stat]([t for t, in shorts]), STATS[stat]([t for t, in fulls])
      prefill = one
    else:
      one, full = STATS[stat]([d for _, d in shorts]), STATS[stat]([d for _, d in fulls])
      prefill = STATS[stat]([p for p, _ in shorts + fulls])
    decode = (batch * (new_tokens - short) / (full - one) if full > one else float("nan"))
    out[name] = (decode, batch * prompt_len / prefill)
  return out


def run(args) -> list[dict]:
  import tempfile

  import jax
  import numpy as np

  from c2jax import hf
  pythons = {"tunix": args.tunix_python, "hf": args.hf_python,
             "tunix_logprobs": args.tunix_python if args.tunix_logprobs else "",
             "maxtext": args.maxtext_python, "maxtext_sparse": args.maxtext_python}
  rows = []
  for name in args.models.split(","):
    cfg, params, count = _c2jax_model(name)
    with tempfile.TemporaryDirectory() as hf_dir:
      if args.hf_python:
        hf.save(cfg, jax.tree.map(np.asarray, params), hf_dir)
      for prompt_len in map(int, args.prompt_lens.split(",")):
        for batch in map(int, args.batches.split(",")):
          request = {"op": "build", "shape": _shape(cfg), "batch": batch,
                     "prompt_len": prompt_len, "new_tokens": args.new_tokens,
                     "hf_dir": hf_dir}
          sides = {"c2jax": C2jaxSide(cfg, params, batch, prompt_len, args.new_tokens)}
          if args.c2jax_steps:  # the engine with shorter decode calls, for comparison
            sides[f"c2jax@{args.c2jax_steps}"] = C2jaxSide(
                cfg, params, batch, prompt_len, args.new_tokens, args.c2jax_steps)
          if args.c2jax_no_logprobs:  # requests that ask for no log-probs
            sides["c2jax_nolp"] = C2jaxSide(cfg, params, batch, prompt_len, args.new_tokens,
                                            logprobs=False)
          info = {"c2jax params": count}
          for peer in peers_for(name):
            if pythons[peer]:
              sides[peer] = PeerSide(peer, pythons[peer], request)
              info[f"{peer} params"] = sides[peer].info["params"]
              if args.method == "split" and not sides[peer].info["split"]:
                raise SystemExit(f"--method split: the {peer} side times whole calls "
                                 "only; leave its interpreter out or use --method whole.")
          load = os.getloadavg()[0]
          rates = _measure(sides, batch, prompt_len, args.new_tokens, args.rounds,
                           args.settle_s, args.stat, args.warmup, args.method)
          for side in sides.values():
            side.close()
          row = {"model": name, "prompt": prompt_len, "batch": batch, **info,
                 "load": round(load, 1)}
          for side, (decode, prefill) in rates.items():
            row[f"{side} decode tok/s"] = decode
            row[f"{side} prefill tok/s"] = prefill
          for peer in [side for side in sides if side != "c2jax"]:
            row[f"decode vs {peer}"] = rates["c2jax"][0] / rates[peer][0]
            row[f"prefill vs {peer}"] = rates["c2jax"][1] / rates[peer][1]
          if "c2jax_nolp" in rates:  # like for like with a peer that returns none
            for peer in [side for side in sides if not side.startswith("c2jax")]:
              row[f"decode vs {peer} (c2jax_nolp)"] = rates["c2jax_nolp"][0] / rates[peer][0]
          rows.append(row)
          print(json.dumps(row), flush=True)
  return rows


def _table(rows: list[dict]) -> None:
  columns = list(dict.fromkeys(k for row in rows for k in row))
  print("| " + " | ".join(columns) + " |")
  print("|" + "---|" * len(columns))
  for row in rows:
    print("| " + " | ".join(f"{row[c]:.2f}" if isinstance(row.get(c), float)
                            else str(row.get(c, "")) for c in columns) + " |")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", default="qwen3_tiny,qwen3_small,qwen3_moe_tiny,"
                      "qwen3_moe_small", help=f"comma-separated, of {sorted(MODELS)}")
  parser.add_argument("--batches", default="1,8,32")
  parser.add_argument("--prompt_lens", default="16")
  parser.add_argument("--new_tokens", type=int, default=64)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--stat", choices=sorted(STATS), default="best",
                      help="each time t(n) is this statistic of its --rounds: best (the "
                      "least), or median, which holds still where a side's rare fast "
                      "rounds decide the best (the tiny shapes on a shared VM; use 15 "
                      "rounds or more)")
  parser.add_argument("--settle_s", type=float, default=0.2,
                      help="idle seconds, then an untimed call of the same side (--warmup), "
                           "before each timed call: a process that has just run keeps its "
                           "threads busy for a while, slowing the next side's call, and a "
                           "process that has idled runs slowly for tens of ms (0: neither)")
  parser.add_argument("--warmup", choices=("same", "one", "none"), default="same",
                      help="the untimed call after the settle: as many tokens as the timed "
                      "one (same), or one token (one: the method before 2026-12-02, which "
                      "times decode loops in the slow state after idling), or none (with "
                      "--method split at long prompts, whose prefill warms the decode)")
  parser.add_argument("--method", choices=("whole", "split"), default="whole",
                      help="whole: time whole generate calls of 1 and --new_tokens tokens "
                      "and take the decode from their difference; split: time each call's "
                      "prefill and its decode from the prefilled cache apart (2 and "
                      "--new_tokens tokens), for long prompts, whose prefill would swamp "
                      "the difference (not on the HF side)")
  parser.add_argument("--c2jax_steps", type=int, default=0,
                      help="also time c2jax with decode calls of this many tokens (e.g. 8, "
                      "the engine's chunk before calls grew to max_decode_steps)")
  parser.add_argument("--c2jax_no_logprobs", action="store_true",
                      help="also time c2jax with requests that ask for no log-probs "
                      "(SamplingParams.logprobs False, side c2jax_nolp): like for like "
                      "with Tunix's default, which returns none")
  parser.add_argument("--tunix_python", default="",
                      help="interpreter with google-tunix (and this jax) for its column")
  parser.add_argument("--tunix_logprobs", action="store_true",
                      help="also time Tunix returning each token's log-prob (its "
                      "return_logprobs), as c2jax's engine does by default")
  parser.add_argument("--maxtext_python", default="",
                      help="interpreter with MaxText 0.2.5 for the MaxEngine columns "
                      "(DeepSeek-V3 models)")
  parser.add_argument("--hf_python", default="",
                      help="interpreter with torch + transformers for the HF column")
  parser.add_argument("--repeats", type=int, default=1,
                      help="run the whole comparison this many times, each in fresh "
                      "processes (every side's process draws its own memory layout, which "
                      "moves a tiny model's rates by up to ~30%%), and add a table of the "
                      "median ratios")
  parser.add_argument("--json_out", default="", help=argparse.SUPPRESS)
  parser.add_argument("--smoke", action="store_true",
                      help="qwen3_tiny, batch 2, 16 new tokens, one round; c2jax only "
                      "unless a peer interpreter is given")
  args = parser.parse_args(argv)
  if args.smoke:
    args.models, args.batches, args.new_tokens, args.rounds = "qwen3_tiny", "2", 16, 1
    args.settle_s = 0.0
  if args.method == "split" and args.new_tokens < 3:
    raise SystemExit(f"--method split needs --new_tokens >= 3 (it takes the decode from "
                     f"calls of 2 and --new_tokens tokens), not {args.new_tokens}.")
  for name in args.models.split(","):
    if name not in MODELS:
      raise SystemExit(f"--models: unknown {name!r}; choose from {sorted(MODELS)}.")
  if args.repeats > 1:
    _repeated(args, sys.argv[1:] if argv is None else list(argv))
    return
  from c2jax import host_memory
  host_memory.retain_freed_memory()  # as `c2jax` does at start-up
  import jax
  device = jax.devices()[0]
  print(f"decode against the JAX peers, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} "
        f"UTC, {device.platform} ({device.device_kind}), {os.cpu_count()} cores, jax "
        f"{jax.__version__}, load average {os.getloadavg()[0]:.1f}", flush=True)
  rows = run(args)
  _table(rows)
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(rows, f)


def _repeated(args, argv: list[str]) -> None:
  """--repeats N: N whole runs of this script, one after another, each a fresh driver
  (the c2jax side) with fresh peer workers; prints every run, then the median over runs
  of each row's ratios."""
  import pathlib
  import tempfile
  runs = []
  for repeat in range(args.repeats):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
      # argparse keeps an option's last value: this run is a single one.
      subprocess.run([sys.executable, "-m", "tools.bench.decode_peers", *argv, "--repeats",
                      "1", "--json_out", out.name], check=True)
      runs.append(json.loads(pathlib.Path(out.name).read_text()))
    print(f"(run {repeat + 1} of {args.repeats} done)", flush=True)
  print(f"median over {args.repeats} fresh-process runs:")
  _table(median_rows(runs))


def median_rows(runs: list[list[dict]]) -> list[dict]:
  """Per row (same model, prompt, batch in every run): the median over runs of each
  c2jax / peer ratio, and its min-max."""
  rows = []
  for same in zip(*runs):
    row = {k: same[0][k] for k in ("model", "prompt", "batch")}
    if any({k: r[k] for k in row} != row for r in same):
      raise ValueError(f"runs disagree on their rows ({[{k: r[k] for k in row} for r in same]}"
                       "): every run must time the same --models, --batches and "
                       "--prompt_lens.")
    for key in [k for k in same[0] if k.startswith(("decode vs", "prefill vs"))]:
      values = [r[key] for r in same]
      row[f"median {key}"] = statistics.median(values)
      row[f"{key} (min-max)"] = f"{min(values):.2f}-{max(values):.2f}"
    rows.append(row)
  return rows


if __name__ == "__main__":
  main()
