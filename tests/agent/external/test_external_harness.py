"""External harnesses against a live tiny `c2jax serve` on 127.0.0.1: a scripted openai
client (exact stitching, including a request that does not extend the prefix) and
mini-swe-agent on a procgen task. Trajectories must be exactly the captured tokens."""

import importlib.util
import json
import os
import shlex
import sys

import numpy as np
import pytest

from c2jax.agent import external
from c2jax.agent import prompt as agent_prompt
from c2jax.data import chat
from c2jax.agent.external import stitching as stitch_lib
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.env import procgen
from c2jax.rollout import JaxEngine
from c2jax.serve import Running, Service, read_capture
from tests.model.conftest import random_params, tiny_cfg
from tests.serve.conftest import ScriptedEngine

openai = pytest.importorskip("openai")

VOCAB = 512
MODEL = "tiny-policy"
FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "external_fake_harness.py")
TEXTS = ["You fix bugs. Run the tests. Go on. Done? Summary: tests fail.",
         "def main():\n    return parse(args)\n", "Fix the failing test in src/app.py.",
         '{"type": "function", "function": {"name": "bash", "description": "Execute a bash '
         'command", "parameters": {"type": "object", "properties": {"command": {"type": '
         '"string", "description": "The bash command to execute"}}, "required": '
         '["command"]}}}', "<returncode>0</returncode>\n<output>\n</output>"] * 40


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("external")
  tokenizer = tokenizer_lib.train_bpe(TEXTS, VOCAB - 8)
  cfg = tiny_cfg(vocab_size=VOCAB, num_layers=2)
  engine = JaxEngine(cfg, random_params(cfg), num_slots=2, max_length=1024,
                     prefill_buckets=(256, 1024), detokenize=tokenizer.decode, version=3)
  capture = str(tmp / "capture.jsonl")
  with Running(Service(engine, tokenizer, MODEL, vocab_size=VOCAB,
                       capture_path=capture)) as running:
    yield running, capture


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  return procgen.generate(str(tmp_path_factory.mktemp("repos")), seed=5, difficulty=1)


def _need_mini_swe_agent():
  # find_spec, not import: importing minisweagent here would write its user config.
  if importlib.util.find_spec("minisweagent") is None:
    pytest.skip("mini-swe-agent is not installed (pip install mini-swe-agent, in the "
                "`test` extra)")


def _config(**overrides):
  cfg = external.default_config()
  cfg.update(overrides)
  external.validate(cfg)
  return cfg


def _check_exact(trajectory, rows):
  """Every segment is the last request's prompt + completion of a run of requests that
  extend each other; the sampled positions carry the captured logprobs and versions."""
  runs, boundaries = [[rows[0]]], []
  for previous, row in zip(rows, rows[1:]):
    full = np.concatenate([previous["prompt_ids"], previous["completion_ids"]])
    if np.array_equal(row["prompt_ids"][:len(full)], full):
      runs[-1].append(row)
    else:
      runs.append([row])
      boundaries.append(row["id"])
  assert len(trajectory.segments) == len(runs)
  for segment, run in zip(trajectory.segments, runs):
    last = run[-1]
    np.testing.assert_array_equal(
        segment.tokens, np.concatenate([last["prompt_ids"], last["completion_ids"]]))
    sampled = np.flatnonzero(segment.loss_mask)
    assert len(sampled) == sum(len(r["completion_ids"]) for r in run)
    np.testing.assert_allclose(segment.sampler_logprobs[sampled],
                               np.concatenate([r["logprobs"] for r in run]), rtol=1e-6)
    np.testing.assert_array_equal(segment.versions[sampled],
                                  np.concatenate([r["versions"] for r in run]))
    assert (segment.versions[segment.loss_mask == 0] == -1).all()
    assert (segment.sampler_logprobs[segment.loss_mask == 0] == 0).all()
    assert segment.router_indices.shape[0] == len(segment.tokens)
    np.testing.assert_array_equal(segment.router_indices[:len(run[0]["prompt_ids"])],
                                  run[0]["expert_indices"][:len(run[0]["prompt_ids"])])
    assert segment.stats.turns == len(run)
  return runs


