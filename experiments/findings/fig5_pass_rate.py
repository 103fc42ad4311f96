"""Report Fig. 5: held-out mean pass rate and best-of-K both rise during RL.

  python -m experiments.findings.fig5_pass_rate --init-from runs/tiny_agent/sft \
      [--seeds 3] [--out DIR] [--workdir DIR] [--set rl.learner.steps=80] [--smoke]

Per seed s: `c2jax rl --config=configs/rl.py:tiny --config.learner.seed=s` from the SFT
checkpoint in --init-from, evaluating the same held-out tasks (eval.samples = K samples
each, temperature 1) at step 0 and every eval.every steps. The seed changes the rollout
and evaluation sampling, not the tasks, so the seeds are paired. Reads the eval/pass_rate
and eval/best_of_K rows of each run's metrics.jsonl; writes the curves (mean and per-seed)
and the numbers, and says whether both rose from step 0 to the last step in the mean
and in how many seeds.
"""

from __future__ import annotations

import numpy as np

from experiments.findings import common

NAME = "fig5_pass_rate"


def eval_curve(run, samples: int) -> dict[int, dict[str, float]]:
  """{step: {pass_rate, best_of_k, episodes}} from an RL run's held-out evaluation rows."""
  key = f"eval/best_of_{samples}"
  curve = {}
  for row in common.metrics_rows(run):
    if "eval/pass_rate" in row:
      if key not in row:
        raise KeyError(f"{run}/metrics.jsonl has eval rows without {key!r}: was the run made "
                       f"with eval.samples = {samples}?")
      curve[int(row["step"])] = {"pass_rate": float(row["eval/pass_rate"]),
                                 "best_of_k": float(row[key])}
  for step in curve:
    curve[step]["episodes"] = len(common.eval_records(run, step))
  if len(curve) < 2:
    raise ValueError(f"{run} evaluated at {sorted(curve)} only; the finding needs step 0 "
                     "and a later step (eval.at_start and eval.every).")
  return dict(sorted(curve.items()))


def summarise(curves: list[dict[int, dict]], samples: int) -> dict:
  steps = sorted(set.intersection(*(set(c) for c in curves)))
  first, last = steps[0], steps[-1]
  out = {"samples_k": samples, "steps": steps, "per_step": {}, "delta": {}}
  for step in steps:
    out["per_step"][step] = {
        metric: common.spread([c[step][metric] for c in curves])
        for metric in ("pass_rate", "best_of_k")}
    out["per_step"][step]["episodes"] = curves[0][step]["episodes"]
  for metric in ("pass_rate", "best_of_k"):
    deltas = [c[last][metric] - c[first][metric] for c in curves]
    out["delta"][metric] = {**common.spread(deltas), "seeds_up": int(sum(d > 0 for d in deltas)),
                            "seeds_down": int(sum(d < 0 for d in deltas))}
  episodes = out["per_step"][first]["episodes"]
  p = out["per_step"][first]["pass_rate"]["mean"]
  # One seed's pass rate over `episodes` held-out episodes (binomial, episodes treated as
  # independent): the noise a single curve carries.
  out["pass_rate_standard_error_one_seed"] = float(np.sqrt(max(p * (1 - p), 1e-12) /
                                                           max(episodes, 1)))
  rose = {m: out["delta"][m]["mean"] > 0 for m in ("pass_rate", "best_of_k")}
  out["both_rise"] = bool(all(rose.values()))
  out["verdict"] = (
      f"from step {first} to {last}: mean pass rate "
      f"{out['per_step'][first]['pass_rate']['mean']:.3f} -> "
      f"{out['per_step'][last]['pass_rate']['mean']:.3f} "
      f"(up in {out['delta']['pass_rate']['seeds_up']} of {len(curves)} seeds), "
      f"best-of-{samples} {out['per_step'][first]['best_of_k']['mean']:.3f} -> "
      f"{out['per_step'][last]['best_of_k']['mean']:.3f} "
      f"(up in {out['delta']['best_of_k']['seeds_up']} of {len(curves)} seeds); "
      + ("both rose, as in the report." if out["both_rise"] else
         "not both rose: this run does not reproduce the report's finding."))
  return out


def plot(curves, summary, samples):
  plt = common.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharex=True)
  steps = summary["steps"]
  for ax, metric, title in ((axes[0], "pass_rate", "held-out mean pass rate"),
                            (axes[1], "best_of_k", f"held-out best-of-{samples}")):
    for seed, curve in enumerate(curves):
      ax.plot(steps, [curve[s][metric] for s in steps], "-", alpha=0.35, lw=1,
              label=f"seed {seed}")
    mean = np.array([summary["per_step"][s][metric]["mean"] for s in steps])
    std = np.array([summary["per_step"][s][metric]["std"] for s in steps])
    ax.plot(steps, mean, "o-", color="black", lw=2, label=f"mean of {len(curves)}")
    ax.fill_between(steps, mean - std, mean + std, color="grey", alpha=0.2)
    ax.set_xlabel("RL step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  return fig


def main(argv=None):
  p = common.parser(__doc__.splitlines()[0])
  p.add_argument("--init-from", default=None,
                 help="the SFT run RL starts from (default: configs/rl.py's init_from)")
  args = common.finish_args(p.parse_args(argv), NAME)
  common.check_kinds(args, ("rl",))
  common.start_jax()
  curves = []
  for seed in range(args.seeds):
    cfg = common.rl_config(args, seed, args.init_from)
    cfg.eval.at_start = True
    if args.smoke:
      cfg.eval.every, cfg.eval.samples, cfg.eval.slots = 1, 2, 2
    common.apply_rl_overrides(args, cfg)
    if cfg.init_from:
      common.check_init_from(cfg.init_from)
    run = args.workdir / f"seed{seed}"
    common.run_job("rl", cfg, run)
    curves.append(eval_curve(run, cfg.eval.samples))
  summary = summarise(curves, cfg.eval.samples)
  numbers = {**common.header(args, "python -m experiments.findings.fig5_pass_rate"),
             "init_from": cfg.init_from or "(random init)", "rl_steps": cfg.learner.steps,
             "heldout_tasks": cfg.tasks.heldout_count, "eval_every": cfg.eval.every,
             "runs": [str(args.workdir / f"seed{s}") for s in range(args.seeds)],
             "curves": [{str(k): v for k, v in c.items()} for c in curves], **summary}
  print("fig5:", summary["verdict"], flush=True)
  common.write_outputs(args, numbers, plot(curves, summary, cfg.eval.samples))
  return numbers


if __name__ == "__main__":
  main()
