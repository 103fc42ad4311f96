"""Training job configs (pretrain / long-context / SFT): schema, validation, datasets.

A job config has groups: model (c2jax/model/variants), data (c2jax.data.default_config),
train (loop and optimizer), parallel (mesh + logical rules), sft (chat data for the SFT
phase), plus `task` ('pretrain' | 'sft'), `init_from` (a previous phase's workdir, an HF
model directory or a converted checkpoint) and `model_changes` (the model keys the phase
changes on purpose; the rest of the model is inherited from init_from).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import ml_collections

from c2jax import config as configlib
from c2jax import data, parallel
from c2jax.data import streams
from c2jax.model import config as model_config
from c2jax.model import lineage, variants
from c2jax.parallel import context
from c2jax.train import accumulate, metrics, profiling
from c2jax.train.optimizer import SCHEDULES

BATCH_KEYS = ("inputs", "targets", "positions", "segment_ids", "loss_mask")
TASKS = ("pretrain", "sft")
LOSS_IMPLS = ("c2jax", "tokamax")  # train.loss_impl


def train_defaults() -> ml_collections.ConfigDict:
  t = ml_collections.ConfigDict()
  t.seed = 0
  t.steps = 200
  t.batch_size = 8
  # The training data as this many streams, fixed when the run starts (0: one per process
  # of the first start). Each is its own shuffled, packed pipeline of batch_size /
  # data_streams rows; a process reads the streams of its rows. A run resumes on any
  # process count that divides it with the same batches (c2jax.data.streams): set it to a
  # multiple of every process count a run may move to (e.g. 8 to go between 1, 2, 4, 8).
  t.data_streams = 0
  # Gradient accumulation: each step's batch runs as this many sequential microbatches of
  # batch_size / microbatches rows (one optimizer update; same loss as the whole batch).
  t.microbatches = 1
  t.seq_len = 128
  # The cross entropy over chunks of this many vocabulary columns, straight from the final
  # hidden state: no float32 [batch, length, vocab] logits (0: from the full logits).
  t.loss_vocab_chunk = 4096
  # Whose cross entropy: 'c2jax' (the above) | 'tokamax' (tokamax's fused linear cross
  # entropy: its Pallas kernel on a TPU, 0.47 GB of temporaries where full logits take
  # 5.4 GB at Kimi-K2.5's vocabulary; the vocabulary must be a multiple of 128 there,
  # of 2,048 on a GPU; docs/kernels.md).
  t.loss_impl = "c2jax"
  t.learning_rate = 3e-3
  t.warmup_steps = 20
  t.schedule = "cosine"
  t.end_lr_fraction = 0.1
  t.weight_decay = 0.1
  t.b1 = 0.9
  t.b2 = 0.95
  t.clip_norm = 1.0
  t.log_every = 10
  t.eval_every = 50
  t.eval_batches = 8
  t.checkpoint_every = 50
  t.keep_checkpoints = 3
  # Multi-token prediction (used when model.num_mtp_layers > 0): KL to the main head's
  # distribution and data cross-entropy weights; a frozen trunk trains the MTP modules
  # alone (attached to a finished checkpoint), otherwise everything trains jointly.
  t.mtp_kl_weight = 1.0
  t.mtp_ce_weight = 0.0
  t.mtp_frozen_trunk = False
  # The MTP loss over chunks of this many vocabulary columns, the teacher's logits
  # recomputed per chunk: no [batch, length, vocab] array (0: from the full main logits).
  t.mtp_vocab_chunk = 8192
  return t


def job_defaults(variant: str = "tiny") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = "pretrain"
  c.model = variants.get(variant)
  c.data = data.default_config()
  c.data.vocab_size = c.model.vocab_size
  c.train = train_defaults()
  c.parallel = parallel.default_parallel_config()
  c.metrics = metrics.default_config()
  c.profile = profiling.default_config()
  c.init_from = ""
  # Model keys this phase changes on purpose when it starts from init_from (dotted, e.g.
  # 'rope.factor'); every other architecture key is inherited (c2jax/model/lineage.py).
  c.model_changes = ()
  # tool_format: the agent's (agent.tool_format); with data.tokenizer_dir, trace tool-call
  # ids are rewritten to its convention (Kimi prints functions.NAME:IDX back to the model).
  c.sft = ml_collections.ConfigDict({"train_path": "", "heldout_path": "",
                                     "tool_format": "c2jax"})
  return c


def validate(cfg, num_devices: int | None = None) -> None:
  """Raises ConfigError naming the key; `num_devices` adds the checks that need the mesh."""
  reference = job_defaults()
  for key in cfg.keys():
    if key not in reference:
      raise configlib.ConfigError(key, f"is not a job config key ({sorted(reference)}).")
  configlib.check_choice(cfg, "task", TASKS)
  model_config.validate(cfg.model)
  lineage.check_declared(cfg.model_changes)
  configlib.check_keys(cfg.train, reference.train, "train.")
  configlib.check_keys(cfg.data, reference.data, "data.")
  configlib.check_choice(cfg, "train.schedule", SCHEDULES)
  metrics.validate(cfg.metrics)
  profiling.validate(cfg.profile)
  for key in ("train.steps", "train.batch_size", "train.microbatches", "train.seq_len", "train.learning_rate",
              "train.log_every", "train.checkpoint_every", "train.keep_checkpoints",
              "train.eval_batches", "data.vocab_size"):
    configlib.check_positive(cfg, key)
  for key in ("train.eval_every", "train.data_streams", "train.mtp_kl_weight",
              "train.mtp_ce_weight", "train.mtp_vocab_chunk", "train.loss_vocab_chunk"):
    configlib.check_positive(cfg, key, allow_zero=True)
  configlib.check_at_most(cfg, "data.vocab_size", "model.vocab_size")
  configlib.check_choice(cfg, "train.loss_impl", LOSS_IMPLS)
  if cfg.train.loss_impl == "tokamax" and cfg.model.vocab_size % 128:
    raise configlib.ConfigError(
        "train.loss_impl", f"= 'tokamax' needs model.vocab_size to be a multiple of 128 "
        f"(its TPU kernel reads past a vocabulary that is not); it is "
        f"{cfg.model.vocab_size}. Pad the vocabulary or use 'c2jax'.")
  if cfg.data.tokenizer_dir is not None:  # a released model's tokenizer sets the vocabulary
    vocab = data.load_model_tokenizer(cfg.data.tokenizer_dir).vocab_size
    if vocab > cfg.model.vocab_size:
      raise configlib.ConfigError("data.tokenizer_dir", f"holds a tokenizer of {vocab} tokens "
                                  f"but model.vocab_size is {cfg.model.vocab_size}; use the "
                                  "model the tokenizer belongs to.")
  configlib.check_at_most(cfg, "train.seq_len", "model.max_position")
  parallel.validate_parallel(cfg.parallel, num_devices)
  if cfg.task == "sft":
    from c2jax.toolcalls import formats  # pylint: disable=g-import-not-at-top
    configlib.check_choice(cfg, "sft.tool_format", formats.format_names())
  if cfg.task == "sft" and not cfg.sft.train_path:
    raise configlib.ConfigError("sft.train_path", "is empty; give a JSONL of conversations.")
  accumulate.check_divisible(cfg.train.batch_size, cfg.train.microbatches, 1,
                             "train.microbatches", "train.batch_size")
  if num_devices is None:
    return
  batch_ways = 1
  sizes = parallel.mesh.mesh_shape(cfg.parallel.mesh, num_devices)
  for name, axes in parallel.rules_of(cfg.parallel):
    if name == "batch":
      for axis in (axes if isinstance(axes, tuple) else (axes,)):
        batch_ways *= sizes.get(axis, 1) if axis else 1
      break
  if cfg.train.batch_size % batch_ways:
    raise configlib.ConfigError(
        "train.batch_size", f"= {cfg.train.batch_size} must be divisible by the {batch_ways} "
        "devices the 'batch' rule shards it over.")
  accumulate.check_divisible(cfg.train.batch_size, cfg.train.microbatches, batch_ways,
                             "train.microbatches", "train.batch_size")
  _validate_context(cfg, sizes)


def _validate_context(cfg, sizes: dict[str, int]) -> None:
  shards = context.num_shards(sizes, parallel.rules_of(cfg.parallel))
  balanced = cfg.parallel.context_load_balance
  if shards == 1:
    return
  try:
    context.check_length(cfg.train.seq_len, shards, balanced)
  except ValueError as e:
    raise configlib.ConfigError("train.seq_len", str(e)) from None
  if balanced and cfg.model.num_mtp_layers:
    raise configlib.ConfigError(
        "parallel.context_load_balance",
        "is True, but MTP layers shift tokens along the sequence, which needs the original "
        "token order; set it False (contiguous context shards) or use parallel.mesh.context=1.")


@dataclasses.dataclass
class Datasets:
  train: object  # a streams.StreamSet of grain IterDatasets (checkpointable iterator)
  evals: dict[str, Callable[[], object]]  # eval name -> fresh finite dataset


@dataclasses.dataclass(frozen=True)
class DataPlan:
  """Which training data streams this process reads (c2jax.data.streams)."""
  count: int  # the run's streams
  held: tuple[int, ...]  # the ones whose rows this process's devices hold

  @classmethod
  def per_process(cls) -> "DataPlan":
    """One stream per process, this process's own: a run's first start by default."""
    return cls(jax.process_count(), (jax.process_index(),))


def process_rows(sharding, global_shape: tuple[int, ...]) -> list[tuple[int, int]]:
  """The [start, stop) ranges of global batch rows held by this process's devices."""
  spans = set()
  for device, index in sharding.devices_indices_map(global_shape).items():
    if device.process_index == jax.process_index():
      rows = index[0]
      spans.add((rows.start or 0, global_shape[0] if rows.stop is None else rows.stop))
  merged = []
  for start, stop in sorted(spans):
    if merged and start <= merged[-1][1]:
      merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
    else:
      merged.append((start, stop))
  return merged


