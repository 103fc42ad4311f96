"""What every findings script shares: arguments, running jobs, reading runs, writing results.

A findings script reproduces one of the Composer 2 report's findings as one command:

  python -m experiments.findings.<name> [--smoke] [--out DIR] [--seeds N] [--workdir DIR]
                                         [--set KIND.KEY=VALUE ...]

(from the checkout root) and writes DIR/<name>.png and DIR/<name>.json (the numbers, with
per-seed values, spread and the date). Runs go under --workdir (one directory per job);
rerunning the same command skips finished jobs (a job's `finding_done.json`) and resumes
unfinished ones (the jobs resume from their own checkpoints). `--set` overrides the
config of every job of one kind, e.g. `--set rl.learner.steps=80 --set
sft.train.steps=300`; the kinds are the scripts' own (rl, pretrain, sft).

Jobs run in this process through the same functions as `c2jax rl` / `c2jax pretrain`
(c2jax.rl.trainer.train, c2jax.train.loop.train), so compiled programs are shared between
the jobs of one script.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import pathlib
import platform
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
DONE = "finding_done.json"


def parser(description: str, default_seeds: int = 3) -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=description,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--smoke", action="store_true",
                 help="the test suite's size: random-init `test` configs, one seed, a step "
                      "or two (checks the machinery, shows no finding)")
  p.add_argument("--out", type=pathlib.Path, default=REPO / "runs" / "findings",
                 help="where <name>.png and <name>.json go")
  p.add_argument("--workdir", type=pathlib.Path, default=None,
                 help="where the runs go (default OUT/<name>_runs)")
  p.add_argument("--seeds", type=int, default=default_seeds, help="seeds 0..N-1")
  p.add_argument("--set", dest="overrides", action="append", default=[],
                 metavar="KIND.KEY=VALUE",
                 help="override a job config, e.g. rl.learner.steps=80 (repeatable)")
  return p


def finish_args(args, name: str):
  """Validates the shared arguments; fills in the workdir; returns args."""
  if args.seeds < 1:
    raise SystemExit(f"--seeds must be >= 1, got {args.seeds}.")
  if args.smoke:
    args.seeds = 1
  args.name = name
  args.workdir = args.workdir or args.out / f"{name}_runs"
  args.parsed_overrides = parse_overrides(args.overrides)
  return args


def parse_overrides(items: list[str]) -> dict[str, dict[str, object]]:
  """['rl.learner.steps=80'] -> {'rl': {'learner.steps': 80}}; values are Python
  literals where they parse as one (80, 1e-3, (0, 2), True), else strings."""
  out: dict[str, dict[str, object]] = {}
  for item in items:
    key, sep, text = item.partition("=")
    kind, dot, dotted = key.partition(".")
    if not sep or not dot or not dotted:
      raise SystemExit(f"--set {item!r}: expected KIND.KEY=VALUE, e.g. rl.learner.steps=80.")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    out.setdefault(kind, {})[dotted] = value
  return out


def apply(cfg, overrides: dict[str, object], kind: str):
  """Sets dotted overrides on cfg; an unknown key is an error naming it and the job kind."""
  for dotted, value in overrides.items():
    *parents, leaf = dotted.split(".")
    node = cfg
    for part in parents:
      if part not in node:
        raise SystemExit(f"--set {kind}.{dotted}: {part!r} is not a key of the {kind} "
                         "config.")
      node = node[part]
    if leaf not in node:
      raise SystemExit(f"--set {kind}.{dotted}: {leaf!r} is not a key of the {kind} config.")
    node[leaf] = value
  return cfg


def check_kinds(args, known_kinds: tuple[str, ...]) -> None:
  unknown = sorted(set(args.parsed_overrides) - set(known_kinds))
  if unknown:
    runs = f"runs {list(known_kinds)} jobs" if known_kinds else "runs no jobs"
    raise SystemExit(f"--set: unknown job kind(s) {unknown}; {args.name} {runs}.")


def load_config(config_file: str, variant: str):
  from c2jax import config as configlib  # pylint: disable=g-import-not-at-top

  return configlib.load_config_file(REPO / "configs" / config_file, variant)


def start_jax() -> None:
  """The persistent XLA cache, as `c2jax` sets it up (C2JAX_XLA_CACHE)."""
  from c2jax import compile_cache  # pylint: disable=g-import-not-at-top

  compile_cache.enable()


def run_job(kind: str, cfg, workdir: pathlib.Path) -> dict:
  """Runs (or resumes) one job; a finished job is skipped. Returns its summary."""
  workdir = pathlib.Path(workdir)
  done = workdir / DONE
  if done.exists():
    return json.loads(done.read_text())
  workdir.mkdir(parents=True, exist_ok=True)
  started = time.monotonic()
  print(f"findings: {kind} -> {workdir}", flush=True)
  if kind == "rl":
    from c2jax.rl import trainer  # pylint: disable=g-import-not-at-top
    summary = trainer.train(cfg, workdir)
  elif kind in ("pretrain", "sft"):
    from c2jax.train import loop  # pylint: disable=g-import-not-at-top
    summary = loop.train(cfg, workdir)
  else:
    raise ValueError(f"run_job: unknown job kind {kind!r}.")
  summary = json.loads(json.dumps(summary, default=float))
  summary["wall_s"] = round(time.monotonic() - started, 1)
  done.write_text(json.dumps(summary, indent=1))
  return summary


# --- reading runs ---------------------------------------------------------------------------

def metrics_rows(workdir) -> list[dict]:
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: the run in {workdir} never wrote "
                            "metrics.")
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_value(workdir, key: str) -> float:
  values = [row[key] for row in metrics_rows(workdir) if key in row]
  if not values:
    raise KeyError(f"{workdir}/metrics.jsonl has no {key!r}.")
  return float(values[-1])


def eval_steps(run) -> list[int]:
  """The steps at which an RL run evaluated its held-out tasks (evals/step_N)."""
  root = pathlib.Path(run) / "evals"
  return sorted(int(p.name.split("_")[1]) for p in root.glob("step_*")
                if (p / "summary.json").exists())


def eval_records(run, step: int) -> list[dict]:
  """Per-episode records of the held-out evaluation at `step` (infra errors left out)."""
  path = pathlib.Path(run) / "evals" / f"step_{step:06d}" / "results.jsonl"
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return [r for r in rows if not r.get("infra_error")]


def queued_groups(run) -> list:
  """Every group an RL run's actors finished (trained, waiting or dropped as stale)."""
  from c2jax.rl.queue.group_store import Group  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(run) / "queue"
  paths = sorted(p for state in ("trained", "claimed", "ready", "stale")
                 for p in (root / state).glob("*.npz"))
  return [Group.from_bytes(p.read_bytes()) for p in paths]


