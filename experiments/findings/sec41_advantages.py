"""Report §4.1: std-normalised advantages blow up groups whose rewards barely differ;
Dr. GRPO (c2jax/rl/learner/advantages.py) does not.

  python -m experiments.findings.sec41_advantages --runs RUN [RUN ...]     # groups of runs
  python -m experiments.findings.sec41_advantages --init-from SFT_RUN [--seeds 3] \
      [--train-steps 20] [--out DIR] [--workdir DIR] [--set rl.KEY=VALUE] [--smoke]

Part 1, exact, on real reward distributions: every group of rollouts an RL run produced
(its queue: trained, waiting and stale groups; from --runs, else from short RL runs made
here, one per seed). A group is `degenerate` when every rollout got the same correctness
(all solved or all failed): its rewards then differ only by the shaping terms (length
penalty, tool-call errors, ...), a few thousandths. For each group both estimators'
advantages are computed from its stored rewards: `grpo` divides by the group std, so the
advantages of a degenerate group have unit standard deviation however small its spread
(amplification 1 / (std + eps)); `dr_grpo` keeps them at the spread's scale. Reported: each
noise-only group's mean |advantage| against that of a group with one success in G (the
weakest real signal), the share of all |advantage| on degenerate groups, the per-group
amplification, and a check that grpo's advantages have std 1 in every group with spread.
The finding holds when grpo weighs noise-only groups like a real success (at least half a
one-success group) and dr_grpo at under a tenth of that.

Part 2 (--train-steps N > 0): a short training comparison, `rl.advantage=grpo` against
`dr_grpo` from the same SFT start per seed: held-out pass rate at step 0 and at step N.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from experiments.findings import common
from experiments.findings import fig5_pass_rate

NAME = "sec41_advantages"
ESTIMATORS = ("grpo", "dr_grpo")


def group_table(groups, std_eps: float) -> list[dict]:
  """Per group: reward spread, degenerate or not, mean |A| under each estimator."""
  from c2jax.rl.learner import advantages  # pylint: disable=g-import-not-at-top

  rows = []
  for g in groups:
    rewards = np.asarray(g.rewards_G, np.float32)
    solved = g.info.get("solved")
    if solved is None or len(solved) != len(rewards):
      raise ValueError(f"group {g.group_id} has no per-rollout `solved` in its info; it was "
                       "not written by c2jax's actors.")
    row = {"group": g.group_id, "size": int(len(rewards)),
           "reward_std": float(rewards.std()), "reward_mean": float(rewards.mean()),
           "degenerate": bool(len(set(solved)) == 1), "solved": float(np.mean(solved))}
    for name in ESTIMATORS:
      adv = np.asarray(advantages.compute_advantages(name, rewards, std_eps), np.float64)
      row[f"mean_abs_{name}"] = float(np.abs(adv).mean())
      row[f"max_abs_{name}"] = float(np.abs(adv).max())
      row[f"std_{name}"] = float(adv.std())
    rows.append(row)
  return rows


def analyse(rows: list[dict], std_eps: float) -> dict:
  if not rows:
    raise ValueError("no groups to analyse: the runs' queues are empty.")
  degenerate = [r for r in rows if r["degenerate"]]
  mixed = [r for r in rows if not r["degenerate"]]
  out = {"groups": len(rows), "degenerate_groups": len(degenerate),
         "mixed_groups": len(mixed), "std_eps": std_eps,
         "degenerate_fraction": len(degenerate) / len(rows)}
  for label, subset in (("degenerate", degenerate), ("mixed", mixed)):
    out[label] = {"reward_std": common.spread([r["reward_std"] for r in subset])}
    for name in ESTIMATORS:
      out[label][f"mean_abs_{name}"] = common.spread([r[f"mean_abs_{name}"] for r in subset])
  for name in ESTIMATORS:
    total = sum(r[f"mean_abs_{name}"] * r["size"] for r in rows)
    on_degenerate = sum(r[f"mean_abs_{name}"] * r["size"] for r in degenerate)
    out[f"share_of_abs_advantage_on_degenerate_{name}"] = (on_degenerate / total
                                                          if total > 0 else None)
  # Amplification grpo / dr_grpo = 1 / (std + eps) in every group with any spread.
  spread_rows = [r for r in rows if r["reward_std"] > 0]
  amp = [r["mean_abs_grpo"] / r["mean_abs_dr_grpo"] for r in spread_rows]
  exact = [1.0 / (r["reward_std"] + std_eps) for r in spread_rows]
  out["amplification"] = {
      "degenerate": common.spread([a for a, r in zip(amp, spread_rows) if r["degenerate"]]),
      "mixed": common.spread([a for a, r in zip(amp, spread_rows) if not r["degenerate"]]),
      "max_relative_error_vs_1_over_std": float(max(
          (abs(a - e) / e for a, e in zip(amp, exact)), default=0.0))}
  # A degenerate group's weight against the weakest real signal: a group of the same size
  # where one rollout of G solved the task (rewards 1, 0, ..., 0).
  from c2jax.rl.learner import advantages  # pylint: disable=g-import-not-at-top
  size = int(np.bincount([r["size"] for r in rows]).argmax())
  one_solved = np.zeros(size, np.float32)
  one_solved[0] = 1.0
  out["one_success_group_size"] = size
  out["noise_weight_vs_one_success"] = {}
  noisy = [r for r in degenerate if r["reward_std"] > 0 and r["size"] == size]
  for name in ESTIMATORS:
    reference = float(np.abs(np.asarray(advantages.compute_advantages(
        name, one_solved, std_eps))).mean())
    out[f"one_success_mean_abs_{name}"] = reference
    out["noise_weight_vs_one_success"][name] = common.spread(
        [r[f"mean_abs_{name}"] / reference for r in noisy])
  # grpo's advantages have std 1 whenever the spread dominates eps: scale-free.
  clear = [r for r in rows if r["reward_std"] > 100 * std_eps]
  out["grpo_unit_std_groups"] = len(clear)
  out["grpo_max_abs_std_minus_1"] = float(max((abs(r["std_grpo"] - 1) for r in clear),
                                              default=0.0))
  return out


def verdict(a: dict) -> tuple[bool | None, str]:
  """Agrees when grpo weighs the noise-only groups like a real success (at least half a
  one-success group's mean |advantage|) and dr_grpo at under a tenth of grpo's weight."""
  if not a["degenerate_groups"]:
    return None, ("no degenerate group among the rollouts: the case the report warns about "
                  "did not occur here.")
  weight = a["noise_weight_vs_one_success"]
  if not weight["grpo"]["n"]:
    return None, (f"{a['degenerate_groups']} of {a['groups']} groups are degenerate, but none "
                  "has any reward spread: every advantage is 0 under both estimators.")
  grpo_weight, dr_weight = weight["grpo"]["mean"], weight["dr_grpo"]["mean"]
  agrees = grpo_weight >= 0.5 and dr_weight < grpo_weight / 10
  text = (f"{a['degenerate_groups']} of {a['groups']} groups are degenerate (one correctness "
          f"for every rollout), {weight['grpo']['n']} of them with a reward spread (std "
          f"{a['degenerate']['reward_std']['max']:.2g} at most, from the shaping terms); "
          f"there grpo's mean |advantage| is {weight['grpo']['mean']:.2f} x (max "
          f"{weight['grpo']['max']:.2f} x) that of a group with one success in "
          f"{a['one_success_group_size']}, dr_grpo's {weight['dr_grpo']['mean']:.1e} x "
          f"(amplification 1 / std: {a['amplification']['degenerate']['mean']:.0f}x)")
  if a["mixed_groups"]:
    text += (f"; share of all |advantage| on degenerate groups: grpo "
             f"{a['share_of_abs_advantage_on_degenerate_grpo']:.1%}, dr_grpo "
             f"{a['share_of_abs_advantage_on_degenerate_dr_grpo']:.1%}")
  return agrees, text + (". Agrees with the report." if agrees else
                         ". Does not show the report's effect.")


def plot(rows, analysis, training):
  plt = common.pyplot()
  fig, axes = plt.subplots(1, 3 if training else 2, figsize=(15 if training else 10, 3.8))
  floor = 1e-9
  for label, marker in (("degenerate", "x"), ("mixed", "o")):
    subset = [r for r in rows if r["degenerate"] == (label == "degenerate")]
    x = [max(r["reward_std"], floor) for r in subset]
    for name, colour in (("grpo", "tab:red"), ("dr_grpo", "tab:blue")):
      axes[0].scatter(x, [max(r[f"mean_abs_{name}"], floor) for r in subset], marker=marker,
                      color=colour, alpha=0.6, label=f"{name}, {label} groups")
  axes[0].set_xscale("log")
  axes[0].set_yscale("log")
  axes[0].set_xlabel("reward std within the group")
  axes[0].set_ylabel("mean |advantage|")
  axes[0].set_title(f"{analysis['groups']} groups from rollouts")
  axes[0].legend(fontsize=7)
  weight = analysis["noise_weight_vs_one_success"]
  values = [weight[n]["mean"] or 0.0 for n in ESTIMATORS]
  axes[1].bar(ESTIMATORS, [max(v, floor) for v in values], color=["tab:red", "tab:blue"])
  axes[1].axhline(1.0, color="grey", ls=":", label=f"a group with 1 success in "
                  f"{analysis['one_success_group_size']}")
  axes[1].set_yscale("log")
  axes[1].set_ylabel("mean |advantage| / one-success group's")
  axes[1].set_title(f"noise-only groups ({weight['grpo']['n']} with spread)")
  axes[1].legend(fontsize=7)
  if training:
    for name, colour in (("grpo", "tab:red"), ("dr_grpo", "tab:blue")):
      curves = training["curves"][name]
      steps = sorted(set.intersection(*(set(c) for c in curves)))
      mean = [np.mean([c[s]["pass_rate"] for c in curves]) for s in steps]
      axes[2].plot(steps, mean, "o-", color=colour, label=name)
    axes[2].set_xlabel("RL step")
    axes[2].set_title("held-out pass rate (mean over seeds)")
    axes[2].legend(fontsize=7)
  return fig


def train_comparison(args) -> dict:
  curves = {name: [] for name in ESTIMATORS}
  for name in ESTIMATORS:
    for seed in range(args.seeds):
      cfg = rl_job(args, seed)
      cfg.rl.advantage = name
      cfg.learner.steps = args.train_steps
      cfg.eval.every = args.train_steps
      common.apply_rl_overrides(args, cfg)
      run = args.workdir / f"train_{name}_seed{seed}"
      common.run_job("rl", cfg, run)
      curves[name].append(fig5_pass_rate.eval_curve(run, cfg.eval.samples))
  out = {"steps": args.train_steps, "curves": curves, "final_pass_rate": {}}
  for name in ESTIMATORS:
    out["final_pass_rate"][name] = common.spread(
        [c[max(c)]["pass_rate"] for c in curves[name]])
    out[f"pass_rate_change_{name}"] = common.spread(
        [c[max(c)]["pass_rate"] - c[min(c)]["pass_rate"] for c in curves[name]])
  return out


def rl_job(args, seed: int):
  cfg = common.rl_config(args, seed, args.init_from)
  cfg.eval.at_start = True
  if args.smoke:
    cfg.rl.group_size = 4
    cfg.actors.slots = 4
    cfg.eval.every, cfg.eval.samples, cfg.eval.slots = 1, 1, 2
  if cfg.init_from:
    common.check_init_from(cfg.init_from)
  return cfg


def main(argv=None):
  p = common.parser(__doc__.splitlines()[0])
  p.add_argument("--runs", nargs="*", type=pathlib.Path, default=[],
                 help="RL run directories whose groups to analyse (default: make them)")
  p.add_argument("--init-from", default=None,
                 help="the SFT run the RL runs made here start from")
  p.add_argument("--train-steps", type=int, default=0,
                 help="steps of the grpo vs dr_grpo training comparison (0 = skip)")
  args = common.finish_args(p.parse_args(argv), NAME)
  common.check_kinds(args, ("rl",))
  if args.train_steps < 0:
    raise SystemExit(f"--train-steps must be >= 0, got {args.train_steps}.")
  common.start_jax()
  runs = list(args.runs)
  for run in runs:
    if not (run / "queue").is_dir():
      raise SystemExit(f"--runs {run}: not an RL run directory (no queue/ in it).")
  if not runs:
    for seed in range(args.seeds):
      cfg = rl_job(args, seed)
      common.apply_rl_overrides(args, cfg)
      run = args.workdir / f"seed{seed}"
      common.run_job("rl", cfg, run)
      runs.append(run)
  groups = [g for run in runs for g in common.queued_groups(run)]
  # The runs' own eps (config.json), so grpo here is the grpo those runs would have used.
  std_eps = json.loads((runs[0] / "config.json").read_text())["rl"]["std_eps"]
  rows = group_table(groups, std_eps)
  analysis = analyse(rows, std_eps)
  agrees, text = verdict(analysis)
  training = train_comparison(args) if args.train_steps else None
  if training:
    text += (f" Training {args.train_steps} steps: held-out pass rate change grpo "
             f"{training['pass_rate_change_grpo']['mean']:+.3f}, dr_grpo "
             f"{training['pass_rate_change_dr_grpo']['mean']:+.3f}.")
  numbers = {**common.header(args, "python -m experiments.findings.sec41_advantages"),
             "runs": [str(r) for r in runs], **analysis, "agrees": agrees, "verdict": text,
             "per_group": rows}
  if training:
    numbers["training"] = {**training, "curves": {
        n: [{str(k): v for k, v in c.items()} for c in cs]
        for n, cs in training["curves"].items()}}
  print("sec41:", text, flush=True)
  common.write_outputs(args, numbers, plot(rows, analysis, training))
  return numbers


if __name__ == "__main__":
  main()
