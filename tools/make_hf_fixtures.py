"""Builds the HF parity fixtures under tests/fixtures/hf/<case>/ with HF's own code.

Run with a Python that has `torch` and `transformers` ($C2JAX_TORCH_PYTHON, README's "HF
reference fixtures"; not the project's 3.12 venv):

  $C2JAX_TORCH_PYTHON tools/make_hf_fixtures.py            # (re)build all cases
  $C2JAX_TORCH_PYTHON tools/make_hf_fixtures.py --verify   # reload + re-run them

Each case is a tiny random float32 model whose config exercises some of the options c2jax
must match exactly (group-limited routing, YaRN with mscale/mscale_all_dim, first-k dense,
shared experts, q_lora_rank None, interleaved rope, Qwen3-MoE GQA + q/k norm + softmax
router with and without renormalisation, the Kimi-K2.5 wrapper layout, Qwen3 dense). Per case it writes
`config.json`, `model.safetensors` (the legacy per-expert tensor names real checkpoints
use), `tokens.npy` (int32 [2, 32]) and `logits.npy` (float32 [2, 32, V], HF's output).

Randomisation is deliberately "loud": norm scales away from 1, a correction bias large
enough to change which experts win, a router wide enough that routing is decisive (no
near-ties that would flip between frameworks), so a bug cannot hide behind trivial values.

`--verify` reloads every fixture directory with `from_pretrained` (checking the on-disk
names load into transformers) and asserts the logits are reproduced; with
`--jax_logits DIR` it also compares `DIR/<case>.npy` (c2jax's logits, written by
tests/hf/test_parity.py's live test, which runs this from the 3.12 suite) against the
freshly computed transformers logits: the live HF-vs-JAX check.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "hf"
BATCH, LENGTH, VOCAB = 2, 32, 256

_DEEPSEEK_BASE = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
    qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=64,
    rms_norm_eps=1e-6, initializer_range=0.1, num_mtp_layers=0, tie_word_embeddings=False,
    bos_token_id=0, eos_token_id=1)

# name -> (model_type, HF config kwargs). Comments say which options each case covers.
CASES: dict[str, tuple[str, dict]] = {
    # Group-limited routing (4 groups, top-2 groups), YaRN with distinct mscale and
    # mscale_all_dim, 1 dense + 2 MoE layers, one shared expert, interleaved rope.
    "deepseek_v3_grouped_yarn": ("deepseek_v3", dict(
        _DEEPSEEK_BASE, num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8,
        num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1,
        norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=16, beta_fast=32.0,
                             beta_slow=1.0, mscale=1.3, mscale_all_dim=0.7))),
    # q_lora_rank None (one q projection), no dense layers, two shared experts (one MLP of
    # width 2*Fe), no renormalisation, plain rope laid out non-interleaved.
    "deepseek_v3_qproj_plain": ("deepseek_v3", dict(
        _DEEPSEEK_BASE, num_hidden_layers=2, first_k_dense_replace=0, q_lora_rank=None,
        n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
        n_shared_experts=2, norm_topk_prob=False, routed_scaling_factor=1.7,
        rope_interleave=False, rope_parameters=dict(rope_type="default", rope_theta=500.0))),
    # Kimi-K2.5 wrapper layout (text_config, `language_model.` tensor prefix) around a
    # Kimi-K2-style backbone: one group, YaRN with beta 1/1 and mscale == mscale_all_dim.
    "kimi_k25_text": ("kimi_k25", dict(
        _DEEPSEEK_BASE, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8,
        num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
        norm_topk_prob=True, routed_scaling_factor=2.827, rope_interleave=True,
        rope_parameters=dict(rope_type="yarn", rope_theta=50000.0, factor=4.0,
                             original_max_position_embeddings=16, beta_fast=1.0,
                             beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))),
    # Qwen3-MoE: GQA (4 q heads over 2 kv heads), q/k norm, softmax top-k renormalised,
    # first layer dense through mlp_only_layers.
    "qwen3_moe_norm": ("qwen3_moe", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0],
        max_position_embeddings=64, rms_norm_eps=1e-6, initializer_range=0.1,
        tie_word_embeddings=False, rope_parameters=dict(rope_type="default",
                                                        rope_theta=10000.0))),
    # Qwen3-MoE without renormalisation, all layers sparse, YaRN without mscale (HF's
    # attention factor then comes from the factor alone).
    "qwen3_moe_nonorm_yarn": ("qwen3_moe", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
        num_experts=8, num_experts_per_tok=3, norm_topk_prob=False, mlp_only_layers=[],
        max_position_embeddings=64, rms_norm_eps=1e-6, initializer_range=0.1,
        tie_word_embeddings=False,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=16))),
    # Qwen3 dense (Qwen3ForCausalLM): GQA (4 q heads over 2 kv heads), q/k norm, a dense
    # MLP in every layer, no experts.
    "qwen3_dense": ("qwen3", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=64, rms_norm_eps=1e-6, initializer_range=0.1,
        tie_word_embeddings=False, rope_parameters=dict(rope_type="default",
                                                        rope_theta=10000.0))),
}


def _text_model(model_type: str, kwargs: dict) -> torch.nn.Module:
  config_type = "deepseek_v3" if model_type == "kimi_k25" else model_type
  config = transformers.AutoConfig.for_model(config_type, **kwargs)
  config._attn_implementation = "eager"  # the reference path, no fused kernels
  return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _randomise(model: torch.nn.Module, seed: int) -> None:
  """Moves norm scales and correction biases away from their trivial initial values."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, tensor in model.state_dict(keep_vars=True).items():
      if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        tensor.copy_(1.0 + 0.3 * torch.randn(tensor.shape, generator=gen))
      elif name.endswith("e_score_correction_bias"):
        tensor.copy_(0.15 * torch.randn(tensor.shape, generator=gen))
      elif name.endswith("mlp.gate.weight"):  # a decisive router: no near-ties
        tensor.copy_(0.5 * torch.randn(tensor.shape, generator=gen))


