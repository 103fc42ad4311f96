"""Report Fig. 6: with the length penalty, completion tokens fall on easy tasks, not on hard.

  python -m experiments.findings.fig6_length_penalty --init-from runs/tiny_agent/sft \
      [--easy 0] [--hard 3] [--penalty-scale 1e-3] [--arms penalty,none] [--seeds 3] \
      [--out DIR] [--workdir DIR] [--set rl.learner.steps=80] [--smoke]

Per arm and seed: `c2jax rl` (configs/rl.py:tiny from --init-from) on procedural tasks of
two difficulties, half easy and half hard, training and held-out alike. Arm `penalty` sets
config.rl.reward.length_penalty.scale = --penalty-scale (the config's default, 1e-5, is
sized for thousand-token rollouts and is negligible at tiny scale); arm `none` sets it to
0, the control. Measured: completion tokens per episode on the held-out tasks of each
difficulty at every evaluation (same tasks each time), and sampled tokens per training
rollout by difficulty, in bins of training steps (from the run's queue). The finding holds
when, in the `penalty` arm, easy-task tokens fall from the first to the last evaluation
while hard-task tokens fall by less (or rise).
"""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np

from experiments.findings import common

NAME = "fig6_length_penalty"
ARMS = ("penalty", "none")
_DIFFICULTY = re.compile(r"-d(\d+)-")


def _difficulty(task_id: str) -> int:
  match = _DIFFICULTY.search(task_id)
  if match is None:
    raise ValueError(f"task id {task_id!r} names no procgen difficulty (-d<N>-).")
  return int(match.group(1))


def heldout_tokens(run, difficulties) -> dict[int, dict[int, float]]:
  """{step: {difficulty: mean completion tokens per held-out episode}}."""
  out = {}
  for step in common.eval_steps(run):
    records = common.eval_records(run, step)
    out[step] = {}
    for d in difficulties:
      tokens = [r["completion_tokens"] for r in records if _difficulty(r["task_id"]) == d]
      if not tokens:
        raise ValueError(f"{run}: the evaluation at step {step} has no difficulty-{d} "
                         "episodes; raise tasks.heldout_count.")
      out[step][d] = float(np.mean(tokens))
  if len(out) < 2:
    raise ValueError(f"{run} evaluated at steps {sorted(out)}; the finding needs step 0 and "
                     "a later step.")
  return out


def train_tokens(run, difficulties, bins: int) -> dict[str, list]:
  """Sampled tokens per training rollout by difficulty, averaged over `bins` equal spans
  of the training steps (from the queue's step manifests and trained groups)."""
  manifests = {int(p.stem): json.loads(p.read_text())
               for p in (pathlib.Path(run) / "queue" / "steps").glob("*.json")}
  step_of = {gid: step for step, ids in manifests.items() for gid in ids}
  groups = [g for g in common.queued_groups(run) if g.group_id in step_of]
  last = max(manifests) if manifests else 0
  edges = np.linspace(0, last, bins + 1)
  out = {"bin_end_step": [float(e) for e in edges[1:]]}
  for d in difficulties:
    means = []
    for lo, hi in zip(edges[:-1], edges[1:]):
      tokens = [t for g in groups if _difficulty(g.group_id) == d
                and lo < step_of[g.group_id] <= hi for t in g.info["sampled_tokens"]]
      means.append(float(np.mean(tokens)) if tokens else None)
    out[str(d)] = means
  return out


def summarise(per_arm: dict[str, list[dict]], easy: int, hard: int) -> dict:
  out = {}
  for arm, curves in per_arm.items():
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    first, last = steps[0], steps[-1]
    arm_out = {"steps": steps, "per_step": {}, "change": {}}
    for step in steps:
      arm_out["per_step"][step] = {str(d): common.spread([c[step][d] for c in curves])
                                   for d in (easy, hard)}
    for d in (easy, hard):
      rel = [(c[last][d] - c[first][d]) / max(c[first][d], 1e-9) for c in curves]
      arm_out["change"][str(d)] = {**common.spread(rel),
                                   "seeds_down": int(sum(r < 0 for r in rel))}
    out[arm] = arm_out
  pen = out.get("penalty")
  if pen is None:
    out["agrees"] = None
    out["verdict"] = "no `penalty` arm was run: nothing to compare."
    return out
  easy_change = pen["change"][str(easy)]["mean"]
  hard_change = pen["change"][str(hard)]["mean"]
  out["agrees"] = bool(easy_change < 0 and hard_change > easy_change)
  text = (f"penalty arm, first -> last evaluation: easy (difficulty {easy}) tokens "
          f"{easy_change:+.1%} (down in {pen['change'][str(easy)]['seeds_down']} of "
          f"{pen['change'][str(easy)]['n']} seeds), hard (difficulty {hard}) "
          f"{hard_change:+.1%}")
  if "none" in out:
    text += (f"; control without penalty: easy {out['none']['change'][str(easy)]['mean']:+.1%},"
             f" hard {out['none']['change'][str(hard)]['mean']:+.1%}")
  out["verdict"] = text + (". Agrees with the report (easy fall, hard fall less or rise)."
                           if out["agrees"] else
                           ". Does not reproduce the report's pattern at this scale.")
  return out


