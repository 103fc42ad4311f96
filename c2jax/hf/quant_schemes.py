"""The on-disk quantisation schemes of released checkpoints, parsed from config.json.

A scheme knows its stored tensors (`suffixes`, the first marking a quantised weight),
validates them against the config (errors name the tensor), dequantises and quantises one
module's weight (arithmetic in quant_formats.py), and writes its `quantization_config`
back. `SCHEMES` maps config.json's `quant_method` to a parser; `EXPORT_SCHEMES` names the
formats an export can produce. Module names are tensor names without `.weight`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Protocol

import ml_dtypes
import numpy as np

from c2jax.hf import quant_formats as qf
from c2jax.hf import safetensors_io
from c2jax.hf.config import HFConfigError

FIELD = "quantization_config"


def _is_linear(module: str) -> bool:
  """nn.Linear modules of the supported architectures: projections and LM heads."""
  last = module.rsplit(".", 1)[-1]
  return last.endswith("_proj") or last in ("lm_head", "head")


def _skips(pattern: str, module: str) -> bool:
  """transformers' modules_to_not_convert rule: a regex matching from the start up to a
  module boundary ('mlp.gate' skips 'x.mlp.gate', not 'x.mlp.gate_proj'), or a suffix."""
  boundary = r"(?:(?<=\.)|(?=\.|$))"
  return bool(re.match(f"(?:{pattern}){boundary}", module)) or module.endswith(pattern)


def _matches(module: str, pattern: str) -> bool:
  """compressed-tensors' rule: 're:<regex>' matches from the start, else the exact name."""
  if pattern.startswith("re:"):
    return re.match(pattern[3:], module) is not None
  return module == pattern or (pattern == "Linear" and _is_linear(module))


class Scheme(Protocol):
  """One on-disk format. `suffixes[0]` is the stored tensor that marks a quantised weight."""
  suffixes: tuple[str, ...]

  def hf_config(self) -> dict: ...
  def quantizes(self, module: str) -> bool: ...
  def is_stored(self, info: safetensors_io.TensorInfo) -> bool: ...
  def logical_shape(self, module: str, parts: dict, read_small: Callable) -> tuple: ...
  def dequantize(self, module: str, parts: dict[str, np.ndarray], dtype) -> np.ndarray: ...
  def quantize(self, module: str, array: np.ndarray) -> dict[str, np.ndarray]: ...
  def planned(self, module: str, shape: tuple) -> list[tuple[str, np.dtype, tuple]]: ...
  def held_as(self, module: str, shape: tuple[int, int]) -> tuple[str, tuple[int, int]] | None: ...
  def stored(self, module: str, parts: dict[str, np.ndarray]) -> Stored: ...


@dataclasses.dataclass(frozen=True)
class Stored:
  """One quantised weight as the checkpoint stores it, unpacked, in HF's [out, in] order:
  `values` [out, in] (float8_e4m3fn, int4 or int8), `scales` float32 [out / bo, in / bi],
  one per block of (bo, bi) values (the block `held_as` gives); weight = values * scale."""
  values: np.ndarray
  scales: np.ndarray


def _check_shape(module: str, suffix: str, got: tuple, want: tuple, why: str) -> None:
  if tuple(got) != tuple(want):
    raise ValueError(f"tensor '{module}.{suffix}' has shape {list(got)}, expected "
                     f"{list(want)} ({why}); the checkpoint is corrupt or not in this format.")