def _legacy_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
  """Splits fused expert tensors into legacy per-expert names, if the save fused them."""
  out = {}
  for name, tensor in state.items():
    fused = re.fullmatch(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)", name)
    if not fused:
      out[name] = tensor
      continue
    prefix, kind = fused.groups()
    for e in range(tensor.shape[0]):
      if kind == "down_proj":  # [E, D, Fe]: each expert's Linear weight is [D, Fe]
        out[f"{prefix}.{e}.down_proj.weight"] = tensor[e].clone()
      else:  # [E, 2*Fe, D]: gate rows then up rows
        gate, up = tensor[e].chunk(2, dim=0)
        out[f"{prefix}.{e}.gate_proj.weight"] = gate.clone()
        out[f"{prefix}.{e}.up_proj.weight"] = up.clone()
  return out


def _write_weights(model: torch.nn.Module, model_type: str, out: pathlib.Path) -> None:
  with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(tmp)  # transformers' own on-disk format (config + weights)
    state = {}
    for shard in sorted(pathlib.Path(tmp).glob("*.safetensors")):
      state.update(load_file(shard))
    config = json.loads((pathlib.Path(tmp) / "config.json").read_text())
  state = _legacy_state(state)
  if any("gate_up_proj" in n or n.endswith("experts.down_proj") for n in state):
    raise AssertionError("fused expert names survived the legacy conversion")
  if model_type == "kimi_k25":  # Kimi-K2.5's checkpoints nest the text model this way
    state = {f"language_model.{n}": t for n, t in state.items()}
    config = {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
              "tie_word_embeddings": False,
              "text_config": dict(config, model_type="kimi_k2")}
  save_file({n: t.contiguous() for n, t in sorted(state.items())},
            str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _logits(model: torch.nn.Module, tokens: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    result = model(input_ids=torch.from_numpy(tokens).long(), use_cache=False)
  return result.logits.float().numpy()


def build(case: str, seed: int) -> None:
  model_type, kwargs = CASES[case]
  torch.manual_seed(seed)
  model = _text_model(model_type, kwargs).eval()
  _randomise(model, seed)
  tokens = np.random.default_rng(seed).integers(0, VOCAB, (BATCH, LENGTH), dtype=np.int32)
  out = FIXTURES / case
  shutil.rmtree(out, ignore_errors=True)
  out.mkdir(parents=True)
  _write_weights(model, model_type, out)
  np.save(out / "tokens.npy", tokens)
  np.save(out / "logits.npy", _logits(model, tokens))
  print(f"{case}: wrote {sorted(p.name for p in out.iterdir())}")


def load_fixture_model(case_dir: pathlib.Path) -> torch.nn.Module:
  """The fixture's HF model, loaded from disk through transformers' own loader."""
  config = json.loads((case_dir / "config.json").read_text())
  if config["model_type"] != "kimi_k25":
    model = transformers.AutoModelForCausalLM.from_pretrained(
        case_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()
  # The text backbone of Kimi-K2.5 is a DeepseekV3 model under `language_model.`.
  text = dict(config["text_config"], model_type="deepseek_v3")
  text_config = transformers.AutoConfig.for_model(**text)
  text_config._attn_implementation = "eager"
  model = transformers.AutoModelForCausalLM.from_config(text_config, dtype=torch.float32)
  state = {n.removeprefix("language_model."): t
           for n, t in load_file(case_dir / "model.safetensors").items()}
  merged = {}
  for name, tensor in state.items():  # legacy per-expert names -> this version's fused
    match = re.fullmatch(r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight",
                         name)
    if match:
      merged.setdefault((match.group(1), match.group(3)), {})[int(match.group(2))] = tensor
    else:
      model.state_dict()[name].copy_(tensor)
  for (prefix, kind), experts in merged.items():
    stacked = torch.stack([experts[e] for e in sorted(experts)])
    if kind == "down_proj":
      model.state_dict()[f"{prefix}.down_proj"].copy_(stacked)
    else:
      target = model.state_dict()[f"{prefix}.gate_up_proj"]
      half = target.shape[1] // 2
      (target[:, :half] if kind == "gate_proj" else target[:, half:]).copy_(stacked)
  return model.eval()


def verify(jax_logits: pathlib.Path | None) -> None:
  for case in CASES:
    case_dir = FIXTURES / case
    tokens = np.load(case_dir / "tokens.npy")
    expected = np.load(case_dir / "logits.npy")
    reloaded = _logits(load_fixture_model(case_dir), tokens)
    diff = float(np.abs(reloaded - expected).max())
    line = f"{case}: HF reload max|diff| = {diff:.3g}"
    if diff > 1e-5:
      raise SystemExit(f"{line}: the fixture no longer reproduces; rebuild it.")
    if jax_logits:
      ours = np.load(jax_logits / f"{case}.npy")
      jax_diff = float(np.abs(ours - reloaded).max())
      line += f"; c2jax vs live HF max|diff| = {jax_diff:.3g}"
      if jax_diff > 1e-4:
        raise SystemExit(f"{line}: c2jax disagrees with transformers (tolerance 1e-4).")
    print(line)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--verify", action="store_true",
                      help="reload the written fixtures with transformers and re-check them")
  parser.add_argument("--jax_logits", type=pathlib.Path, default=None,
                      help="with --verify: directory of <case>.npy c2jax logits to compare")
  parser.add_argument("--cases", nargs="*", default=sorted(CASES), choices=sorted(CASES))
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  if args.verify:
    verify(args.jax_logits)
    return
  for case in args.cases:  # a case's seed does not depend on which others are rebuilt
    build(case, args.seed + sorted(CASES).index(case))


if __name__ == "__main__":
  main()