def plot(per_arm, train_curves, summary, easy, hard):
  plt = common.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8))
  colours = {easy: "tab:green", hard: "tab:red"}
  styles = {"penalty": "-", "none": ":"}
  for arm, curves in per_arm.items():
    steps = summary[arm]["steps"]
    for d in (easy, hard):
      mean = np.array([summary[arm]["per_step"][s][str(d)]["mean"] for s in steps])
      std = np.array([summary[arm]["per_step"][s][str(d)]["std"] for s in steps])
      axes[0].plot(steps, mean, "o" + styles[arm], color=colours[d],
                   label=f"{arm}: difficulty {d}")
      axes[0].fill_between(steps, mean - std, mean + std, color=colours[d], alpha=0.12)
    for d in (easy, hard):
      runs = train_curves[arm]
      ends = runs[0]["bin_end_step"]
      values = np.array([[np.nan if r[str(d)][i] is None else r[str(d)][i]
                          for i in range(len(ends))] for r in runs], float)
      axes[1].plot(ends, np.nanmean(values, 0), "s" + styles[arm], color=colours[d],
                   label=f"{arm}: difficulty {d}")
  axes[0].set_title("held-out completion tokens per episode")
  axes[1].set_title("sampled tokens per training rollout")
  for ax in axes:
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  return fig


def main(argv=None):
  p = common.parser(__doc__.splitlines()[0])
  p.add_argument("--init-from", default=None,
                 help="the SFT run RL starts from (default: configs/rl.py's init_from)")
  p.add_argument("--easy", type=int, default=0, help="procgen difficulty of the easy tasks")
  p.add_argument("--hard", type=int, default=3, help="procgen difficulty of the hard tasks")
  p.add_argument("--penalty-scale", type=float, default=1e-3)
  p.add_argument("--arms", default="penalty,none",
                 help=f"comma-separated subset of {list(ARMS)}")
  p.add_argument("--bins", type=int, default=4, help="step bins of the training curve")
  args = common.finish_args(p.parse_args(argv), NAME)
  common.check_kinds(args, ("rl",))
  arms = [a for a in args.arms.split(",") if a]
  if not arms or set(arms) - set(ARMS):
    raise SystemExit(f"--arms {args.arms!r}: choose from {list(ARMS)}.")
  if args.easy == args.hard:
    raise SystemExit(f"--easy and --hard are both {args.easy}; pick two difficulties.")
  if args.penalty_scale <= 0:
    raise SystemExit(f"--penalty-scale must be > 0, got {args.penalty_scale}.")
  common.start_jax()
  per_arm, train_curves = {}, {}
  for arm in arms:
    per_arm[arm], train_curves[arm] = [], []
    for seed in range(args.seeds):
      cfg = common.rl_config(args, seed, args.init_from)
      cfg.tasks.difficulties = (args.easy, args.hard)
      cfg.eval.at_start = True
      cfg.rl.reward.length_penalty.scale = args.penalty_scale if arm == "penalty" else 0.0
      if args.smoke:
        cfg.tasks.heldout_count = 2
        cfg.eval.every, cfg.eval.slots = 1, 2
      common.apply_rl_overrides(args, cfg)
      if cfg.init_from:
        common.check_init_from(cfg.init_from)
      run = args.workdir / f"{arm}_seed{seed}"
      common.run_job("rl", cfg, run)
      per_arm[arm].append(heldout_tokens(run, (args.easy, args.hard)))
      train_curves[arm].append(train_tokens(run, (args.easy, args.hard), args.bins))
  summary = summarise(per_arm, args.easy, args.hard)
  numbers = {**common.header(args, "python -m experiments.findings.fig6_length_penalty"),
             "init_from": cfg.init_from or "(random init)", "rl_steps": cfg.learner.steps,
             "easy": args.easy, "hard": args.hard, "penalty_scale": args.penalty_scale,
             "length_penalty": cfg.rl.reward.length_penalty.to_dict(), "arms": arms,
             "heldout_tasks": cfg.tasks.heldout_count, "eval_samples": cfg.eval.samples,
             "heldout_curves": {a: [{str(s): {str(d): v for d, v in per.items()}
                                     for s, per in c.items()} for c in cs]
                                for a, cs in per_arm.items()},
             "train_curves": train_curves, **summary}
  numbers["length_penalty"]["scale"] = args.penalty_scale
  print("fig6:", summary["verdict"], flush=True)
  common.write_outputs(args, numbers, plot(per_arm, train_curves, summary, args.easy,
                                           args.hard))
  return numbers


if __name__ == "__main__":
  main()
