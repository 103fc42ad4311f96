"""The training loop around the pure `train_step`: data, mesh, checkpoints, metrics, eval.

    summary = loop.train(config, workdir)

It is resumable by construction: rerunning the same command after a kill restores the
newest readable checkpoint (TrainState + data-iterator state), truncates metrics.jsonl to
that step and continues the identical loss curve. Metrics are read one step late so the
host never stalls device dispatch, except at checkpoint steps, where the step's loss is
checked before anything is saved: a NaN/inf loss stops the run with the last good
checkpoint intact.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from c2jax import model, parallel
from c2jax.hf import placement
from c2jax.hf import sources as init_sources
from c2jax.model import mtp as mtp_lib
from c2jax.parallel import context as context_lib
from c2jax.parallel import distributed
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import jobs, model_source
from c2jax.train.metrics import MetricsWriter
from c2jax.train.optimizer import make_optimizer
from c2jax.train.step import MTPWeights, TrainState, loss_fn, train_step


class NonFiniteLossError(RuntimeError):
  pass


@dataclasses.dataclass
class Runtime:
  """Everything derived from a config that the loop and eval share."""
  cfg: object
  mesh: jax.sharding.Mesh
  rules: tuple
  optimizer: optax.GradientTransformation
  state_shardings: object
  batch_sharding: jax.sharding.NamedSharding

  def scope(self):
    return _Scope(self.mesh, self.rules)


class _Scope:
  """Mesh + logical-axis rules active while tracing and running jitted functions."""

  def __init__(self, mesh, rules):
    # jax.set_mesh (jax >= 0.7) sets the abstract mesh that flax's logical constraints and
    # expert parallelism read; a bare `with mesh:` no longer does.
    set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
    self._contexts = [set_mesh(mesh), nn.logical_axis_rules(rules)]

  def __enter__(self):
    for context in self._contexts:
      context.__enter__()

  def __exit__(self, *exc):
    for context in reversed(self._contexts):
      context.__exit__(*exc)


def build_runtime(cfg) -> Runtime:
  jobs.validate(cfg, jax.device_count())
  mesh = parallel.make_mesh(cfg.parallel.mesh)
  rules = parallel.rules_of(cfg.parallel)
  t = cfg.train
  optimizer, _ = make_optimizer(
      learning_rate=t.learning_rate, total_steps=t.steps, warmup_steps=t.warmup_steps,
      schedule=t.schedule, weight_decay=t.weight_decay, b1=t.b1, b2=t.b2,
      clip_norm=t.clip_norm, end_lr_fraction=t.end_lr_fraction,
      state_dtype=cfg.model.opt_state_dtype)
  param_specs = model.param_axes(cfg.model)
  abstract_params = jax.eval_shape(lambda: model.init(cfg.model, jax.random.key(0)))
  abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
  opt_specs = _optimizer_specs(abstract_opt, param_specs)
  specs = TrainState(step=jax.sharding.PartitionSpec(), params=param_specs,
                     opt_state=opt_specs)
  state_shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
  batch_sharding = nn.logical_to_mesh_sharding(
      jax.sharding.PartitionSpec("batch", "length"), mesh, rules)
  return Runtime(cfg, mesh, rules, optimizer, state_shardings, batch_sharding)


def _dict_keys(path) -> tuple:
  return tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))


def _optimizer_specs(abstract_opt, param_specs):
  """Optimizer-state leaves shaped like a parameter (Adam moments) share its sharding.

  They are found by their key path: an optimizer state nests copies of the parameter tree,
  so a moment's dict-key path ends with its parameter's path. Scalars (counts) replicate.
  """
  by_path = {_dict_keys(path): spec for path, spec in jax.tree_util.tree_leaves_with_path(
      param_specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))}

  def spec_of(path, leaf):
    keys = _dict_keys(path)
    for start in range(len(keys)):
      spec = by_path.get(keys[start:])
      if spec is not None and len(spec) == leaf.ndim:
        return spec
    return jax.sharding.PartitionSpec()
  return jax.tree_util.tree_map_with_path(spec_of, abstract_opt)


def init_state(rt: Runtime) -> TrainState:
  def create(rng):
    params = model.init(rt.cfg.model, rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=rt.optimizer.init(params))
  with rt.scope():
    return jax.jit(create, out_shardings=rt.state_shardings)(
        jax.random.key(rt.cfg.train.seed))


def abstract_state(rt: Runtime) -> TrainState:
  shapes = jax.eval_shape(
      lambda: TrainState(step=jnp.zeros((), jnp.int32),
                         params=model.init(rt.cfg.model, jax.random.key(0)),
                         opt_state=None))
  shapes = shapes.replace(opt_state=jax.eval_shape(rt.optimizer.init, shapes.params))
  return checkpoint_lib.abstract_like(shapes, rt.state_shardings)


def device_batch(rt: Runtime, batch: dict) -> dict:
  """A host batch on the mesh; under context parallelism with load balancing, permuted
  along the sequence first (the loss is a masked sum over tokens, so it is unchanged)."""
  batch = {key: np.asarray(value) for key, value in batch.items() if key in jobs.BATCH_KEYS}
  shards = context_lib.num_shards(rt.mesh, rt.rules)
  if shards > 1 and rt.cfg.parallel.context_load_balance:
    batch = context_lib.balance_batch(batch, shards)
  return {key: jax.make_array_from_process_local_data(rt.batch_sharding, value)
          for key, value in batch.items()}


def make_train_step(rt: Runtime):
  step = functools.partial(train_step, rt.cfg.model, rt.optimizer,
                           mtp=MTPWeights.from_train_config(rt.cfg.train))
  return jax.jit(step, in_shardings=(rt.state_shardings, rt.batch_sharding),
                 out_shardings=(rt.state_shardings, None), donate_argnums=0)


def make_eval_step(rt: Runtime):
  def eval_step(params, batch):
    _, stats = loss_fn(rt.cfg.model, params, batch,
                       MTPWeights.from_train_config(rt.cfg.train))
    return stats["ce_loss"] * stats["tokens"], stats["tokens"]
  return jax.jit(eval_step, in_shardings=(rt.state_shardings.params, rt.batch_sharding))


def evaluate(rt: Runtime, eval_step, params, dataset, max_batches: int) -> float | None:
  """Mean per-token loss over up to `max_batches` batches of a finite dataset."""
  total = count = 0.0
  with rt.scope():
    for i, batch in enumerate(dataset):
      if i >= max_batches:
        break
      nll, tokens = eval_step(params, device_batch(rt, batch))
      total, count = total + float(nll), count + float(tokens)
  return total / count if count else None


def initial_params(rt: Runtime, state: TrainState) -> TrainState:
  """A fresh run of a later phase starts from the previous phase's newest parameters
  (`restore_init_params`, placed with the runtime's shardings)."""
  if not rt.cfg.init_from:
    return state
  shardings = rt.state_shardings.params
  with rt.scope():
    params = restore_init_params(rt.cfg, state.params, shardings)
  return state.replace(params=params)


def restore_init_params(cfg, fresh_params, shardings=None):
  """`fresh_params` replaced by the parameters of `cfg.init_from`: the newest checkpoint
  of a c2jax run, an HF model directory or `c2jax convert` output (hf/sources.py tells
  them apart by what is on disk; the latter two stream shard by shard, hf/placement.py).

  Multi-token prediction may be attached or left off between phases:
  - the config has MTP modules (model.num_mtp_layers > 0) and the checkpoint has none:
    the trunk is restored and params['mtp_layers'] keep their fresh initialisation (how
    MTP starts from a checkpoint cut mid-way through pretraining);
  - the checkpoint has MTP modules and the config has none: they are deliberately
    dropped (a phase that needs no drafter, e.g. an ablation without MTP), with a log line.
  Any other difference (a parameter missing, a shape changed, e.g. num_mtp_layers 2 vs
  1) is an error naming the parameter. `shardings` (a tree like `fresh_params`) places
  the restored arrays; None restores them to the default device.
  """
  source = cfg.init_from
  directory = pathlib.Path(source).expanduser().absolute()
  if not directory.exists():
    raise FileNotFoundError(
        f"config.init_from = {source!r} does not exist; run the previous phase first "
        "(see configs/longctx.py and configs/sft.py for the chain), or point it at an HF "
        "model directory.")
  if init_sources.detect(directory) == "run":
    saved, where, restore = _orbax_source(directory, source)
  else:
    loaded = init_sources.open_source(directory)
    saved, where = _nested(loaded.shapes), f"{directory} ({loaded.kind})"

    def restore(abstract, placement_shardings):
      return placement.place(loaded, abstract, placement_shardings)
  fresh_mtp = mtp_lib.PARAMS_KEY in fresh_params and mtp_lib.PARAMS_KEY not in saved
  wanted = {k: v for k, v in fresh_params.items()
            if not (fresh_mtp and k == mtp_lib.PARAMS_KEY)}
  _check_restorable(saved, wanted, where)
  if shardings is not None:
    shardings = {k: v for k, v in shardings.items() if k in wanted}
  params = restore(checkpoint_lib.abstract_like(wanted), shardings)
  print(f"init: parameters from {where}", flush=True)
  if fresh_mtp:
    params = {**params, mtp_lib.PARAMS_KEY: fresh_params[mtp_lib.PARAMS_KEY]}
    print(f"init: the checkpoint has no '{mtp_lib.PARAMS_KEY}'; the "
          f"{cfg.model.num_mtp_layers} MTP module(s) start from a fresh initialisation "
          "(trunk, embedding and head restored)", flush=True)
  elif mtp_lib.PARAMS_KEY in saved and mtp_lib.PARAMS_KEY not in fresh_params:
    print(f"init: dropping the checkpoint's '{mtp_lib.PARAMS_KEY}' "
          "(config.model.num_mtp_layers = 0)", flush=True)
  return params


def _orbax_source(directory: pathlib.Path, source: str):
  """(saved shapes, description, restore(abstract, shardings)) of a c2jax run."""
  if (directory / "checkpoints").is_dir():
    directory = directory / "checkpoints"
  previous = checkpoint_lib.Checkpointer(directory, async_save=False)
  if not previous.steps():
    previous.close()
    raise FileNotFoundError(
        f"config.init_from = {source!r} has no checkpoints; run the previous phase first "
        "(see configs/longctx.py and configs/sft.py for the chain).")
  step = previous.steps()[-1]

  def restore(abstract, shardings):
    if shardings is not None:
      abstract = checkpoint_lib.abstract_like(abstract, shardings)
    try:
      return previous.restore_params(step, abstract)
    finally:
      previous.close()
  return _saved_param_shapes(directory, step), f"{directory} step {step}", restore


def _nested(shapes: dict) -> dict:
  tree: dict = {}
  for path, shape in shapes.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = tuple(shape)
  return tree


def _saved_param_shapes(directory: pathlib.Path, step: int) -> dict:
  """The saved parameter tree of a checkpoint step, as shapes, read from orbax metadata
  (no array is loaded)."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    tree = handler.metadata(directory / str(step) / "state").tree
  finally:
    handler.close()
  return jax.tree.map(lambda m: tuple(m.shape), tree["params"],
                      is_leaf=lambda m: hasattr(m, "shape"))


def _check_restorable(saved: dict, wanted: dict, where: str) -> None:
  saved_shapes = {_dict_keys(path): shape for path, shape in
                  jax.tree_util.tree_leaves_with_path(saved, is_leaf=_is_shape)}
  for path, leaf in jax.tree_util.tree_leaves_with_path(wanted):
    keys = _dict_keys(path)
    name = "/".join(keys)
    if keys not in saved_shapes:
      raise ValueError(
          f"config.init_from: parameter {name} is not in the checkpoint {where}; the "
          "previous phase trained a different model. Make config.model match it.")
    if saved_shapes[keys] != tuple(leaf.shape):
      hint = (" (config.model.num_mtp_layers differs from the checkpoint's)"
              if keys[0] == mtp_lib.PARAMS_KEY else "")
      raise ValueError(
          f"config.init_from: parameter {name} has shape {saved_shapes[keys]} in the "
          f"checkpoint {where} but {tuple(leaf.shape)} in this config{hint}; make "
          "config.model match the previous phase.")


def _is_shape(x) -> bool:
  return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def train(cfg, workdir: str | pathlib.Path) -> dict:
  """Runs (or resumes) a job to `cfg.train.steps`; returns a summary dict."""
  workdir = pathlib.Path(workdir).expanduser()
  workdir.mkdir(parents=True, exist_ok=True)
  # Multi-process runs join here, before anything asks JAX for its devices.
  distributed.initialize(cfg.parallel.distributed)
  # The model the checkpoint in init_from trained, with this phase's declared changes.
  cfg = model_source.resolve(cfg)
  rt = build_runtime(cfg)
  t = cfg.train
  datasets = jobs.datasets(cfg)
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", keep=t.keep_checkpoints,
                                     every=t.checkpoint_every)
  (workdir / "config.json").write_text(cfg.to_json_best_effort(indent=2))
  with rt.scope():
    restored = ckpt.restore_latest(abstract_state(rt))
  iterator = iter(datasets.train)
  if restored is None:
    start, state = 0, initial_params(rt, init_state(rt))
  else:
    start, state, data_state = restored
    iterator.set_state(data_state)
    print(f"resume: step {start} from {ckpt.directory}", flush=True)
  writer = MetricsWriter(workdir, resume_step=start)
  step_fn, eval_step = make_train_step(rt), make_eval_step(rt)
  tokens_per_step = t.batch_size * t.seq_len
  pending, last, begun, eval_rows = None, {}, time.time(), []

  def report(step, metrics):
    row = writer.write(step, {k: float(v) for k, v in metrics.items()})
    loss = float(metrics["loss"])
    if not math.isfinite(loss):
      raise NonFiniteLossError(
          f"loss is {loss} at step {step}; stopping. The last good checkpoint is "
          f"step {max(ckpt.steps(), default=0)} in {ckpt.directory}. Lower "
          "config.train.learning_rate or check the data, then rerun.")
    return row

  try:
    if t.eval_every and start == 0:
      # The starting point of every curve: held-out loss before the first update.
      row = run_evals(rt, eval_step, state.params, datasets, 0)
      eval_rows.append(writer.write(0, row))
      print("eval " + json.dumps({"step": 0, **row}), flush=True)
    for step in range(start + 1, t.steps + 1):
      with rt.scope():
        state, metrics = step_fn(state, device_batch(rt, next(iterator)))
      if pending is not None:
        last = report(*pending)
      pending = (step, metrics)
      at_checkpoint = step % t.checkpoint_every == 0 or step == t.steps
      if at_checkpoint:
        last, pending = report(*pending), None
        ckpt.save(step, state, iterator.get_state(), cfg.to_dict(), force=True)
      if step % t.log_every == 0 or step == t.steps:
        done = step - start
        rate = done * tokens_per_step / (time.time() - begun)
        eta = (t.steps - step) * tokens_per_step / max(rate, 1e-9)
        shown = last.get("loss", float("nan"))
        print(f"step {step}/{t.steps}  loss {shown:.4f}  {rate:,.0f} tok/s  "
              f"ETA {eta:,.0f}s", flush=True)
      if t.eval_every and (step % t.eval_every == 0 or step == t.steps):
        if pending is not None:
          last, pending = report(*pending), None
        row = run_evals(rt, eval_step, state.params, datasets, step)
        eval_rows.append(writer.write(step, row))
        print("eval " + json.dumps({"step": step, **row}), flush=True)
    if pending is not None:
      last = report(*pending)
  finally:
    ckpt.close()
    writer.close()
  return {"steps": t.steps, "final_loss": last.get("loss"), "evals": eval_rows,
          "workdir": str(workdir)}


def run_evals(rt: Runtime, eval_step, params, datasets, step: int) -> dict:
  row = {}
  for name, make_dataset in datasets.evals.items():
    value = evaluate(rt, eval_step, params, make_dataset(), rt.cfg.train.eval_batches)
    if value is not None:
      row[name] = value
      if name == "codebase_loss":
        row["codebase_perplexity"] = math.exp(min(value, 50.0))
  return row
