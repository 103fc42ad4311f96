"""Report Fig. 2: the loss after continued pretraining (and SFT) predicts the RL reward.

  python -m experiments.findings.fig2_cpt_to_rl [--variant tiny] [--levels 25,75,225] \
      [--sft-steps 150] [--traces 320] [--rl-steps 10] [--seeds 3] [--out DIR] \
      [--workdir DIR] [--set pretrain.KEY=V] [--set sft.KEY=V] [--set rl.KEY=V] [--smoke]

Per seed s and continued-pretraining level L (log-spaced step counts; compute = 6 x
active parameters x tokens):
  1. pretrain  configs/pretrain.py:<variant>, L steps from scratch (its own cosine schedule)
  2. sft       the SFT phase of configs/agent_sft.py:<variant> from that checkpoint, a fixed
               number of steps on one shared set of agent traces (difficulty-0 procedural
               tasks solved through configs/rl.py's tools; built once, under WORKDIR/traces)
  3. rl        configs/rl.py:tiny from the SFT checkpoint, a fixed number of steps
RL reward = mean training reward over the last quarter of the RL steps; the held-out pass
rate at the last step is recorded beside it.

  python -m experiments.findings.fig2_cpt_to_rl --from-checkpoints RUN1,RUN2,RUN3 \
      [--metrics RUN] [--rl-steps 10] [--seeds 1] [--out DIR] [--workdir DIR] \
      [--set sft.KEY=V] [--set rl.KEY=V] [--smoke]

takes the compute levels from existing training runs instead (e.g. copies of one SFT run
at several steps, each a run directory whose newest checkpoint is that step): a level is
the checkpoint's step, its compute 6 x active parameters x the tokens trained to it; the
`cpt_loss` column holds the run's training loss at that step and `sft_loss` its held-out
loss at that step from the run's metrics.jsonl (or --metrics RUN's), or, where that step logged none, the
held-out loss computed now on the run's held-out traces with the training loop's own
eval code (c2jax.train.loop.run_evals). RL runs from each checkpoint as above, with the
checkpoint's tokenizer (its data section); --smoke makes the RL part tiny. Writes OUT/fig2_cpt_to_rl.png and .json and
the table OUT/cpt_to_rl.jsonl / .csv (columns cpt_steps, cpt_compute, cpt_loss, sft_loss,
rl_reward, seed, then heldout_pass_rate and the run directories) that
experiments/notebooks read. The report's finding holds when lower loss goes with higher
RL reward (negative correlation) across the levels.
"""

from __future__ import annotations

import csv
import json
import pathlib

import numpy as np

from experiments.findings import common
from experiments.findings import fig2_checkpoints

NAME = "fig2_cpt_to_rl"
TABLE = "cpt_to_rl"
COLUMNS = ("cpt_steps", "cpt_compute", "cpt_loss", "sft_loss", "rl_reward", "seed",
           "heldout_pass_rate", "cpt_tokens", "cpt_run", "sft_run", "rl_run")


def _smoke_data(args, cfg):
  cfg.data.cache_dir = str(args.workdir / "data")
  cfg.data.vocab_size = 1024
  cfg.data.max_total_bytes = 3_000_000
  cfg.data.tokenizer_train_bytes = 300_000
  # One (dense) layer: the jobs' time is tracing the model, and the smoke checks the
  # pipeline, not the model; SFT and RL inherit it from the CPT checkpoint.
  cfg.model.num_layers = 1


