"""`c2jax convert`: HF safetensors <-> c2jax checkpoint, streaming tensor by tensor.

  c2jax convert --from-hf HF_DIR --out CKPT
  c2jax convert --from CKPT --to-hf HF_DIR [--max_shard_gb 5] [--quantize fp8|fp8-ue8m0|int4]

Quantised HF checkpoints (DeepSeek FP8 blocks, Kimi INT4 pack-quantized) are dequantised
on the way in; `--quantize` writes one of those released layouts on the way out.
"""

from __future__ import annotations

import json

from absl import flags

from c2jax.hf import convert, quantized

_FROM_HF = flags.DEFINE_string("from-hf", None, "HF model directory to read.")
_OUT = flags.DEFINE_string("out", None, "c2jax checkpoint directory to write.")
_FROM = flags.DEFINE_string("from", None, "c2jax checkpoint directory to read.")
_TO_HF = flags.DEFINE_string("to-hf", None, "HF model directory to write.")
_MAX_SHARD_GB = flags.DEFINE_float("max_shard_gb", 5.0, "Largest safetensors shard (GiB).")
_QUANTIZE = flags.DEFINE_enum("quantize", None, sorted(quantized.EXPORT_SCHEMES),
                              "With --to-hf: write this released quantised format.")

USAGE = ("use either `--from-hf HF_DIR --out CKPT` or `--from CKPT --to-hf HF_DIR`.")


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"c2jax convert: unexpected arguments {argv[1:]}; {USAGE}")
  hf_in, out, ckpt_in, hf_out = _FROM_HF.value, _OUT.value, _FROM.value, _TO_HF.value
  if _QUANTIZE.value and not hf_out:
    raise SystemExit("c2jax convert: --quantize applies to --to-hf output only.")
  if hf_in and out and not (ckpt_in or hf_out):
    summary = convert.convert_from_hf(hf_in, out)
  elif ckpt_in and hf_out and not (hf_in or out):
    summary = convert.convert_to_hf(
        ckpt_in, hf_out, max_shard_bytes=int(_MAX_SHARD_GB.value * 2**30),
        quantize=_QUANTIZE.value)
  else:
    raise SystemExit(f"c2jax convert: {USAGE}")
  print(json.dumps(summary))
  return 0