@dataclasses.dataclass(frozen=True)
class Fp8Block:
  """DeepSeek-V3/V3.1 (and Kimi-K2) block-scaled float8_e4m3fn weights."""
  block: tuple[int, int] = (128, 128)
  power_of_two: bool = False  # scale_fmt 'ue8m0' (DeepSeek-V3.1)
  ignore: tuple[str, ...] = ()  # modules_to_not_convert
  suffixes: tuple[str, ...] = ("weight", "weight_scale_inv")

  @classmethod
  def from_hf(cls, qc: dict) -> Fp8Block:
    # Keys of DeepSeek's configs and of transformers' FineGrainedFP8Config. Stored fp8
    # tensors are found by dtype, so `modules_to_convert` and `dequantize` change nothing.
    _only(qc, {"quant_method", "fmt", "activation_scheme", "weight_block_size", "scale_fmt",
               "modules_to_not_convert", "ignored_layers", "modules_to_convert",
               "dequantize", "expert_dtype"})
    if qc.get("expert_dtype", "fp8") != "fp8":
      raise HFConfigError(f"{FIELD}.expert_dtype", f"= {qc['expert_dtype']!r}; only fp8 "
                          "experts are read (not DeepSeek-V4's packed fp4).")
    if qc.get("fmt", "e4m3") != "e4m3":
      raise HFConfigError(f"{FIELD}.fmt", f"= {qc['fmt']!r}; only e4m3 weights are read.")
    if qc.get("activation_scheme", "dynamic") != "dynamic":
      raise HFConfigError(f"{FIELD}.activation_scheme", f"= {qc['activation_scheme']!r}; "
                          "only 'dynamic' (no stored activation scales) is supported.")
    block = qc.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)):
      raise HFConfigError(f"{FIELD}.weight_block_size", f"= {block!r}; c2jax reads "
                          "block-scaled fp8, e.g. [128, 128].")
    if qc.get("scale_fmt") not in (None, "float", "ue8m0"):
      raise HFConfigError(f"{FIELD}.scale_fmt", f"= {qc['scale_fmt']!r}; expected absent, "
                          "'float' or 'ue8m0'.")
    ignore = qc.get("modules_to_not_convert") or qc.get("ignored_layers") or ()
    return cls(tuple(block), qc.get("scale_fmt") == "ue8m0", tuple(ignore))

  def hf_config(self) -> dict:
    out = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
           "weight_block_size": list(self.block)}
    if self.power_of_two:
      out["scale_fmt"] = "ue8m0"
    if self.ignore:
      out["modules_to_not_convert"] = list(self.ignore)
    return out

  def quantizes(self, module):
    return module.rsplit(".", 1)[-1].endswith("_proj") and not any(
        _skips(pattern, module) for pattern in self.ignore)

  def is_stored(self, info):
    return info.dtype == qf.FP8

  def logical_shape(self, module, parts, read_small):
    weight, scale = parts["weight"], parts["weight_scale_inv"]
    if len(weight.shape) != 2:
      raise ValueError(f"tensor '{module}.weight' is float8 with shape {list(weight.shape)}; "
                       "block-scaled fp8 weights are 2-D.")
    _check_shape(module, "weight_scale_inv", scale.shape,
                 qf.fp8_scale_shape(weight.shape, self.block),
                 f"one scale per {self.block[0]}x{self.block[1]} block of the weight")
    if scale.dtype not in (np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e8m0fnu):
      raise ValueError(f"tensor '{module}.weight_scale_inv' is {scale.dtype}; expected "
                       "float32 (or float8_e8m0fnu power-of-two scales).")
    return weight.shape

  def dequantize(self, module, parts, dtype):
    return qf.fp8_dequantize(parts["weight"], parts["weight_scale_inv"], self.block, dtype)

  def quantize(self, module, array):
    q, scale = qf.fp8_quantize(array, self.block, self.power_of_two)
    return {"weight": q, "weight_scale_inv": scale}

  def planned(self, module, shape):
    return [("weight", qf.FP8, tuple(shape)),
            ("weight_scale_inv", np.dtype(np.float32), qf.fp8_scale_shape(shape, self.block))]

  def held_as(self, module, shape):
    """(the engine's weights_quant that holds this weight [out, in] as stored, the block
    of values one stored scale covers, [out, in]); None when no engine format can."""
    del module
    return "fp8", tuple(min(side, size) for side, size in zip(self.block, shape))

  def stored(self, module, parts):
    del module
    # float32 holds every stored scale exactly (bfloat16 and e8m0 ones included).
    return Stored(parts["weight"], parts["weight_scale_inv"].astype(np.float32))


@dataclasses.dataclass(frozen=True)
class IntGroup:
  """One compressed-tensors config group: which modules, and their weights' int format."""
  targets: tuple[str, ...]
  bits: int
  group_size: int | None  # None: one scale per output channel


# Kimi-K2-Thinking / K2.5 quantise only the routed experts. (An MTP layer's copy of the
# LM head, `shared_head.head`, stays plain like the head it copies.)
KIMI_IGNORE = ("lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
               r"re:.*mlp\.(gate|up|gate_up|down)_proj.*", "re:.*eh_proj.*",
               r"re:.*shared_head\.head$", "re:.*vision_tower.*", "re:.*mm_projector.*")


