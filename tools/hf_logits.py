"""Logits of an HF model directory computed by transformers itself (float32, eager).

  $C2JAX_TORCH_PYTHON tools/hf_logits.py HF_DIR TOKENS.npy OUT.npy

For checking a `c2jax export` against the reference implementation: TOKENS.npy holds int
token ids [B, L]; OUT.npy receives float32 logits [B, L, V]. Prints the tensors
transformers did not load (e.g. DeepSeek-V3 MTP layers, which it has no module for).
"""

import sys

import numpy as np
import torch
import transformers


def main() -> None:
  if len(sys.argv) != 4:
    raise SystemExit(__doc__)
  hf_dir, tokens_path, out_path = sys.argv[1:]
  model, info = transformers.AutoModelForCausalLM.from_pretrained(
      hf_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
  if info.get("missing_keys"):
    raise SystemExit(f"transformers found no weights for {sorted(info['missing_keys'])[:5]}")
  print("unexpected (not loaded):", len(info.get("unexpected_keys", [])))
  tokens = torch.from_numpy(np.load(tokens_path)).long()
  with torch.no_grad():
    logits = model.eval()(input_ids=tokens, use_cache=False).logits
  np.save(out_path, logits.float().numpy())


if __name__ == "__main__":
  main()
