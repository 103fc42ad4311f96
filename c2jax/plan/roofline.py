"""Rooflines: what a train step and a decode step cost, and the fastest they could run.

    train = train_step_cost(cfg, devices, compiled)          # compiled: optional
    decode = decode_step_cost(cfg.model, batch=64, context=32768, devices=8)
    print(format_roofline([train, decode], accelerators.ACCELERATORS))

Model FLOPs (the formula; what MFU counts) per token of a forward pass:
  2 x (dense matmul params + routed expert params x k / E)      (embedding lookups free)
  + attention, per layer and query token over its c context tokens:
      training (MLA expanded, GQA): 2 x heads x (qk_head_dim + v_head_dim) x c
      decode   (MLA absorbed):      2 x heads x (2 x kv_lora_rank + qk_rope_head_dim) x c
A train step is 3 forward passes (forward + backward) over batch x seq_len tokens with
causal context (mean c = (L + 1) / 2); MTP modules count like layers. XLA's compiled cost
analysis of the same step is shown beside it: it counts the remat recomputation
(`remat='full'` adds about one forward) and everything that is not a matmul.

Bytes moved per device, a lower bound on memory traffic: for a train step, every
parameter read twice (forward, backward) and written once, its gradient written and read,
and both Adam moments read and written (activations left out); for decode, the weights
read once per step (dense weights, plus the experts the batch touches: with uniform
routing E x (1 - (1 - k/E)^B) per layer) plus the KV cache read (MLA: kv_lora_rank +
qk_rope_head_dim values per token and layer; GQA: 2 x kv_heads x head_dim). XLA's own
`bytes accessed` is shown beside it but not used as a bound: it sums every operation's
operands and results, most of which stay in caches or registers on real hardware (on this
CPU a tiny model's measured step beats the bandwidth time of XLA's figure).

The lower-bound time on a device is max(FLOPs / peak, bytes / HBM bandwidth, collective
bytes / link bandwidth), FLOPs being the larger of the formula and XLA's count (XLA counts
a while loop's body once, so for scanned layer stacks its figure is too low); the MFU
ceiling is model-FLOPs time over that bound.
"""

from __future__ import annotations

import dataclasses
import math

import jax

from c2jax.model import counting, mtp
from c2jax.plan import accelerators as accel_lib
from c2jax.plan import hlo_comms
from c2jax.plan import memory as memory_lib