@dataclasses.dataclass(frozen=True)
class PackedInt:
  """compressed-tensors `pack-quantized`: symmetric b-bit ints packed into int32."""
  groups: tuple[IntGroup, ...] = (IntGroup(("Linear",), 4, 32),)
  ignore: tuple[str, ...] = KIMI_IGNORE
  scale_dtype: np.dtype = np.dtype(ml_dtypes.bfloat16)  # export: the model's dtype
  suffixes: tuple[str, ...] = ("weight_packed", "weight_scale", "weight_shape")

  @classmethod
  def from_hf(cls, qc: dict) -> PackedInt:
    fmt = qc.get("format")
    if fmt != "pack-quantized":
      raise HFConfigError(f"{FIELD}.format", f"= {fmt!r}; c2jax reads compressed-tensors "
                          "'pack-quantized' (int weights packed into int32) only.")
    if qc.get("quantization_status", "compressed") != "compressed":
      raise HFConfigError(f"{FIELD}.quantization_status", f"= {qc['quantization_status']!r}"
                          "; only 'compressed' checkpoints store packed weights.")
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
      if qc.get(key):
        raise HFConfigError(f"{FIELD}.{key}", "is set; c2jax dequantises weights only.")
    groups = []
    for gname, group in sorted((qc.get("config_groups") or {}).items()):
      field = f"{FIELD}.config_groups.{gname}"
      for key in ("input_activations", "output_activations"):
        if group.get(key):
          raise HFConfigError(f"{field}.{key}", "is set; only weight-only quantisation "
                              "(e.g. W4A16) can be dequantised.")
      if (group.get("format") or fmt) != fmt:
        raise HFConfigError(f"{field}.format", f"= {group['format']!r}; expected {fmt!r}.")
      w = group.get("weights") or {}
      want = {"type": "int", "symmetric": True, "dynamic": False}
      for key, value in want.items():
        if w.get(key) != value:
          raise HFConfigError(f"{field}.weights.{key}", f"= {w.get(key)!r}; c2jax reads "
                              f"{value!r} (symmetric static int weights, no zero points).")
      if w.get("actorder") not in (None, "static"):
        raise HFConfigError(f"{field}.weights.actorder", f"= {w['actorder']!r}; activation "
                            "reordering (weight_g_idx) is not supported.")
      bits = w.get("num_bits")
      if bits not in range(1, 9):
        raise HFConfigError(f"{field}.weights.num_bits", f"= {bits!r}; expected 1..8.")
      strategy = w.get("strategy")
      if strategy == "group" and isinstance(w.get("group_size"), int) and w["group_size"] > 0:
        groups.append(IntGroup(tuple(group.get("targets") or ()), bits, w["group_size"]))
      elif strategy == "channel":
        groups.append(IntGroup(tuple(group.get("targets") or ()), bits, None))
      else:
        raise HFConfigError(f"{field}.weights.strategy", f"= {strategy!r} (group_size "
                            f"{w.get('group_size')!r}); expected 'group' with a positive "
                            "group_size, or 'channel'.")
    if not groups:
      raise HFConfigError(f"{FIELD}.config_groups", "is empty; nothing says how weights "
                          "are quantised.")
    return cls(tuple(groups), tuple(qc.get("ignore") or ()))

  def hf_config(self) -> dict:
    """As compressed-tensors writes it (QuantizationConfig.model_dump())."""
    groups = {}
    for i, g in enumerate(self.groups):
      weights = {"num_bits": g.bits, "type": "int", "symmetric": True,
                 "group_size": g.group_size, "strategy": "group" if g.group_size else "channel",
                 "dynamic": False}
      groups[f"group_{i}"] = {"targets": list(g.targets), "weights": weights,
                              "input_activations": None, "output_activations": None,
                              "format": None}
    return {"config_groups": groups, "quant_method": "compressed-tensors",
            "kv_cache_scheme": None, "format": "pack-quantized",
            "quantization_status": "compressed", "global_compression_ratio": None,
            "ignore": list(self.ignore)}

  def group_of(self, module: str) -> IntGroup | None:
    if any(_matches(module, p) for p in self.ignore):
      return None
    return next((g for g in self.groups if any(_matches(module, t) for t in g.targets)),
                None)

  def quantizes(self, module):
    return self.group_of(module) is not None

  def is_stored(self, info):
    return True  # `weight_packed` exists only for quantised weights

  def _group(self, module: str) -> IntGroup:
    group = self.group_of(module) or (self.groups[0] if len(self.groups) == 1 else None)
    if group is None:
      raise ValueError(f"tensor '{module}.weight_packed' matches no config group of "
                       f"config.json's {FIELD}; its bit width is unknown.")
    return group

  def logical_shape(self, module, parts, read_small):
    packed, scale, shape_info = (parts[s] for s in self.suffixes)
    group = self._group(module)
    if packed.dtype != np.int32:
      raise ValueError(f"tensor '{module}.weight_packed' is {packed.dtype}; expected int32.")
    if shape_info.shape != (2,) or shape_info.dtype.kind not in "iu":
      raise ValueError(f"tensor '{module}.weight_shape' is {shape_info.dtype}"
                       f"{list(shape_info.shape)}; expected the 2 ints [out, in].")
    rows, cols = (int(v) for v in read_small(f"{module}.weight_shape"))
    _check_shape(module, "weight_packed", packed.shape,
                 (rows, qf.packed_words(cols, group.bits)),
                 f"{group.bits}-bit values of weight_shape [{rows}, {cols}] packed in int32")
    per_row = 1 if group.group_size is None else -(-cols // group.group_size)
    _check_shape(module, "weight_scale", scale.shape, (rows, per_row),
                 f"one scale per {group.group_size or cols} inputs of each output row")
    if scale.dtype.kind != "f" and scale.dtype != ml_dtypes.bfloat16:
      raise ValueError(f"tensor '{module}.weight_scale' is {scale.dtype}; expected a float.")
    return (rows, cols)

  def dequantize(self, module, parts, dtype):
    group = self._group(module)
    rows, cols = (int(v) for v in parts["weight_shape"])
    q = qf.unpack_int32(parts["weight_packed"], group.bits, cols)
    return qf.int_dequantize(q, parts["weight_scale"], group.group_size or cols, dtype)

  def quantize(self, module, array):
    group = self._group(module)
    if group.group_size and array.shape[1] % group.group_size:
      raise ValueError(f"cannot quantise '{module}.weight' {list(array.shape)} to groups of "
                       f"{group.group_size} inputs: {array.shape[1]} is not a multiple (nor "
                       "does compressed-tensors accept it). Add the module to the scheme's "
                       "ignore list or export unquantised.")
    q, scale = qf.int_quantize(array, group.bits, group.group_size or array.shape[1],
                               self.scale_dtype)
    return {"weight_packed": qf.pack_int32(q, group.bits), "weight_scale": scale,
            "weight_shape": np.asarray(array.shape, np.int64)}

  def planned(self, module, shape):
    group = self._group(module)
    rows, cols = shape
    return [("weight_packed", np.dtype(np.int32), (rows, qf.packed_words(cols, group.bits))),
            ("weight_scale", self.scale_dtype,
             (rows, 1 if group.group_size is None else -(-cols // group.group_size))),
            ("weight_shape", np.dtype(np.int64), (2,))]

  def held_as(self, module, shape):
    group = self._group(module)
    name = _HELD_INTS.get(group.bits)
    if name is None:
      return None
    return name, (1, min(group.group_size or shape[1], shape[1]))

  def stored(self, module, parts):
    group = self._group(module)
    cols = int(parts["weight_shape"][1])
    q = qf.unpack_int32(parts["weight_packed"], group.bits, cols)
    values = q.astype(ml_dtypes.int4) if group.bits == 4 else q
    return Stored(values, parts["weight_scale"].astype(np.float32))


# The packed int widths an engine holds as they are (engine.weights_quant).
_HELD_INTS = {4: "int4", 8: "int8"}


def _only(qc: dict, known: set[str]) -> None:
  unknown = sorted(set(qc) - known)
  if unknown:
    raise HFConfigError(f"{FIELD}.{unknown[0]}", f"is not understood (keys {unknown}); c2jax "
                        "refuses rather than dequantise wrongly.")


SCHEMES: dict[str, Callable[[dict], Scheme]] = {
    "fp8": Fp8Block.from_hf, "compressed-tensors": PackedInt.from_hf}
EXPORT_SCHEMES: dict[str, Scheme] = {
    "fp8": Fp8Block(), "fp8-ue8m0": Fp8Block(power_of_two=True), "int4": PackedInt()}