# --- numbers and outputs --------------------------------------------------------------------

def spread(values) -> dict:
  """mean, std (ddof 1 when n > 1), min, max and n of per-seed values (NaNs dropped)."""
  v = np.asarray([x for x in values if x is not None and np.isfinite(x)], float)
  if v.size == 0:
    return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
  return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
          "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}


def header(args, command: str) -> dict:
  load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
  return {"finding": args.name, "command": command,
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
          "load_average": [round(x, 2) for x in load], "smoke": bool(args.smoke),
          "seeds": list(range(args.seeds)), "overrides": args.overrides}


def write_outputs(args, numbers: dict, fig) -> tuple[pathlib.Path, pathlib.Path]:
  args.out.mkdir(parents=True, exist_ok=True)
  png, js = args.out / f"{args.name}.png", args.out / f"{args.name}.json"
  fig.tight_layout()
  fig.savefig(png, dpi=110)
  js.write_text(json.dumps(numbers, indent=1, default=float) + "\n")
  print(f"findings: wrote {png} and {js}", flush=True)
  return png, js


def pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


# --- RL jobs --------------------------------------------------------------------------------

def rl_config(args, seed: int, init_from: str | None = None):
  """configs/rl.py for one seed: `tiny` from an SFT checkpoint (init_from, else the
  config's own), or with --smoke the random-init `test` variant on a small tokenizer
  cached under the workdir. Callers set their finding's fields, then `apply_rl_overrides`."""
  if args.smoke:
    cfg = load_config("rl.py", "test")
    cfg.data.cache_dir = str(args.workdir / "data")
    cfg.data.vocab_size = 1024
    cfg.data.max_total_bytes = 3_000_000
    cfg.data.tokenizer_train_bytes = 300_000
    cfg.learner.steps = 1
    cfg.learner.wait_s = 0.2
  else:
    cfg = load_config("rl.py", "tiny")
    if init_from:
      cfg.init_from = str(init_from)
  cfg.learner.seed = seed
  return cfg


def apply_rl_overrides(args, cfg):
  return apply(cfg, args.parsed_overrides.get("rl", {}), "rl")


def check_init_from(path) -> None:
  """An RL start must be a run directory with checkpoints (an SFT run)."""
  ckpts = pathlib.Path(path) / "checkpoints"
  if not ckpts.is_dir() or not any(p.name.isdigit() for p in ckpts.iterdir()):
    raise SystemExit(f"--init-from {path}: no checkpoints in {ckpts}; point it at an SFT "
                     "run (e.g. the `sft` stage of `c2jax pipeline --config="
                     "configs/agent_sft.py:tiny`).")
