"""Learning rate x width on `tiny` continued pretraining: a 2x2 ablation on CPU.

  c2jax sweep experiments/sweeps/tiny_lr_width.py --workdir=runs/sweeps/tiny_lr_width --parallel=2

Each point trains configs/pretrain.py:tiny for 40 steps; the table has the final and best
training loss and the held-out eval loss, and the compute each point spent.
"""

from c2jax import sweep


def get_sweep(arg=None):
  del arg  # one variant
  return sweep.Sweep(
      verb="pretrain",
      config="configs/pretrain.py:tiny",
      fixed={"train.steps": 40, "train.warmup_steps": 4, "train.eval_every": 20,
             "train.checkpoint_every": 20},
      grid={"train.learning_rate": [1e-3, 3e-3], "model.hidden_size": [32, 64]},
      metrics={"loss": sweep.last("loss"), "min_loss": sweep.minimum("loss"),
               "eval_loss": sweep.last("eval_loss"), "train_flops": sweep.train_flops()})
