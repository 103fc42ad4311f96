"""Released quantised checkpoints: dequantised on load, optionally re-quantised on export.

    hf, reader = quantized.open_hf(hf_dir, hf)   # hf without quantization_config, and a
                                                 # reader of dequantised logical tensors
    quantized.quantize_for_export(name, array, "int4")   # {on-disk name: tensor}
    plan = quantized.quantize_plan(plan, "fp8")           # for safetensors_io.write_sharded

Supported (quant_schemes.py): DeepSeek-V3/V3.1 and Kimi-K2 FP8 (`quant_method: fp8`,
float8_e4m3fn weights with float32 `weight_scale_inv` per 128x128 block, ragged edges
allowed, `scale_fmt: ue8m0`) and Kimi-K2-Thinking/K2.5 INT4 (`quant_method:
compressed-tensors`, `format: pack-quantized`, symmetric int4 groups of 32 in int32
words). Any other quantization_config is refused with an error naming the field.

`DequantizingReader` stands in for a SafetensorsReader: its `tensors` are the logical
tensors (`X.weight`, in the run's dtype, in on-disk order) and `read` dequantises one at a
time, so the converters stream a quantised checkpoint with the memory of one tensor.
Unquantised tensors (norms, embeddings, router, lm_head, ...) pass through untouched.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence

import ml_dtypes
import numpy as np

from c2jax.hf import safetensors_io
from c2jax.hf.config import HFConfigError
from c2jax.hf.quant_schemes import EXPORT_SCHEMES, FIELD, SCHEMES, Scheme, Stored

__all__ = ["DequantizingReader", "EXPORT_SCHEMES", "SCHEMES", "declared_dtype",
           "export_scheme", "open_hf", "quantize_for_export", "quantize_plan",
           "scheme_from_config", "without_quantization"]

_FLOAT_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16),
                 "float32": np.dtype(np.float32)}
# Stored tensors of quantisation features no scheme here reproduces.
_UNSUPPORTED = ("weight_zero_point", "weight_g_idx", "weight_global_scale", "input_scale",
                "input_global_scale", "output_scale", "k_scale", "v_scale")


def _configs(hf: dict) -> list[dict]:
  """The config dicts that may carry quantization_config (Kimi-K2.5 nests its text model)."""
  return [hf] + ([hf["text_config"]] if isinstance(hf.get("text_config"), dict) else [])


def scheme_from_config(hf: dict) -> Scheme | None:
  """The scheme config.json declares, None for an unquantised checkpoint."""
  # The top level's wins: its module names are the stored tensor names (Kimi-K2.5's text
  # model sits under `language_model.`), a nested copy may be relative to the text model.
  found = [c[FIELD] for c in _configs(hf) if c.get(FIELD)]
  if not found:
    return None
  qc = found[0]
  method = qc.get("quant_method")
  if method not in SCHEMES:
    raise HFConfigError(f"{FIELD}.quant_method", f"= {method!r}; c2jax dequantises "
                        f"{sorted(SCHEMES)} checkpoints. Dequantise it with its own tools "
                        "to bfloat16 first.")
  return SCHEMES[method](qc)


def without_quantization(hf: dict) -> dict:
  """hf with quantization_config removed everywhere: what the dequantised weights obey."""
  out = {k: v for k, v in hf.items() if k != FIELD}
  if isinstance(out.get("text_config"), dict):
    out["text_config"] = {k: v for k, v in out["text_config"].items() if k != FIELD}
  return out


def declared_dtype(hf: dict) -> np.dtype:
  """The checkpoint's model dtype (`dtype` / `torch_dtype`), bfloat16 when unstated."""
  for c in _configs(hf):
    name = c.get("dtype") or c.get("torch_dtype")
    if name:
      if name not in _FLOAT_DTYPES:
        raise HFConfigError("dtype", f"= {name!r}; expected one of {sorted(_FLOAT_DTYPES)}.")
      return _FLOAT_DTYPES[name]
  return _FLOAT_DTYPES["bfloat16"]


def _split(name: str) -> tuple[str, str]:
  module, _, suffix = name.rpartition(".")
  return module, suffix