def test_scripted_harness_is_stitched_by_token_prefix(server, task):
  running, capture = server
  cfg = _config(harness="command", command=f"{sys.executable} {FAKE} {{task_file}}",
                timeout_s=240.0)
  trajectory = external.run_episode(task, cfg, base_url=running.base_url, model=MODEL,
                                    capture_path=capture, tag="fake-1")
  rows = stitch_lib.episode_rows(read_capture(capture), f"{MODEL}@fake-1")
  assert len(rows) == 5
  runs = _check_exact(trajectory, rows)
  # The script's third call restarts the conversation: two segments, 2 + 3 requests.
  assert [len(run) for run in runs] == [2, 3]
  assert (trajectory.segments[0].versions[trajectory.segments[0].loss_mask > 0] == 3).all()
  # Rewarded by the hidden tests: nothing was fixed, so the FAIL_TO_PASS still fail.
  assert set(trajectory.passed) == set(task.fail_to_pass + task.pass_to_pass)
  assert not trajectory.solved and trajectory.stats.tests_total == len(trajectory.passed)
  assert trajectory.stats.turns == 5 and trajectory.finish_reason == "finish"


def test_stitch_starts_a_segment_when_the_prompt_diverges():
  def row(rid, prompt, completion, created):
    n = len(prompt) + len(completion)
    return {"id": rid, "model": "m@a", "created": created,
            "prompt_ids": np.int32(prompt), "completion_ids": np.int32(completion),
            "logprobs": np.float32([-0.1 * (i + 1) for i in range(len(completion))]),
            "versions": np.int32([created] * len(completion)),
            "expert_indices": np.arange(n * 2, dtype=np.int32).reshape(n, 1, 2) + created}
  rows = [row("r2", [1, 2, 3, 9, 5, 6], [7], 2), row("r1", [1, 2], [3, 9], 1),
          row("r3", [1, 2, 4], [8], 3), row("other", [1], [2], 0)]
  rows[-1]["model"] = "m@b"
  mine = stitch_lib.episode_rows(rows, "m@a")
  assert [r["id"] for r in mine] == ["r1", "r2", "r3"]
  first, second = stitch_lib.stitch(mine)
  np.testing.assert_array_equal(first.tokens, [1, 2, 3, 9, 5, 6, 7])
  np.testing.assert_array_equal(first.loss_mask, [0, 0, 1, 1, 0, 0, 1])
  np.testing.assert_array_equal(first.versions, [-1, -1, 1, 1, -1, -1, 2])
  np.testing.assert_allclose(first.sampler_logprobs, [0, 0, -0.1, -0.2, 0, 0, -0.1])
  # Token 9 (r1's last sample) was first fed by r2: its routing row comes from r2.
  np.testing.assert_array_equal(first.router_indices[3], mine[1]["expert_indices"][3])
  np.testing.assert_array_equal(first.router_indices[2], mine[0]["expert_indices"][2])
  np.testing.assert_array_equal(first.router_indices[4:], mine[1]["expert_indices"][4:])
  np.testing.assert_array_equal(second.tokens, [1, 2, 4, 8])
  assert first.stats.turns == 2 and first.stats.tool_output_tokens == 2
  assert second.stats.final_message_tokens == 1 and first.stats.final_message_tokens == 0


def test_mini_swe_agent_episode_is_the_captured_tokens(server, task):
  _need_mini_swe_agent()
  running, capture = server
  cfg = _config(harness="mini_swe_agent", max_turns=3, max_tokens=8, timeout_s=300.0)
  # Short templates keep the prompt within the tiny engine's 1024 tokens.
  cfg.mini_swe_agent.system_template = "You fix bugs with bash."
  cfg.mini_swe_agent.instance_template = "{{task}}"
  task_short = type(task)(**{**task.to_json(), "prompt": "Fix the failing test."})
  trajectory = external.run_episode(task_short, cfg, base_url=running.base_url,
                                    model=MODEL, capture_path=capture, tag="mini-1")
  rows = stitch_lib.episode_rows(read_capture(capture), f"{MODEL}@mini-1")
  assert 1 <= len(rows) <= 3
  _check_exact(trajectory, rows)
  assert trajectory.messages and trajectory.messages[0]["role"] == "system"
  assert trajectory.finish_reason in ("max_turns", "answer", "finish")
  assert set(trajectory.passed) == set(task.fail_to_pass + task.pass_to_pass)
  assert trajectory.stats.tests_total == len(trajectory.passed)


