"""Builds tests/fixtures/hf_saved/<case>/: a tiny model directory written by transformers'
own `save_pretrained`, exactly as a user's fine-tune or a hub upload looks.

  $C2JAX_TORCH_PYTHON tools/make_hf_saved_fixture.py

Unlike tools/make_hf_fixtures.py (which rewrites the weights itself), nothing here is
post-processed, so the directory carries what c2jax must load as it is: config.json keeps
`num_nextn_predict_layers: 1` although transformers stores no MTP tensors, and whatever
tensor names this transformers version writes (5.x: per-expert names; a fused layout is
covered by tests/hf/test_init_sources.py). It also holds a
tokenizer (tokenizer.json + tokenizer_config.json, a 1024-entry word-level vocabulary) and
generation_config.json, which `c2jax export` must carry through. `tokens.npy` /
`logits.npy` are transformers' float32 outputs for the stored weights.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

import numpy as np
import tokenizers
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_hf_fixtures import BATCH, LENGTH, _DEEPSEEK_BASE, _logits, _randomise  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "hf_saved"
# The vocabulary of the tests' tiny pretraining corpus (tests/train/train_testlib.py), so
# `c2jax pretrain --config.init_from=<fixture>` trains it on that corpus.
VOCAB = 1024
CASES = {
    # 1 dense + 2 MoE layers, a shared expert, grouped routing; MTP declared, not stored.
    "deepseek_v3_mtp_declared": dict(
        _DEEPSEEK_BASE, vocab_size=VOCAB, num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
        norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
        num_nextn_predict_layers=1,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
}


def _tokenizer() -> transformers.PreTrainedTokenizerFast:
  specials = ["<s>", "</s>", "<unk>"]
  vocab = {token: i for i, token in enumerate(specials)}
  for i in range(VOCAB - len(specials)):
    vocab[f"w{i}"] = len(vocab)
  model = tokenizers.models.WordLevel(vocab, unk_token="<unk>")
  tok = tokenizers.Tokenizer(model)
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def build(case: str, seed: int) -> None:
  torch.manual_seed(seed)
  config = transformers.AutoConfig.for_model("deepseek_v3", **CASES[case])
  config._attn_implementation = "eager"
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
  _randomise(model, seed)
  out = OUT / case
  shutil.rmtree(out, ignore_errors=True)
  model.save_pretrained(out)
  _tokenizer().save_pretrained(out)
  tokens = np.random.default_rng(seed).integers(0, VOCAB, (BATCH, LENGTH), dtype=np.int32)
  np.save(out / "tokens.npy", tokens)
  np.save(out / "logits.npy", _logits(model, tokens))
  print(f"{case}: wrote {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
  for index, name in enumerate(sorted(CASES)):
    build(name, 100 + index)
