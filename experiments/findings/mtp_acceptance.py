"""Expected MTP draft acceptance of RL checkpoints, with their own heads or with others.

  python -m experiments.findings.mtp_acceptance --rl_run runs/rl_online --steps 5,10,15 \
      --heads_from runs/tiny/mtp

For each checkpoint step of an `c2jax rl` run, on the rollouts the learner trained at that
step, the exact expected acceptance of the first draft at temperature 1 (speculative
sampling keeps a draft with probability sum_v min(p(v), q(v)) in expectation, p the
policy's next-token distribution, q the MTP head's), teacher-forced over the generated
tokens, for two drafters on the same trunk: the checkpoint's own MTP heads (trained
online when rl.mtp_loss_weight > 0) and the heads of --heads_from (e.g. the MTP phase the
RL run started from, i.e. heads never trained during RL). No sampling noise: the same
sequences and trunk for both, so the difference is the heads' alone. Also the greedy
agreement (MTP argmax = policy argmax). Prints one JSON line per (step, heads) and a
markdown table (docs/benchmarks.md, "MTP acceptance during RL").
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np


def _load_params(run_dir: pathlib.Path, cfg, step: int | None):
  from c2jax import model  # pylint: disable=import-outside-toplevel
  from c2jax.train import checkpoint as checkpoint_lib  # pylint: disable=import-outside-toplevel

  shapes = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  ckpt = checkpoint_lib.Checkpointer(run_dir / "checkpoints", async_save=False)
  try:
    steps = ckpt.steps()
    if not steps or (step is not None and step not in steps):
      raise SystemExit(f"{run_dir}/checkpoints has steps {steps}; step {step} is not one.")
    return ckpt.restore_params(step, shapes)
  finally:
    ckpt.close()


def _model_cfg(run_dir: pathlib.Path):
  from c2jax import config as configlib  # pylint: disable=import-outside-toplevel
  from c2jax.model import config as model_config  # pylint: disable=import-outside-toplevel

  path = run_dir / "config.json"
  if not path.is_file():
    raise SystemExit(f"{path} does not exist; pass a c2jax run directory.")
  cfg = model_config.defaults()
  configlib.apply_overrides(cfg, json.loads(path.read_text())["model"])
  if cfg.num_mtp_layers < 1:
    raise SystemExit(f"{run_dir}: model.num_mtp_layers = 0; the run has no MTP heads.")
  return cfg


def _sequences(run_dir: pathlib.Path, step: int, length: int):
  """(tokens [N, length], valid, loss_mask) of the rollouts the learner trained at `step`."""
  from c2jax.rl.queue.group_queue import GroupQueue  # pylint: disable=import-outside-toplevel
  from c2jax.rl.queue.group_store import Group  # pylint: disable=import-outside-toplevel

  queue = GroupQueue(run_dir / "queue", capacity=1, max_lag=0)
  ids = queue.trained_steps().get(step, [])
  if not ids:
    raise SystemExit(f"{run_dir}/queue has no groups trained at step {step}.")
  rows = []
  for group_id in ids:
    [path] = (run_dir / "queue" / "trained").glob(f"*.{group_id}.npz")
    rows += Group.from_bytes(path.read_bytes()).segments
  tokens = np.zeros((len(rows), length), np.int32)
  valid, loss_mask = np.zeros_like(tokens), np.zeros_like(tokens)
  for i, segment in enumerate(rows):
    n = min(len(segment["tokens"]), length)
    tokens[i, :n], valid[i, :n] = segment["tokens"][:n], 1
    loss_mask[i, :n] = segment["loss_mask"][:n]
  return tokens, valid, loss_mask


def make_scorer(cfg):
  """jitted (params, tokens [1, L], valid, loss_mask) -> (sum of expected acceptance,
  sum of greedy agreement, count) over positions whose drafted token was generated."""
  from c2jax import model  # pylint: disable=import-outside-toplevel
  from c2jax.model import mtp  # pylint: disable=import-outside-toplevel

  def score(params, tokens, valid, loss_mask):
    hidden, _, _ = model.apply(cfg, params, tokens, segment_ids_BxL=valid, head=False)
    kernel = params["lm_head"]["kernel"].astype(hidden.dtype)
    main = jnp.einsum("bld,dv->blv", hidden, kernel, preferred_element_type=jnp.float32)
    draft = mtp.apply(cfg, params, hidden, tokens, segment_ids_BxL=valid)[0][0]
    # The head at i (hidden h_i, token t_{i+1}) drafts t_{i+2}; the policy's law of that
    # token is the main head's at i + 1.
    p = jax.nn.softmax(main[:, 1:], axis=-1)
    q = jax.nn.softmax(draft[:, :-1], axis=-1)
    overlap = jnp.minimum(p, q).sum(-1)
    agree = (p.argmax(-1) == q.argmax(-1)).astype(jnp.float32)
    weight = jnp.pad(loss_mask[:, 2:] * valid[:, 2:], ((0, 0), (0, 1))).astype(jnp.float32)
    return (overlap * weight).sum(), (agree * weight).sum(), weight.sum()

  return jax.jit(score)


def measure(scorer, params, tokens, valid, loss_mask) -> dict:
  totals = np.zeros(3)
  for i in range(len(tokens)):
    totals += np.asarray(scorer(params, tokens[i:i + 1], valid[i:i + 1], loss_mask[i:i + 1]))
  return {"expected_acceptance": totals[0] / totals[2], "greedy_agree": totals[1] / totals[2],
          "positions": int(totals[2])}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rl_run", type=pathlib.Path, required=True)
  parser.add_argument("--steps", required=True, help="comma-separated checkpoint steps")
  parser.add_argument("--heads_from", type=pathlib.Path, required=True,
                      help="a run whose newest checkpoint's MTP heads to compare with")
  parser.add_argument("--length", type=int, default=0, help="0 = actors.max_length")
  args = parser.parse_args(argv)
  from c2jax.model import mtp  # pylint: disable=import-outside-toplevel

  cfg = _model_cfg(args.rl_run)
  length = args.length or json.loads((args.rl_run / "config.json").read_text())[
      "actors"]["max_length"]
  other_heads = _load_params(args.heads_from, _model_cfg(args.heads_from), None)[
      mtp.PARAMS_KEY]
  scorer = make_scorer(cfg)
  rows = []
  for step in (int(s) for s in args.steps.split(",")):
    params = _load_params(args.rl_run, cfg, step)
    data = _sequences(args.rl_run, step, length)
    for label, heads in (("own", params[mtp.PARAMS_KEY]), ("heads_from", other_heads)):
      row = {"step": step, "heads": label,
             **measure(scorer, {**params, mtp.PARAMS_KEY: heads}, *data)}
      print(json.dumps(row), flush=True)
      rows.append(row)
  print("| step | heads | expected acceptance (draft 1, T=1) | greedy agreement | positions |")
  print("|---|---|---|---|---|")
  for row in rows:
    print(f"| {row['step']} | {row['heads']} | {row['expected_acceptance']:.3f} | "
          f"{row['greedy_agree']:.3f} | {row['positions']} |")


if __name__ == "__main__":
  main()
