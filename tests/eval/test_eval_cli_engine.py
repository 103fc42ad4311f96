"""`c2jax eval` end to end with the real JaxEngine: a random `tiny` model saved as an HF
directory (config.json, safetensors, tokenizer.json), one short turn per task."""

import json
import os
import subprocess
import sys

import jax
import pytest

from c2jax import model
from c2jax.agent import config as agent_config
from c2jax.agent import prompt as prompt_lib
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.hf import convert
from c2jax.model import variants

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TURN_TOKENS = 8


@pytest.mark.slow
def test_eval_command_runs_a_checkpoint_on_the_jax_engine(tmp_path):
  hf_dir = tmp_path / "hf"
  cfg = variants.get("tiny")
  convert.save(cfg, model.init(cfg, jax.random.key(0)), hf_dir)
  texts = [prompt_lib.system_message(agent_config.SYSTEM_PROMPT, [])] * 8
  tokenizer_lib.train_bpe(texts + ["def f(x):\n    return x + 1\n"] * 8, 400).save(
      hf_dir / "tokenizer.json")
  workdir = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-c", "from c2jax.cli import run; run()", "eval",
       f"--config={ROOT}/configs/eval.py:procgen,tiny", f"--workdir={workdir}",
       "--config.policy.kind=engine", f"--config.policy.run={hf_dir}",
       "--config.suite.args.count=2", "--config.eval.samples=2", "--config.eval.ks=(1,2)",
       "--config.agent.max_turns=1", f"--config.agent.max_turn_tokens={TURN_TOKENS}",
       "--config.policy.slots=4", "--config.policy.max_length=1024",
       "--config.eval.progress=false"],
      env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  overall = json.loads(proc.stdout.strip().splitlines()[-1])
  assert overall["episodes"] == 4 and overall["infra_errors"] == 0
  records = [json.loads(l) for l in (workdir / "results.jsonl").read_text().splitlines()]
  for r in records:
    assert r["policy"] == "hf" and r["turns"] == 1
    assert 1 <= r["completion_tokens"] <= TURN_TOKENS and r["prompt_tokens"] > 100
    assert r["finish_reason"] in ("max_turns", "answer", "finish")
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["overall"]["pass@2_tasks"] == 2
