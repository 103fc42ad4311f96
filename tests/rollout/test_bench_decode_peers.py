"""tools/bench/decode_peers.py --smoke: the c2jax side of the peer benchmark runs
without any peer installed (with and without log-probs) and reports a row with the
model's parameter count (what the peers are built to match) and both rates; the peers'
shape is the c2jax config's."""

import json
import math

import pytest

from c2jax.model import variants
from tools.bench import decode_peers


def test_decode_peers_smoke(capsys):
  decode_peers.main(["--smoke", "--c2jax_no_logprobs"])
  out = capsys.readouterr().out
  assert out.startswith("decode against the JAX peers, ")
  rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
  [row] = rows
  assert (row["model"], row["batch"], row["prompt"]) == ("qwen3_tiny", 2, 16)
  assert row["c2jax prefill tok/s"] > 0 and row["c2jax_nolp prefill tok/s"] > 0
  assert "decode vs c2jax_nolp" in row  # what the log-probs cost c2jax
  # A difference of two timings: positive, or NaN when the load hides 15 decode steps.
  assert math.isnan(row["c2jax decode tok/s"]) or row["c2jax decode tok/s"] > 0
  assert not any(key.startswith(("tunix", "hf")) for key in row)
  assert 1.1e6 < row["c2jax params"] < 1.2e6
  assert "| model | prompt | batch |" in out
  variant, overrides = decode_peers.MODELS["qwen3_moe_tiny"]
  shape = decode_peers._shape(variants.get(variant, **overrides))  # what a peer builds: every layer MoE, expert width
  assert (shape["layers"], shape["experts"], shape["top_k"], shape["ffn"]) == (2, 8, 2, 32)
  # MaxText's MaxEngine builds the DeepSeek-V3 rows from the MLA fields; Tunix never sees them.
  variant, overrides = decode_peers.MODELS["deepseek_v3_tiny"]
  cfg = variants.get(variant, **overrides)
  shape = decode_peers._shape(cfg)
  assert (shape["dense_ffn"], shape["first_dense"], shape["shared"], shape["q_lora"],
          shape["kv_lora"], shape["nope"], shape["rope"], shape["v"]) == (
              cfg.intermediate_size, 1, 1, cfg.q_lora_rank, cfg.kv_lora_rank,
              cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim)
  assert decode_peers.peers_for("deepseek_v3_small") == ["maxtext", "maxtext_sparse", "hf"]
  assert decode_peers.peers_for("qwen3_moe_tiny") == ["tunix", "tunix_logprobs", "hf"]


def test_repeats_report_the_median_ratio_of_each_row():
  runs = [[{"model": "qwen3_tiny", "prompt": 16, "batch": b, "c2jax decode tok/s": 1.0,
            "decode vs tunix": ratio * b, "prefill vs tunix": 2.0}
           for b in (1, 8)] for ratio in (0.9, 1.4, 1.1)]
  rows = decode_peers.median_rows(runs)
  assert [r["batch"] for r in rows] == [1, 8]
  assert rows[0]["median decode vs tunix"] == 1.1
  assert rows[0]["decode vs tunix (min-max)"] == "0.90-1.40"
  assert rows[1]["median decode vs tunix"] == 8.8
  assert rows[1]["median prefill vs tunix"] == 2.0
  assert not any("tok/s" in key for key in rows[0])
  runs[1][0]["batch"] = 32
  with pytest.raises(ValueError, match="disagree"):
    decode_peers.median_rows(runs)


def test_split_method_times_prefill_and_decode_apart(capsys):
  """--method split: each call's prefill, then its decode from the prefilled cache (the
  sequence extended by its first token), for long prompts whose prefill would swamp the
  difference of two whole calls."""
  decode_peers.main(["--smoke", "--method", "split"])
  [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()
           if line.startswith("{")]
  assert row["c2jax prefill tok/s"] > 0
  assert math.isnan(row["c2jax decode tok/s"]) or row["c2jax decode tok/s"] > 0
  with pytest.raises(SystemExit, match="--new_tokens >= 3"):
    decode_peers.main(["--method", "split", "--new_tokens", "2"])