def data_plan(cfg, batch_sharding, stored: int | None, where: str = "") -> DataPlan:
  """The streams of this run and this process's share of them; ConfigError (naming both
  sizes) when this process count cannot continue the run's batches, before anything is
  restored or compiled. `stored` is the stream count of the checkpoint being resumed."""
  t = cfg.train
  processes = jax.process_count()
  if t.batch_size % processes:
    raise configlib.ConfigError(
        "train.batch_size", f"= {t.batch_size} rows is not divisible by this run's "
        f"{processes} processes; each process feeds an equal share of the global batch. "
        "Keep the global batch (a resumed run's losses match only with it) and run on a "
        "process count that divides it.")
  configured = t.data_streams
  if stored is not None and configured and configured != stored:
    raise configlib.ConfigError(
        "train.data_streams", f"is {configured} but the run in {where} started with "
        f"{stored} data streams, and a run's streams are fixed when it starts. Set it to "
        f"{stored} (or 0: the checkpoint's), or start a new workdir.")
  count = stored or configured or processes
  if t.batch_size % count:
    raise configlib.ConfigError(
        "train.batch_size", f"= {t.batch_size} rows cannot be split into the run's {count} "
        f"data streams; use a multiple of {count}.")
  rows = process_rows(batch_sharding, (t.batch_size, t.seq_len))
  try:
    held = streams.held_streams(rows, t.batch_size, count)
  except ValueError:
    resumed = f"the run in {where} started with" if stored else "this run has"
    raise configlib.ConfigError(
        "train.data_streams", f"{resumed} {count} data streams, and {processes} processes "
        f"cannot each read whole streams ({count} % {processes} != 0). Resume on a "
        f"process count that divides {count}, or start runs that must move between "
        "process counts with train.data_streams set to a multiple of each.") from None
  return DataPlan(count, tuple(held))