def _read_many(infos: Sequence[safetensors_io.TensorInfo]) -> dict[str, np.ndarray]:
  """Small tensors (e.g. 60k `weight_shape`s) read with one open file per shard."""
  out = {}
  by_file = collections.defaultdict(list)
  for info in infos:
    by_file[info.file].append(info)
  for file, group in by_file.items():
    with open(file, "rb") as f:
      for info in sorted(group, key=lambda i: i.start):
        f.seek(info.start)
        data = f.read(info.nbytes)
        if len(data) != info.nbytes:
          raise ValueError(f"{file} is truncated: tensor {info.name!r} needs {info.nbytes} "
                           "bytes.")
        out[info.name] = np.frombuffer(data, info.dtype).reshape(info.shape)
  return out


def _stored_parts(reader: safetensors_io.SafetensorsReader, scheme: Scheme
                  ) -> dict[str, dict[str, safetensors_io.TensorInfo]]:
  """module -> {suffix: info} of every quantised weight, each complete (or an error)."""
  main, companions = scheme.suffixes[0], set(scheme.suffixes[1:])
  parts: dict[str, dict[str, safetensors_io.TensorInfo]] = collections.defaultdict(dict)
  for name, info in reader.tensors.items():
    module, suffix = _split(name)
    if suffix in _UNSUPPORTED:
      raise ValueError(f"{reader.dir}: tensor {name!r} is a {suffix}, which c2jax's "
                       f"dequantisation does not support (config.json {FIELD} must "
                       "describe symmetric weight-only quantisation).")
    if suffix in companions or (suffix == main and scheme.is_stored(info)):
      parts[module][suffix] = info
  for module, found in parts.items():
    missing = [s for s in scheme.suffixes if s not in found]
    if main in missing:
      raise ValueError(f"{reader.dir}: tensor '{module}.{sorted(found)[0]}' has no "
                       f"quantised '{module}.{main}' beside it; the checkpoint is "
                       f"incomplete or its config.json {FIELD} is wrong.")
    if missing:
      raise ValueError(f"{reader.dir}: tensor '{module}.{main}' is quantised but "
                       f"'{module}.{missing[0]}' is missing; the checkpoint is incomplete.")
    if main != "weight" and f"{module}.weight" in reader.tensors:
      raise ValueError(f"{reader.dir}: '{module}.weight' is stored both plain and as "
                       f"'{module}.{main}'; keep one.")
  return parts


class DequantizingReader:
  """A SafetensorsReader's interface over the logical (dequantised) tensors."""

  def __init__(self, reader: safetensors_io.SafetensorsReader, scheme: Scheme, dtype):
    self.dir, self.base, self.scheme = reader.dir, reader, scheme
    self.dtype = np.dtype(dtype)
    if self.dtype not in _FLOAT_DTYPES.values():
      raise ValueError(f"cannot dequantise into {self.dtype}; use one of "
                       f"{sorted(_FLOAT_DTYPES)}.")
    parts = _stored_parts(reader, scheme)
    small = _read_many([info for found in parts.values() for suffix, info in found.items()
                        if suffix != scheme.suffixes[0] and int(np.prod(info.shape)) <= 8])
    self._modules: dict[str, str] = {}  # logical name -> module
    self.tensors: dict[str, safetensors_io.TensorInfo] = {}
    for name, info in reader.tensors.items():  # on-disk order, as the base reader
      module, suffix = _split(name)
      if module not in parts or suffix not in parts[module]:
        self.tensors[name] = info  # unquantised (norms, router, a module's bias, ...)
      elif suffix == scheme.suffixes[0]:
        try:
          shape = tuple(scheme.logical_shape(module, parts[module], small.__getitem__))
        except ValueError as e:
          raise ValueError(f"{self.dir}: {e}") from None
        logical = f"{module}.weight"
        self._modules[logical] = module
        self.tensors[logical] = safetensors_io.TensorInfo(
            logical, info.file, self.dtype, shape, info.start,
            int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize)

  def names(self) -> list[str]:
    return list(self.tensors)

  def is_quantized(self, name: str) -> bool:
    return name in self._modules

  def read(self, name: str) -> np.ndarray:
    module = self._modules.get(name)
    if module is None:
      return self.base.read(name)
    parts = {s: self.base.read(f"{module}.{s}") for s in self.scheme.suffixes}
    return self.scheme.dequantize(module, parts, self.dtype)

  def held_as(self, name: str) -> tuple[str, tuple[int, int]] | None:
    """For a quantised logical tensor: (the engine.weights_quant that holds it as stored,
    its block [out, in]); None for a plain tensor or a format no engine holds."""
    module = self._modules.get(name)
    if module is None:
      return None
    return self.scheme.held_as(module, tuple(self.tensors[name].shape))

  def read_stored(self, name: str) -> Stored:
    """A quantised logical tensor's values and scales as stored (not dequantised)."""
    module = self._modules[name]
    parts = {s: self.base.read(f"{module}.{s}") for s in self.scheme.suffixes}
    return self.scheme.stored(module, parts)


