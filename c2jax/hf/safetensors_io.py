"""Streaming safetensors I/O: read one tensor at a time, write shards tensor by tensor.

The safetensors format is an 8-byte little-endian header length, a JSON header mapping
each tensor name to {dtype, shape, data_offsets} (offsets relative to the end of the
header), then the raw little-endian bytes. Reading or writing it directly (rather than
through a framework) lets one tensor of a 1T-parameter checkpoint be in memory at a time
and keeps bfloat16 / float8 bits untouched (numpy dtypes from ml_dtypes). Hosts are
assumed little-endian (every platform JAX runs on).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import struct
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),  # power-of-two block scales (ue8m0)
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_CODES = {dtype: code for code, dtype in DTYPES.items()}
INDEX_FILE = "model.safetensors.index.json"


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  name: str
  file: pathlib.Path
  dtype: np.dtype
  shape: tuple[int, ...]
  start: int  # absolute byte offset in `file`
  nbytes: int


def dtype_code(dtype) -> str:
  dtype = np.dtype(dtype)
  if dtype not in _CODES:
    raise ValueError(f"dtype {dtype} cannot be stored in safetensors; use one of "
                     f"{sorted(str(d) for d in _CODES)}.")
  return _CODES[dtype]


def _read_header(path: pathlib.Path) -> list[TensorInfo]:
  with open(path, "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
  infos = []
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    if entry["dtype"] not in DTYPES:
      raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {entry['dtype']}.")
    begin, end = entry["data_offsets"]
    infos.append(TensorInfo(name, path, DTYPES[entry["dtype"]], tuple(entry["shape"]),
                            8 + length + begin, end - begin))
  return infos


class SafetensorsReader:
  """All tensors of an HF directory (sharded with an index, or single files), read lazily.

  Only the headers are parsed up front; `read(name)` loads that one tensor's bytes.
  """

  def __init__(self, hf_dir: str | os.PathLike):
    self.dir = pathlib.Path(hf_dir)
    index = self.dir / INDEX_FILE
    if index.exists():
      files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
      files = sorted(p.name for p in self.dir.glob("*.safetensors"))
    if not files:
      raise FileNotFoundError(f"{self.dir} holds no *.safetensors weights (nor {INDEX_FILE}).")
    self.tensors: dict[str, TensorInfo] = {}
    for file in files:  # files in order, tensors in on-disk order: sequential reads
      for info in sorted(_read_header(self.dir / file), key=lambda i: i.start):
        self.tensors[info.name] = info

  def names(self) -> list[str]:
    return list(self.tensors)

  def read(self, name: str) -> np.ndarray:
    info = self.tensors[name]
    with open(info.file, "rb") as f:
      f.seek(info.start)
      data = f.read(info.nbytes)
    if len(data) != info.nbytes:
      raise ValueError(f"{info.file} is truncated: tensor {name!r} needs {info.nbytes} bytes.")
    return np.frombuffer(data, dtype=info.dtype).reshape(info.shape)


@dataclasses.dataclass(frozen=True)
class PlannedTensor:
  """One tensor to write: its bytes come from `produce()` only when its turn comes."""
  name: str
  dtype: np.dtype
  shape: tuple[int, ...]
  produce: Callable[[], np.ndarray]

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _plan_shards(tensors: Sequence[PlannedTensor], max_shard_bytes: int
                 ) -> list[list[PlannedTensor]]:
  shards: list[list[PlannedTensor]] = [[]]
  size = 0
  for tensor in tensors:
    if shards[-1] and size + tensor.nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(tensor)
    size += tensor.nbytes
  return shards


def _header_bytes(shard: Sequence[PlannedTensor]) -> bytes:
  header: dict = {"__metadata__": {"format": "pt"}}
  offset = 0
  for tensor in shard:
    header[tensor.name] = {"dtype": dtype_code(tensor.dtype), "shape": list(tensor.shape),
                           "data_offsets": [offset, offset + tensor.nbytes]}
    offset += tensor.nbytes
  encoded = json.dumps(header, separators=(",", ":")).encode()
  encoded += b" " * (-len(encoded) % 8)  # data starts 8-byte aligned, as safetensors does
  return struct.pack("<Q", len(encoded)) + encoded


def write_sharded(out_dir: str | os.PathLike, tensors: Sequence[PlannedTensor],
                  max_shard_bytes: int) -> list[pathlib.Path]:
  """Writes `model-0000i-of-0000N.safetensors` + the index; one tensor in memory at a time."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  names = [t.name for t in tensors]
  if len(set(names)) != len(names):
    raise ValueError("duplicate tensor names in one checkpoint")
  shards = _plan_shards(tensors, max_shard_bytes)
  weight_map, paths = {}, []
  for i, shard in enumerate(shards):
    path = out / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    with open(path, "wb") as f:
      f.write(_header_bytes(shard))
      for tensor in shard:
        array = np.asarray(tensor.produce())
        if array.shape != tuple(tensor.shape) or array.dtype != np.dtype(tensor.dtype):
          raise ValueError(f"{tensor.name}: produced {array.dtype}{list(array.shape)}, "
                           f"planned {np.dtype(tensor.dtype)}{list(tensor.shape)}.")
        # Raw bytes of a contiguous view: no second copy (hosts are little-endian).
        f.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        del array  # release it before the next tensor is produced: one at a time
        weight_map[tensor.name] = path.name
    paths.append(path)
  total = sum(t.nbytes for t in tensors)
  index = {"metadata": {"total_size": total}, "weight_map": weight_map}
  (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
  return paths

