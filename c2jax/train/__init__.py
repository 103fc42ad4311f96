"""Training: TrainState, optimizer, the pure train step, and (later) loop and checkpoints."""

from c2jax.train.optimizer import make_optimizer, weight_decay_mask
from c2jax.train.step import Batch, TrainState, create_train_state, loss_fn, train_step

__all__ = ["Batch", "TrainState", "create_train_state", "loss_fn", "make_optimizer",
           "train_step", "weight_decay_mask"]