def datasets(cfg, plan: DataPlan | None = None) -> Datasets:
  """The training streams of `plan` (default: this process's own, one per process) and
  the eval datasets (each process its shard of the held-out data)."""
  t = cfg.train
  plan = plan or DataPlan.per_process()
  prepared = data.prepare_from_config(cfg.data)
  tokenizer = prepared.tokenizer()
  shard = dict(shard_index=jax.process_index(), shard_count=jax.process_count())
  common = dict(seq_len=t.seq_len, batch_size=t.batch_size // jax.process_count())
  stream = dict(seq_len=t.seq_len, batch_size=t.batch_size // plan.count,
                shard_count=plan.count)
  if cfg.task == "sft":
    common = dict(common, tool_format=cfg.sft.tool_format)
    stream = dict(stream, tool_format=cfg.sft.tool_format)
    train = streams.StreamSet(
        lambda s: data.chat_dataset(cfg.sft.train_path, tokenizer, seed=t.seed,
                                    shard_index=s, **stream), plan.count, plan.held)
    evals = {}
    if cfg.sft.heldout_path:
      evals["eval_loss"] = lambda: data.chat_dataset(
          cfg.sft.heldout_path, tokenizer, shuffle=False, num_epochs=1, **common, **shard)
    return Datasets(train, evals)
  corpus = prepared.corpus()
  train = streams.StreamSet(
      lambda s: data.pretrain_dataset(corpus, "train", tokenizer, seed=t.seed,
                                      shard_index=s, **stream), plan.count, plan.held)
  evals = {
      "eval_loss": lambda: data.pretrain_dataset(
          corpus, "heldout", tokenizer, shuffle=False, num_epochs=1, **common, **shard),
      # Whole held-out repositories, files in path order: the codebase-perplexity eval.
      "codebase_loss": lambda: data.pretrain_dataset(
          corpus, "heldout", tokenizer, shuffle=False, num_epochs=1,
          granularity="repository", **common, **shard),
  }
  return Datasets(train, evals)
