"""tools/bench/serve.py --smoke runs end to end and reports consistent numbers."""

import pytest

from tools.bench import serve

pytest.importorskip("openai")


def test_bench_serve_smoke(capsys):
  result = serve.main(["--smoke", "--clients", "4"])
  assert result["engine_tokens_per_s"] > 0 and result["server_tokens_per_s"] > 0
  # 4 clients x 1 round x at most 16 tokens (fewer only if <|eos|> was sampled).
  assert 4 <= result["server_tokens"] <= 64
  assert result["ratio"] == pytest.approx(
      result["server_tokens_per_s"] / result["engine_tokens_per_s"], rel=0.01)
  assert '"ratio"' in capsys.readouterr().out
