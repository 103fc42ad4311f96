"""`c2jax export`: any phase's run as an HF model directory (transformers loads it).

  c2jax export --run RUN [--step N] --to-hf OUT [--dtype bf16|float32]
               [--quantize fp8|fp8-ue8m0|int4] [--max_shard_gb 5]

RUN is the workdir of a pretrain / longctx / sft / mtp / rl run; the newest step unless
--step. The parameters keep their stored dtype unless --dtype. MTP modules are written as
DeepSeek-V3 extra decoder layers (config.json's num_nextn_predict_layers). --quantize
writes a released model's layout: DeepSeek FP8 (128x128 block scales) or compressed-tensors
INT4 (group 32) for the weights that format quantises.
"""

from __future__ import annotations

import json

from absl import flags

from c2jax.hf import export, quantized

_RUN = flags.DEFINE_string("run", None, "The c2jax run directory (workdir) to export.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest).")
_TO_HF = flags.DEFINE_string("to-hf", None, "HF model directory to write (new or empty).")
_DTYPE = flags.DEFINE_enum("dtype", None, sorted(export.DTYPES),
                           "Parameter dtype on disk (default: as stored in the run).")
_QUANTIZE = flags.DEFINE_enum("quantize", None, sorted(quantized.EXPORT_SCHEMES),
                              "Write this released quantised layout (default: plain weights).")
_MAX_SHARD_GB = flags.DEFINE_float("max_shard_gb", 5.0, "Largest safetensors shard (GiB).")


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"c2jax export: unexpected arguments {argv[1:]}; use --run RUN "
                     "--to-hf OUT [--step N] [--dtype bf16|float32].")
  if not _RUN.value or not _TO_HF.value:
    raise SystemExit("c2jax export: --run RUN and --to-hf OUT are both required.")
  try:
    summary = export.export_run(_RUN.value, _TO_HF.value, step=_STEP.value,
                                dtype=_DTYPE.value, quantize=_QUANTIZE.value,
                                max_shard_bytes=int(_MAX_SHARD_GB.value * 2**30))
  except (export.ExportError, FileExistsError, ValueError) as err:
    raise SystemExit(f"c2jax export: {err}") from None
  print(json.dumps(summary))
  return 0
