"""`c2jax eval` pointed at a running `c2jax serve` scores what the in-process engine
scores: the same random `tiny` model (an HF directory), greedy, on procgen tasks; per
(task, sample) the same prompt and completion tokens, transcript and pass/fail.

The random policy answers in one turn without tool calls, so these episodes exercise the
first turn; the multi-turn rendering of both tool-call modes is checked token for token
in tests/serve/test_serve_text_protocol.py and test_serve_tools.py."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from c2jax import model
from c2jax.agent import config as agent_config
from c2jax.agent import conversation
from c2jax.agent import prompt as prompt_lib
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.env import tasks as tasks_lib
from c2jax.env import tools as tools_lib
from c2jax.eval import runner
from c2jax.hf import convert
from c2jax.model import variants
from c2jax.serve import capture as capture_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "configs"))
import eval as eval_config  # pylint: disable=wrong-import-position,redefined-builtin

MAX_LENGTH = 1024


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("served") / "tiny-served"
  texts = [prompt_lib.system_message(agent_config.SYSTEM_PROMPT, [])] * 8
  tok = tokenizer_lib.train_bpe(texts + ["def f(x):\n    return x + 1\n"] * 8, 400)
  # The model's vocabulary is the tokenizer's, so every greedy token is text (ids past
  # the tokenizer would decode to nothing and leave nothing to compare).
  cfg = variants.get("tiny")
  cfg.vocab_size = tok.vocab_size
  convert.save(cfg, model.init(cfg, jax.random.key(1)), directory)
  tok.save(directory / "tokenizer.json")
  return directory


@pytest.fixture(scope="module")
def served(hf_dir, tmp_path_factory):
  capture = tmp_path_factory.mktemp("capture") / "served.jsonl"
  process = subprocess.Popen(
      [sys.executable, "-c", "from c2jax.cli import run; run()", "serve",
       f"--model={hf_dir}", "--port=0", "--slots=4", f"--max_length={MAX_LENGTH}",
       f"--capture={capture}"],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=dict(os.environ, PYTHONPATH=ROOT))
  try:
    deadline, url = time.time() + 180, None
    while url is None:
      line = process.stdout.readline()
      assert line or process.poll() is None, "c2jax serve exited before listening"
      assert time.time() < deadline, "c2jax serve did not start in time"
      if " on http://" in line:
        url = line.split(" on ")[1].split()[0]
    yield url, capture
  finally:
    process.terminate()
    process.wait(30)


def _config(**overrides):
  return _override(eval_config.get_config("procgen,tiny"), {
      "suite.args.count": 3, "eval.samples": 1, "eval.ks": (1,), "eval.progress": False,
      "agent.temperature": 0.0, "agent.max_turns": 2, "agent.max_turn_tokens": 12,
      "policy.max_length": MAX_LENGTH, "policy.slots": 4, **overrides})


def _scored_config(**overrides):
  return _override(eval_config.get_config("state_tracking,tiny"), overrides)


def _override(cfg, values):
  for key, value in values.items():
    node, *path = key.split(".")
    target = cfg[node]
    for part in path[:-1]:
      target = target[part]
    target[path[-1]] = value
  return cfg


def _by_key(workdir, name):
  lines = (workdir / name).read_text().splitlines()
  return {(r["task_id"], r["sample"]): r for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def engine_dir(hf_dir, tmp_path_factory):
  """The in-process engine's run, once for both tool-call modes."""
  workdir = tmp_path_factory.mktemp("engine")
  runner.run(_config(**{"policy.kind": "engine", "policy.run": str(hf_dir)}), str(workdir))
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize("tool_calls", ["native", "text"])
def test_eval_through_serve_matches_the_engine(tmp_path, hf_dir, served, engine_dir,
                                               tool_calls):
  url, capture = served
  served_dir = tmp_path / "served"
  runner.run(_config(**{"policy.kind": "openai", "policy.base_url": url,
                        "policy.model": hf_dir.name, "policy.api_key_env": "",
                        "policy.tool_calls": tool_calls}), str(served_dir))
  engine, remote = _by_key(engine_dir, "results.jsonl"), _by_key(served_dir, "results.jsonl")
  assert sorted(engine) == sorted(remote) and len(engine) == 3
  for key, mine in engine.items():
    theirs = remote[key]
    assert theirs["infra_error"] is None, theirs
    for field in ("score", "solved", "passed", "turns", "tool_calls", "finish_reason",
                  "completion_tokens", "prompt_tokens"):
      assert mine[field] == theirs[field], (key, field, mine[field], theirs[field])
  transcripts = (_by_key(engine_dir, "transcripts.jsonl"),
                 _by_key(served_dir, "transcripts.jsonl"))
  # Native mode sends the tools as specs, so its transcript's system message is the bare
  # prompt; serve lists them in the system message as the agent does (prompt_tokens above).
  first = 1 if tool_calls == "native" else 0
  for key in engine:
    ours, theirs = (t[key]["messages"] for t in transcripts)
    assert any(m["role"] == "assistant" and m["content"] for m in ours), ours
    assert ours[first:] == theirs[first:], key
  # Token for token: each task's first prompt, as serve rendered it, is the agent loop's.
  cfg = _config()
  tok = tokenizer_lib.Tokenizer.load(hf_dir / "tokenizer.json")
  specs = tools_lib.Toolbox(None, agent_config.toolset(cfg.agent)).specs()
  captured = {tuple(row["prompt_ids"].tolist()) for row in capture_lib.read(capture)}
  for task in tasks_lib.load_jsonl(served_dir / "tasks" / "tasks.jsonl"):
    ids = conversation.make_conversation(tok, cfg.agent).start(cfg.agent.system_prompt,
                                                               specs, task.prompt)
    assert tuple(np.asarray(ids).tolist()) in captured, task.id


@pytest.mark.slow
def test_state_tracking_through_serve_matches_the_engine(tmp_path, hf_dir, served):
  """The base-model suite over /v1/completions: the same greedy answers and scores. The
  budget is capped so both sides write max_new_tokens (the engine budgets from the
  answer's tokens, an endpoint from its bytes; a random model never closes the fence)."""
  url, _ = served
  args = {"suite.args.max_new_tokens": 16, "suite.args.count": 3,
          "policy.max_length": MAX_LENGTH, "eval.progress": False}
  engine_dir, served_dir = tmp_path / "engine", tmp_path / "served"
  runner.run(_scored_config(**args, **{"policy.run": str(hf_dir)}), str(engine_dir))
  runner.run(_scored_config(**args, **{"policy.kind": "openai", "policy.base_url": url,
                                       "policy.model": hf_dir.name,
                                       "policy.api_key_env": ""}), str(served_dir))
  engine, remote = _by_key(engine_dir, "results.jsonl"), _by_key(served_dir, "results.jsonl")
  assert sorted(engine) == sorted(remote) and len(engine) == 3
  # The engine skips (as infra errors, retried with a larger max_length) cases whose
  # prompt leaves no room for the whole true answer; an endpoint cannot tell, and tries.
  both = [k for k in engine if engine[k]["infra_error"] is None]
  assert both and all(remote[k]["infra_error"] is None for k in both)
  for key in both:
    mine, theirs = engine[key], remote[key]
    for field in ("score", "exact", "answer", "prompt_tokens", "completion_tokens"):
      assert mine[field] == theirs[field], (key, field, mine[field], theirs[field])