def _bash_turn_tokens(tokenizer, command: str) -> list[int]:
  """The tokens of an assistant turn calling mini-swe-agent's bash tool, through the
  closing <|end|>, as the chat template lays them out."""
  turn = {"role": "assistant", "content": "Fixing it.", "tool_calls": [
      {"id": "x", "type": "function",
       "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]}
  head = [{"role": "system", "content": agent_prompt.system_message("s", [])},
          {"role": "user", "content": "u"}]
  prompt = chat.render(tokenizer, head, add_generation_prompt=True).ids
  full = chat.render(tokenizer, head + [turn]).ids
  script = full[len(prompt):-1]
  assert script[-1] == tokenizer.token_id("<|end|>")
  return script.tolist()


def test_mini_swe_agent_solves_a_task_through_a_scripted_policy(task, tmp_path):
  """A policy that always calls bash with one command: the first run applies the task's
  fix, the second submits. The second request extends the first (assistant tool call +
  observation sent back), so the episode is one segment; the hidden tests pass."""
  _need_mini_swe_agent()
  [(path, old, new)] = task.metadata["solution"]
  fix = "python3 -c " + shlex.quote(f"import pathlib; p = pathlib.Path({path!r}); "
                                    f"p.write_text(p.read_text().replace({old!r}, {new!r}))")
  command = (f"if grep -qF {shlex.quote(new.strip())} {path}; then "
             f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; else {fix} && echo fixed; fi")
  tokenizer = tokenizer_lib.train_bpe(TEXTS, VOCAB - 8)
  engine = ScriptedEngine(_bash_turn_tokens(tokenizer, command), num_slots=2)
  capture = str(tmp_path / "capture.jsonl")
  cfg = _config(harness="mini_swe_agent", max_turns=4, max_tokens=2048, timeout_s=300.0)
  cfg.mini_swe_agent.system_template = "You fix bugs with bash."
  with Running(Service(engine, tokenizer, "scripted", vocab_size=VOCAB,
                       capture_path=capture)) as running:
    trajectory = external.run_episode(task, cfg, base_url=running.base_url,
                                      model="scripted", capture_path=capture, tag="m",
                                      seed=11)
  rows = read_capture(capture)
  assert len(rows) == 2 and len(trajectory.segments) == 1, trajectory.messages
  _check_exact(trajectory, rows)
  assert trajectory.finish_reason == "finish" and trajectory.solved
  assert trajectory.stats.turns == 2 and trajectory.stats.tests_passed > 0
  assert trajectory.stats.tool_call_counts == {"bash": 2}
  assert [row["sampling"]["seed"] for row in rows] == [11, 11]  # the harness sent it
  assert [m["role"] for m in trajectory.messages][:4] == ["system", "user", "assistant",
                                                         "tool"]


def test_reading_a_live_capture_from_an_offset(tmp_path):
  path = tmp_path / "c.jsonl"
  line = lambda i: json.dumps({"id": f"r{i}", "prompt_ids": [1], "completion_ids": [2],
                               "logprobs": [-0.5], "versions": [[0, 1]],
                               "expert_indices": {"dtype": "|u1", "shape": [0],
                                                  "base64": ""}})
  first, second = line(1) + "\n", line(2) + "\n"
  path.write_text(first + second + line(3)[:20])  # r3 is still being written
  assert [r["id"] for r in read_capture(path, live=True)] == ["r1", "r2"]
  assert [r["id"] for r in read_capture(path, len(first), live=True)] == ["r2"]
  assert [r["id"] for r in read_capture(path, 5, live=True)] == ["r2"]  # r1 began before
  with pytest.raises(ValueError, match="torn last line"):
    read_capture(path)  # a whole-file read of a stopped server reports the torn line


def test_the_server_accepts_tagged_model_names_and_captures_them(server):
  running, capture = server
  client = openai.OpenAI(base_url=running.base_url, api_key="none", max_retries=0)
  reply = client.chat.completions.create(model=f"{MODEL}@probe-7", max_tokens=2,
                                         messages=[{"role": "user", "content": "Go on."}])
  [row] = [r for r in read_capture(capture) if r["id"] == reply.id]
  assert row["model"] == f"{MODEL}@probe-7"
  for wrong in (f"{MODEL}x", "other@probe-7", f"{MODEL}-probe"):
    with pytest.raises(openai.NotFoundError, match="is not served here"):
      client.chat.completions.create(model=wrong, max_tokens=2,
                                     messages=[{"role": "user", "content": "Go on."}])
