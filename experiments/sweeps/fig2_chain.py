"""Report Fig. 2 as a sweep: each point is one CPT -> SFT -> RL chain (`c2jax pipeline`).

  c2jax sweep experiments/sweeps/fig2_chain.py --workdir=runs/sweeps/fig2_chain --parallel=1
  c2jax sweep experiments/sweeps/fig2_chain.py:test --workdir=runs/fig2_chain --dry_run

The base config is configs/agent_sft.py:tiny_cpt_rl: pretraining (configs/pretrain.py:tiny)
for a swept number of steps (three log-spaced compute levels), then the agent traces, a
fixed SFT phase from that checkpoint and a fixed number of RL steps (configs/rl.py:tiny)
from the SFT checkpoint, all in the point's run directory (RUN/pretrain, RUN/sft, RUN/rl).
One table row per point: the CPT and SFT held-out losses and the RL reward (mean training
reward over the last quarter of the RL steps) with the held-out pass rate, read from the
stages by stage metrics (c2jax/sweep/metrics.py). The sizes follow
experiments/findings/fig2_cpt_to_rl.py; that script adds the correlation, the verdict and
the three-panel figure. Every point builds its own copy of the traces (same seed, so the
same traces).
"""

from c2jax import sweep

# (CPT step counts, seeds, SFT steps, SFT training traces, RL steps, warmup steps)
SIZES = {
    "default": ((25, 75, 225), (0,), 150, 320, 10, 5),
    # The test suite's: expands and validates, never run there.
    "test": ((1, 2, 4), (0,), 2, 4, 1, 1),
}
# Evaluate and checkpoint only at a run's last step (the loop always does both there).
AT_END = 10**9


def get_sweep(arg=None):
  arg = arg or "default"
  if arg not in SIZES:
    raise ValueError(f"fig2_chain.py:{arg}: expected one of {sorted(SIZES)}.")
  levels, seeds, sft_steps, traces, rl_steps, warmup = SIZES[arg]
  seeded = [{"pretrain.train.seed": seed, "sft.train.seed": seed, "rl.learner.seed": seed}
            if len(seeds) > 1 else {} for seed in seeds]
  points = [{"pretrain.train.steps": steps, **seed} for seed in seeded for steps in levels]
  return sweep.Sweep(
      verb="pipeline",
      config="configs/agent_sft.py:tiny_cpt_rl",
      fixed={"pretrain.train.eval_every": AT_END, "pretrain.train.checkpoint_every": AT_END,
             "pretrain.train.warmup_steps": warmup,
             "sft.train.steps": sft_steps, "sft.train.eval_every": AT_END,
             "sft.train.checkpoint_every": AT_END, "sft.train.warmup_steps": warmup,
             "traces.count": traces + 16, "traces.heldout": 16,
             "rl.learner.steps": rl_steps, "rl.eval.every": rl_steps,
             "rl.eval.at_start": False},
      points=points,
      metrics={"cpt_compute": sweep.compute_6nd(stage="pretrain"),
               "cpt_loss": sweep.last("eval_loss", stage="pretrain"),
               "sft_loss": sweep.last("eval_loss", stage="sft"),
               "rl_reward": sweep.mean_tail("reward", 0.25, stage="rl"),
               # The pipeline's own summary.json at the point's root.
               "heldout_pass_rate": sweep.from_json("summary.json", "rl.eval.pass_rate")})