_MATMUL_LEAVES = ("kernel", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class ParamGroups:
  dense_matmul: int   # matmul weights every token uses (lm_head included)
  routed: int         # all routed-expert weights of the main model
  mtp_matmul: int     # MTP modules' matmul weights, routed experts at their active share
  moe_layers: int


def param_groups(model_cfg) -> ParamGroups:

  dense = routed = mtp_matmul = 0
  fraction = model_cfg.moe.num_experts_per_tok / model_cfg.moe.num_experts
  for path, leaf in jax.tree_util.tree_leaves_with_path(counting.abstract_params(model_cfg)):
    keys = [getattr(k, "key", str(k)) for k in path]
    if keys[-1] not in _MATMUL_LEAVES or keys[0] == "embed":
      continue
    n = math.prod(leaf.shape)
    if keys[0] == mtp.PARAMS_KEY:
      mtp_matmul += n * fraction if "experts" in keys else n
    elif "experts" in keys:
      routed += n
    else:
      dense += n
  moe_layers = model_cfg.num_layers - model_cfg.first_k_dense
  return ParamGroups(dense, routed, int(mtp_matmul), moe_layers)


def _active_matmul(model_cfg, groups: ParamGroups) -> float:
  fraction = model_cfg.moe.num_experts_per_tok / model_cfg.moe.num_experts
  return groups.dense_matmul + groups.routed * fraction


def _head_dims(model_cfg) -> int:
  if model_cfg.attention == "mla":
    return model_cfg.qk_nope_head_dim + model_cfg.qk_rope_head_dim + model_cfg.v_head_dim
  return 2 * model_cfg.head_dim


def train_flops_per_token(model_cfg, seq_len: int, groups: ParamGroups | None = None) -> float:
  """Model FLOPs per trained token (forward + backward, causal attention)."""
  groups = groups or param_groups(model_cfg)
  layers = model_cfg.num_layers + model_cfg.num_mtp_layers
  attention = 2 * layers * model_cfg.num_heads * _head_dims(model_cfg) * (seq_len + 1) / 2
  forward = 2 * (_active_matmul(model_cfg, groups) + groups.mtp_matmul) + attention
  return 3 * forward


def _dtype_bytes(name: str) -> int:
  return jax.numpy.dtype(name).itemsize


@dataclasses.dataclass(frozen=True)
class StepCost:
  """One step's work, per device."""
  label: str
  devices: int
  tokens: int                 # tokens the step trains on or generates, all devices
  model_flops: float          # per device, the formula
  xla_flops: float | None     # per device, XLA cost analysis (None: not compiled)
  bytes_moved: float          # per device, lower bound
  comm_bytes: float           # per device, collectives on the wire
  xla_bytes: float | None = None   # per device, XLA's `bytes accessed`
  measured_s: float | None = None  # a measured step time, where it ran
  comm_note: str = ""         # why comm_bytes is not known (then it counts as 0)


def train_step_cost(cfg, devices: int, compiled=None) -> StepCost:
  """The train step of job config `cfg` on `devices` devices; XLA's numbers from
  `compiled` (e.g. memory.compile_train_step) when given, else the formula alone."""


  tokens = cfg.train.batch_size * cfg.train.seq_len
  model_flops = train_flops_per_token(cfg.model, cfg.train.seq_len) * tokens / devices
  params = counting.count_params(cfg.model)
  param_count = params["total_params"] + params["mtp_params"]
  p = _dtype_bytes(cfg.model.param_dtype)
  bytes_moved = param_count * (3 * p + 2 * p + 4 * _optimizer_state_bytes(cfg)) / devices
  xla_flops = xla_bytes = None
  comm, comm_note = 0.0, ""
  if compiled is not None:
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    xla_flops = float(analysis.get("flops", 0.0))
    xla_bytes = float(analysis.get("bytes accessed", 0.0))
    try:
      volumes = hlo_comms.comm_volume(compiled.as_text(), devices)
      comm = sum(v.wire_bytes for v in volumes.values())
    except ValueError as err:  # e.g. a collective in a loop of unknown trip count
      comm, comm_note = 0.0, str(err)
  return StepCost("train step", devices, tokens, model_flops, xla_flops, bytes_moved, comm,
                  xla_bytes, comm_note=comm_note)


def _optimizer_state_bytes(cfg) -> int:
  """Bytes per element of one Adam moment (the precision policy's opt_state_dtype)."""
  return _dtype_bytes(cfg.model.opt_state_dtype)


def decode_step_cost(model_cfg, batch: int, context: int, devices: int = 1) -> StepCost:
  """One decode step of `batch` sequences at `context` tokens each, spread over devices."""
  groups = param_groups(model_cfg)
  m = model_cfg
  if m.attention == "mla":
    score_dims = 2 * m.kv_lora_rank + m.qk_rope_head_dim
    cache_values = m.kv_lora_rank + m.qk_rope_head_dim
  else:
    score_dims = 2 * m.head_dim
    cache_values = 2 * m.num_kv_heads * m.head_dim
  attention = 2 * m.num_layers * m.num_heads * score_dims * context
  flops = batch * (2 * _active_matmul(m, groups) + attention)
  k, experts = m.moe.num_experts_per_tok, m.moe.num_experts
  touched = experts * (1 - (1 - k / experts) ** batch) if groups.moe_layers else 0.0
  weight_bytes = (groups.dense_matmul + groups.routed * touched / experts) * _dtype_bytes(m.dtype)
  kv_bytes = batch * context * m.num_layers * cache_values * _dtype_bytes(m.dtype)
  return StepCost(f"decode step (batch {batch}, context {context})", devices, batch,
                  flops / devices, None, (weight_bytes + kv_bytes) / devices, 0.0)


@dataclasses.dataclass(frozen=True)
class Bound:
  compute_s: float
  memory_s: float
  comm_s: float
  model_s: float  # model FLOPs at peak

  @property
  def lower_s(self) -> float:
    return max(self.compute_s, self.memory_s, self.comm_s)

  @property
  def bound_by(self) -> str:
    return max((self.compute_s, "compute"), (self.memory_s, "memory"),
               (self.comm_s, "network"))[1]

  @property
  def mfu_ceiling(self) -> float:
    return self.model_s / self.lower_s if self.lower_s else 0.0


def bound(cost: StepCost, acc: accel_lib.Accelerator) -> Bound:
  """Bounds at the accelerator's bfloat16 peak (for float32 configs, as if in bfloat16)."""
  peak = acc.peak_flops("bfloat16")
  # XLA counts a while loop's body once (layer scans, blockwise attention tiles), so on
  # scanned models its figure falls below the model's: the larger one bounds the work.
  flops = max(cost.model_flops, cost.xla_flops or 0.0)
  return Bound(compute_s=flops / peak, memory_s=cost.bytes_moved / (acc.hbm_tb_s * 1e12),
               comm_s=cost.comm_bytes / (acc.link_gb_s * 1e9),
               model_s=cost.model_flops / peak)


def _si(value: float, unit: str) -> str:
  for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
    if abs(value) >= scale:
      return f"{value / scale:.2f} {prefix}{unit}"
  return f"{value:.2f} {unit}"


def _time(seconds: float) -> str:
  if seconds == 0:
    return "0"
  if seconds < 1e-3:
    return f"{seconds * 1e6:,.2f} us"
  return f"{seconds * 1e3:,.2f} ms"


def format_roofline(costs: list[StepCost], accels: dict[str, accel_lib.Accelerator]) -> str:
  """Per step: its work per device, then one row per accelerator with the bounds."""
  blocks = []
  for cost in costs:
    xla = "not compiled" if cost.xla_flops is None else _si(cost.xla_flops, "FLOP")
    ratio = ("" if not cost.xla_flops else
             f" (XLA / model {cost.xla_flops / cost.model_flops:.2f}"
             + (", loop bodies counted once" if cost.xla_flops < cost.model_flops else "")
             + ")")
    intensity = (cost.xla_flops or cost.model_flops) / max(cost.bytes_moved, 1.0)
    xla_bytes = "" if cost.xla_bytes is None else f"; XLA bytes accessed {_si(cost.xla_bytes, 'B')}"
    head = (f"{cost.label} on {cost.devices} device(s), {cost.tokens:,} tokens; per device: "
            f"FLOPs model {_si(cost.model_flops, 'FLOP')}, XLA {xla}{ratio}; "
            f"at least {_si(cost.bytes_moved, 'B')} moved (intensity {intensity:,.1f} "
            f"FLOP/B){xla_bytes}; " + (f"collectives not counted: {cost.comm_note}"
                                        if cost.comm_note else
                                        f"{_si(cost.comm_bytes, 'B')} over links"))
    rows = [("device", "compute", "memory", "network", "lower bound", "bound by",
             "MFU ceiling", "tokens/s bound", "measured", "measured/bound")]
    for acc in accels.values():
      b = bound(cost, acc)
      measured = cost.measured_s if acc.name.endswith("(measured)") else None
      rows.append((acc.name, _time(b.compute_s), _time(b.memory_s), _time(b.comm_s),
                   _time(b.lower_s), b.bound_by, f"{b.mfu_ceiling:.1%}",
                   f"{cost.tokens / b.lower_s:,.0f}" if b.lower_s else "-",
                   "-" if measured is None else _time(measured),
                   "-" if measured is None else f"{measured / b.lower_s:.2f}x"))
    blocks.append(head + "\n" + memory_lib.format_table(rows))
  return "\n\n".join(blocks)


def summary(costs: list[StepCost], accels: dict[str, accel_lib.Accelerator]) -> list[dict]:
  """The roofline as JSON-ready dicts, one per step."""
  out = []
  for cost in costs:
    per = {}
    for key, acc in accels.items():
      b = bound(cost, acc)
      per[key] = {"lower_bound_s": b.lower_s, "bound_by": b.bound_by,
                  "mfu_ceiling": b.mfu_ceiling, "compute_s": b.compute_s,
                  "memory_s": b.memory_s, "network_s": b.comm_s}
    out.append({**dataclasses.asdict(cost), "bounds": per})
  return out
