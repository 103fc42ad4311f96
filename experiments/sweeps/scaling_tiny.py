"""A compute ladder on `tiny` continued pretraining: model size x training steps.

  c2jax sweep experiments/sweeps/scaling_tiny.py --workdir=runs/sweeps/scaling_tiny --parallel=2
  SWEEP_DIR=$PWD/runs/sweeps/scaling_tiny jupyter execute experiments/notebooks/scaling_laws.ipynb

Three widths (the MLP widening with them) times three step counts: nine points spanning
about 30x in training compute. The table carries each point's held-out eval loss and its
compute both as 6 x active parameters x tokens (`compute_6nd`) and as the model's FLOP
count with attention (`train_flops`), which experiments/notebooks/scaling_laws.ipynb fits
with L(C) = E + A * C^(-alpha). `:test` is a 2x2 of a few steps (the test suite's).
"""

from c2jax import sweep

LADDERS = {
    # (hidden sizes, step counts, evaluation batches, checkpoint interval)
    "default": ((32, 64, 128), (50, 100, 200), 8, 25),
    "test": ((32, 64), (3, 6), 2, 2),
}


def get_sweep(arg=None):
  arg = arg or "default"
  if arg not in LADDERS:
    raise ValueError(f"scaling_tiny.py:{arg}: expected one of {sorted(LADDERS)}.")
  widths, step_counts, eval_batches, checkpoint_every = LADDERS[arg]
  points = [{"model.hidden_size": width, "model.intermediate_size": 3 * width,
             "train.steps": steps} for width in widths for steps in step_counts]
  return sweep.Sweep(
      verb="pretrain",
      config="configs/pretrain.py:tiny",
      # Held-out loss before the first step and after the last (the loop always evaluates
      # the final step); no evaluation in between.
      fixed={"train.warmup_steps": 2, "train.eval_batches": eval_batches,
             "train.eval_every": 10**9, "train.checkpoint_every": checkpoint_every},
      points=points,
      metrics={"eval_loss": sweep.last("eval_loss"), "loss": sweep.last("loss"),
               "tokens": sweep.tokens(), "active_params": sweep.active_params(),
               "compute_6nd": sweep.compute_6nd(), "train_flops": sweep.train_flops()})