def pretrain_config(args, steps: int, seed: int):
  cfg = common.load_config("pretrain.py", args.variant)
  cfg.train.steps = steps
  cfg.train.seed = seed
  cfg.train.warmup_steps = min(cfg.train.warmup_steps, max(steps // 5, 1))
  cfg.train.eval_every = steps
  cfg.train.checkpoint_every = steps
  if args.smoke:
    _smoke_data(args, cfg)
    cfg.train.seq_len, cfg.train.batch_size, cfg.train.eval_batches = 32, 4, 1
  common.apply(cfg, args.parsed_overrides.get("pretrain", {}), "pretrain")
  return cfg


def sft_and_traces_config(args, cpt_run, seed: int):
  pipeline = common.load_config("agent_sft.py", args.variant)
  cfg = pipeline.sft
  cfg.init_from = str(cpt_run)
  cfg.train.seed = seed
  cfg.train.steps = args.sft_steps
  cfg.train.warmup_steps = min(cfg.train.warmup_steps, max(args.sft_steps // 5, 1))
  cfg.train.eval_every = args.sft_steps
  cfg.train.checkpoint_every = args.sft_steps
  cfg.sft.train_path = str(args.workdir / "traces" / "train.jsonl")
  cfg.sft.heldout_path = str(args.workdir / "traces" / "heldout.jsonl")
  traces = pipeline.traces
  traces.count = args.traces + traces.heldout
  if args.smoke:
    _smoke_data(args, cfg)
    cfg.train.batch_size, cfg.train.eval_batches = 2, 1
    traces.heldout = 2
    traces.count = args.traces + traces.heldout
  common.apply(cfg, args.parsed_overrides.get("sft", {}), "sft")
  return cfg, traces


def rl_config(args, sft_run, seed: int):
  cfg = common.rl_config(args, seed, str(sft_run))
  cfg.init_from = str(sft_run)  # the smoke variant starts from random init otherwise
  cfg.learner.steps = args.rl_steps
  cfg.eval.at_start = False
  cfg.eval.every = args.rl_steps
  if args.smoke:
    cfg.eval.samples, cfg.eval.slots = 1, 2
  common.apply_rl_overrides(args, cfg)
  return cfg


def rl_reward(run, steps: int) -> float:
  """Mean training reward over the last quarter (at least one) of the RL steps."""
  tail = max(steps // 4, 1)
  rows = [r for r in common.metrics_rows(run) if "reward" in r and "eval/pass_rate" not in r]
  rows = [r for r in rows if r["step"] > steps - tail]
  if not rows:
    raise ValueError(f"{run}/metrics.jsonl has no training reward after step "
                     f"{steps - tail}.")
  return float(np.mean([r["reward"] for r in rows]))


def correlation(x, y) -> float | None:
  x, y = np.asarray(x, float), np.asarray(y, float)
  if len(x) < 3 or x.std() == 0 or y.std() == 0:
    return None
  return float(np.corrcoef(x, y)[0, 1])


def summarise(rows: list[dict], levels: list[int], first_loss: str = "CPT loss") -> dict:
  """Per-level spreads, correlations and the verdict; `first_loss` names the cpt_loss
  column in it (the training loss with --from-checkpoints)."""
  out = {"per_level": {}}
  for level in levels:
    at = [r for r in rows if r["cpt_steps"] == level]
    out["per_level"][level] = {k: common.spread([r[k] for r in at]) for k in
                               ("cpt_loss", "sft_loss", "rl_reward", "heldout_pass_rate")}
    out["per_level"][level]["cpt_compute"] = at[0]["cpt_compute"]
  out["corr_sft_loss_rl_reward"] = correlation([r["sft_loss"] for r in rows],
                                               [r["rl_reward"] for r in rows])
  out["corr_cpt_loss_rl_reward"] = correlation([r["cpt_loss"] for r in rows],
                                               [r["rl_reward"] for r in rows])
  means = [out["per_level"][lv] for lv in levels]
  cpt_falls = all(a["cpt_loss"]["mean"] > b["cpt_loss"]["mean"] for a, b in zip(means,
                                                                             means[1:]))
  corr = out["corr_sft_loss_rl_reward"]
  reward_spread = max(m["rl_reward"]["mean"] for m in means) - min(
      m["rl_reward"]["mean"] for m in means)
  out["cpt_loss_falls_with_compute"] = bool(cpt_falls)
  out["agrees"] = bool(corr is not None and corr < 0)
  out["verdict"] = (
      f"{first_loss} " + " -> ".join(f"{m['cpt_loss']['mean']:.3f}" for m in means)
      + ", SFT loss " + " -> ".join(f"{m['sft_loss']['mean']:.3f}" for m in means)
      + ", RL reward " + " -> ".join(f"{m['rl_reward']['mean']:+.4f}" for m in means)
      + f" over levels {levels} (range of mean rewards {reward_spread:.4f}); correlation of "
      "SFT loss with RL reward "
      + (f"{corr:+.2f}" if corr is not None else "undefined (no variation)")
      + (". Lower loss goes with higher reward, as in the report." if out["agrees"] else
         ". The report's link does not show at this scale."))
  return out


def plot(rows, summary, levels, from_checkpoints: bool = False):
  plt = common.pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
  compute = [summary["per_level"][lv]["cpt_compute"] for lv in levels]
  titles = (("SFT training loss", "SFT held-out loss") if from_checkpoints else
            ("CPT eval loss", "SFT held-out loss"))
  for key, ax, title in (("cpt_loss", axes[0], titles[0]), ("sft_loss", axes[1], titles[1])):
    mean = [summary["per_level"][lv][key]["mean"] for lv in levels]
    std = [summary["per_level"][lv][key]["std"] for lv in levels]
    ax.errorbar(compute, mean, yerr=std, fmt="o-", capsize=3)
    ax.set_xscale("log")
    ax.set_xlabel(("training compute of the checkpoint" if from_checkpoints else
                   "continued-pretraining compute") + " (FLOPs, 6 N D)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(levels)))
  for level, colour in zip(levels, colours):
    at = [r for r in rows if r["cpt_steps"] == level]
    axes[2].scatter([r["sft_loss"] for r in at], [r["rl_reward"] for r in at],
                    color=colour, label=f"{level} {'steps' if from_checkpoints else 'CPT steps'}")
  axes[2].set_xlabel("SFT held-out loss")
  axes[2].set_ylabel("RL reward (last quarter of steps)")
  corr = summary["corr_sft_loss_rl_reward"]
  axes[2].set_title("RL reward against loss" + (f" (r = {corr:+.2f})" if corr is not None
                                                else ""))
  axes[2].legend(fontsize=7)
  axes[2].grid(alpha=0.3)
  return fig


def write_table(args, rows) -> None:
  args.out.mkdir(parents=True, exist_ok=True)
  with open(args.out / f"{TABLE}.jsonl", "w") as f:
    for row in rows:
      f.write(json.dumps({k: row[k] for k in COLUMNS}) + "\n")
  with open(args.out / f"{TABLE}.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows({k: row[k] for k in COLUMNS} for row in rows)


def main(argv=None):
  p = common.parser(__doc__.splitlines()[0])
  p.add_argument("--variant", default="tiny", help="configs/pretrain.py and agent_sft.py "
                 "variant of the model being pretrained")
  p.add_argument("--levels", default="25,75,225", help="CPT step counts, comma-separated")
  p.add_argument("--sft-steps", type=int, default=150)
  p.add_argument("--traces", type=int, default=320, help="SFT training traces (shared)")
  p.add_argument("--rl-steps", type=int, default=10)
  p.add_argument("--from-checkpoints", default="", help="comma-separated training run "
                 "directories: the compute levels are their newest checkpoints (no CPT/SFT "
                 "is run)")
  p.add_argument("--metrics", type=pathlib.Path, default=None, help="with "
                 "--from-checkpoints: the directory of a metrics.jsonl to read a run's losses "
                 "from when the run has none (e.g. the run it was copied from)")
  args = common.finish_args(p.parse_args(argv), NAME)
  if args.from_checkpoints:
    return main_from_checkpoints(args)
  common.check_kinds(args, ("pretrain", "sft", "rl"))
  if args.smoke:
    args.levels, args.sft_steps, args.traces, args.rl_steps = "1,2", 2, 4, 1
  try:
    levels = sorted({int(x) for x in args.levels.split(",") if x})
  except ValueError:
    raise SystemExit(f"--levels {args.levels!r}: comma-separated step counts.") from None
  if len(levels) < 2 or levels[0] < 1:
    raise SystemExit(f"--levels {args.levels!r}: need at least two positive step counts.")
  for name in ("sft_steps", "traces", "rl_steps"):
    if getattr(args, name) < 1:
      raise SystemExit(f"--{name.replace('_', '-')} must be >= 1.")
  common.start_jax()
  from c2jax import pipeline  # pylint: disable=g-import-not-at-top
  from c2jax.model import counting  # pylint: disable=g-import-not-at-top

  rows = []
  for seed in range(args.seeds):
    for level in levels:
      cpt_cfg = pretrain_config(args, level, seed)
      cpt_run = args.workdir / f"cpt{level}_seed{seed}"
      common.run_job("pretrain", cpt_cfg, cpt_run)
      sft_cfg, traces_cfg = sft_and_traces_config(args, cpt_run, seed)
      (args.workdir / "traces").mkdir(parents=True, exist_ok=True)
      pipeline.build_traces(traces_cfg, args.workdir / "traces")
      sft_run = args.workdir / f"sft{level}_seed{seed}"
      common.run_job("sft", sft_cfg, sft_run)
      rl_cfg = rl_config(args, sft_run, seed)
      rl_run = args.workdir / f"rl{level}_seed{seed}"
      common.run_job("rl", rl_cfg, rl_run)
      tokens = level * cpt_cfg.train.batch_size * cpt_cfg.train.seq_len
      active = counting.count_params(cpt_cfg.model)["active_params"]
      final_eval = max(common.eval_steps(rl_run))
      rows.append({
          "cpt_steps": level, "cpt_tokens": tokens, "cpt_compute": 6.0 * active * tokens,
          "cpt_loss": common.last_value(cpt_run, "eval_loss"),
          "sft_loss": common.last_value(sft_run, "eval_loss"),
          "rl_reward": rl_reward(rl_run, rl_cfg.learner.steps), "seed": seed,
          "heldout_pass_rate": float(np.mean([r["solved"] for r in
                                              common.eval_records(rl_run, final_eval)])),
          "cpt_run": str(cpt_run), "sft_run": str(sft_run), "rl_run": str(rl_run)})
  write_table(args, rows)
  summary = summarise(rows, levels)
  numbers = {**common.header(args, "python -m experiments.findings.fig2_cpt_to_rl"),
             "variant": args.variant, "levels": levels, "sft_steps": args.sft_steps,
             "traces": args.traces, "rl_steps": args.rl_steps, "rows": rows, **summary}
  print("fig2:", summary["verdict"], flush=True)
  common.write_outputs(args, numbers, plot(rows, summary, levels))
  return numbers


def main_from_checkpoints(args):
  """Fig. 2 over existing checkpoints: RL from each; losses from the runs themselves."""
  common.check_kinds(args, ("sft", "rl"))
  if args.metrics is not None and not (args.metrics / "metrics.jsonl").exists():
    raise SystemExit(f"--metrics {args.metrics}: no metrics.jsonl there.")
  runs = [pathlib.Path(x).expanduser().absolute() for x in args.from_checkpoints.split(",")
          if x]
  if len(runs) < 2 or len(set(runs)) != len(runs):
    raise SystemExit(f"--from-checkpoints {args.from_checkpoints!r}: need at least two "
                     "distinct run directories.")
  if args.smoke:
    args.rl_steps = 1
  if args.rl_steps < 1:
    raise SystemExit("--rl-steps must be >= 1.")
  common.start_jax()
  levels_of = [fig2_checkpoints.checkpoint_level(args, run) for run in runs]
  steps = [level["cpt_steps"] for level in levels_of]
  if len(set(steps)) != len(steps):
    raise SystemExit(f"--from-checkpoints: the runs' newest checkpoints are at steps {steps}; "
                     "each level needs its own step.")
  rows = []
  for seed in range(args.seeds):
    for level in levels_of:
      rl_cfg = rl_config(args, level["sft_run"], seed)
      # The policy reads the ids of the tokenizer it was trained with.
      rl_cfg.data = level["data"]
      rl_run = args.workdir / f"rl_step{level['cpt_steps']}_seed{seed}"
      common.run_job("rl", rl_cfg, rl_run)
      final_eval = max(common.eval_steps(rl_run))
      rows.append({
          **{k: v for k, v in level.items() if k != "data"},
          "rl_reward": rl_reward(rl_run, rl_cfg.learner.steps), "seed": seed,
          "heldout_pass_rate": float(np.mean([r["solved"] for r in
                                              common.eval_records(rl_run, final_eval)])),
          "rl_run": str(rl_run)})
  levels = sorted(steps)
  rows.sort(key=lambda r: (r["seed"], r["cpt_steps"]))
  write_table(args, rows)
  summary = summarise(rows, levels, first_loss="training loss")
  numbers = {**common.header(args, "python -m experiments.findings.fig2_cpt_to_rl "
                                   "--from-checkpoints"),
             "variant": args.variant, "levels": levels, "from_checkpoints": [str(r) for r in runs],
             "loss_columns": {"cpt_loss": "training loss at the checkpoint's step",
                              "sft_loss": "held-out loss at the checkpoint's step"},
             "sft_loss_source": {row["cpt_steps"]: row["sft_loss_source"] for row in rows},
             "rl_steps": args.rl_steps, "rows": rows, **summary}
  print("fig2:", summary["verdict"], flush=True)
  common.write_outputs(args, numbers, plot(rows, summary, levels, from_checkpoints=True))
  return numbers


if __name__ == "__main__":
  main()