def open_hf(hf_dir: str | os.PathLike, hf: dict,
            reader: safetensors_io.SafetensorsReader | None = None, dtype=None
            ) -> tuple[dict, safetensors_io.SafetensorsReader | DequantizingReader]:
  """(config.json without quantization_config, reader of logical tensors) of hf_dir.

  `dtype` is the run's dtype for dequantised weights (default: the checkpoint's own).
  Unquantised checkpoints come back unchanged, with a plain reader.
  """
  scheme = scheme_from_config(hf)
  reader = reader or safetensors_io.SafetensorsReader(hf_dir)
  if scheme is None:
    return hf, reader
  return without_quantization(hf), DequantizingReader(
      reader, scheme, declared_dtype(hf) if dtype is None else dtype)


def export_scheme(scheme: str | Scheme) -> Scheme:
  if not isinstance(scheme, str):
    return scheme
  if scheme not in EXPORT_SCHEMES:
    raise ValueError(f"unknown quantisation {scheme!r} for export; choose one of "
                     f"{sorted(EXPORT_SCHEMES)}.")
  return EXPORT_SCHEMES[scheme]


def _module_if_quantized(name: str, ndim: int, scheme: Scheme) -> str | None:
  module, suffix = _split(name)
  return module if suffix == "weight" and ndim == 2 and scheme.quantizes(module) else None


def quantize_for_export(name: str, array: np.ndarray, scheme: str | Scheme
                        ) -> dict[str, np.ndarray]:
  """The on-disk tensors of HF tensor `name` ([out, in] for a Linear) under `scheme`.

  Tensors the scheme leaves unquantised (norms, router, embeddings, ...) map to themselves.
  """
  scheme = export_scheme(scheme)
  module = _module_if_quantized(name, np.ndim(array), scheme)
  if module is None:
    return {name: array}
  return {f"{module}.{s}": v for s, v in scheme.quantize(module, np.asarray(array)).items()}


class _Once:
  """Quantises one weight on the first request and hands out its parts one by one."""

  def __init__(self, module, produce, scheme):
    self.module, self.produce, self.scheme, self.parts = module, produce, scheme, None

  def take(self, suffix: str) -> np.ndarray:
    if self.parts is None:
      self.parts = self.scheme.quantize(self.module, np.asarray(self.produce()))
    return self.parts.pop(suffix)  # dropped once written: one weight in memory at a time


def quantize_plan(plan: Sequence[safetensors_io.PlannedTensor], scheme: str | Scheme
                  ) -> list[safetensors_io.PlannedTensor]:
  """`plan` with each quantised weight replaced by its stored tensors, adjacent, lazily."""
  scheme = export_scheme(scheme)
  out = []
  for tensor in plan:
    module = _module_if_quantized(tensor.name, len(tensor.shape), scheme)
    if module is None:
      out.append(tensor)
      continue
    once = _Once(module, tensor.produce, scheme)
    for suffix, dtype, shape in scheme.planned(module, tuple(tensor.shape)):
      out.append(safetensors_io.PlannedTensor(
          f"{module}.{suffix}", dtype, shape, lambda once=once, suffix=suffix: once.take(suffix)))
  return out
