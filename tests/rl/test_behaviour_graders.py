"""Behaviour graders: rule-based checks on transcripts, the `behaviour` reward term, the
actor's hook (rollouts.make_group) and the model judge against a fake endpoint."""

import http.server
import json
import threading

import numpy as np
import pytest

from c2jax import config as configlib
from c2jax.agent.loop import RolloutError, Segment, Trajectory
from c2jax.rl import config
from c2jax.rl.rewards import behaviour
from c2jax.rl.rewards import terms as rewards
from c2jax.rl.actors import rollouts
from c2jax.rl.rewards.terms import TrajectoryStats


def call(name, **arguments):
  return {"id": "c", "type": "function",
          "function": {"name": name, "arguments": json.dumps(arguments)}}


def turn(*calls, content=""):
  return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def graders(**weights):
  cfg = config.default_config().reward.behaviour
  cfg.scale = 1.0
  for name in cfg.graders.keys():
    cfg.graders[name].weight = weights.get(name, 0.0)
  return cfg


def score(name, messages, **options):
  cfg = graders(**{name: 1.0})
  cfg.graders[name].update(options)
  return behaviour.grade(cfg, messages)


CLEAN = "def area(r):\n  # pi r^2, in square metres\n  return 3.14159 * r * r\n"
THOUGHTS = ("def area(r):\n  # Let me think: the test wants square metres, so I think\n"
            "  # we need to multiply by r twice.\n  return 3.14159 * r * r\n")


def test_cot_comments_flags_reasoning_and_long_blocks_only():
  scores, _ = score("cot_comments", [turn(call("write_file", path="a.py", content=CLEAN))])
  assert scores == {"cot_comments": 1.0}
  scores, reasons = score("cot_comments",
                          [turn(call("edit_file", path="a.py", old_string="x",
                                     new_string=THOUGHTS))])
  assert scores["cot_comments"] == pytest.approx(1 / 3)  # two reasoning lines
  assert "let me think" in reasons["cot_comments"].lower()
  block = "\n".join(f"# step {i} of the plan" for i in range(7)) + "\nx = 1\n"
  heredoc = f"cat > a.py <<'EOF'\n{block}EOF"
  scores, reasons = score("cot_comments", [turn(call("run_shell", command=heredoc))])
  assert scores["cot_comments"] == 0.5 and "7-line comment block" in reasons["cot_comments"]
  scores, _ = score("cot_comments", [turn(call("run_shell", command=heredoc))],
                    max_comment_lines=7)
  assert scores["cot_comments"] == 1.0
  pragmas = "# type: ignore\n# noqa\n# pylint: disable=x\n# fmt: off\n" * 3 + "y = 2\n"
  scores, _ = score("cot_comments", [turn(call("write_file", path="b.py", content=pragmas))])
  assert scores["cot_comments"] == 1.0


def test_shell_collapse_counts_shell_calls_that_redo_dedicated_tools():
  messages = [turn(call("run_shell", command="cat src/app.py"),
                   call("run_shell", command="python -m pytest -q"),
                   call("run_shell", command="sed -i 's/a/b/' src/app.py"),
                   call("read_file", path="src/app.py"))]
  scores, reasons = score("shell_collapse", messages)
  assert scores["shell_collapse"] == pytest.approx(0.5)
  assert "1 x edit_file" in reasons["shell_collapse"]
  # A harness with only a shell (no dedicated tools): nothing to object to.
  scores, _ = score("shell_collapse", messages, dedicated_tools=())
  assert scores["shell_collapse"] == 1.0
  scores, _ = score("shell_collapse", [turn(content="no tools at all")])
  assert scores["shell_collapse"] == 1.0


def test_final_message_quality():
  edit = turn(call("edit_file", path="pkg/metrics.py", old_string="a * b",
                   new_string="a - b"))
  good = "Fixed combine_volume in pkg/metrics.py: it multiplied instead of subtracting."
  scores, _ = score("final_message", [edit, turn(call("finish", summary=good))])
  assert scores["final_message"] == 1.0
  scores, reasons = score("final_message", [edit, turn(call("finish", summary="done"))])
  assert scores["final_message"] == pytest.approx(1 - 2 / 5)  # too short, names no file
  assert "names none of the files" in reasons["final_message"]
  rambling = "Hmm, let me see. " + good + "\n```\n" + "x = 1\n" * 30 + "```"
  scores, reasons = score("final_message", [edit, {"role": "assistant", "content": rambling}])
  assert scores["final_message"] == pytest.approx(1 - 2 / 5)
  assert "working-out" in reasons["final_message"] and "30 lines" in reasons["final_message"]


def test_behaviour_term_is_the_weighted_shortfall_and_needs_scores():
  cfg = graders(cot_comments=2.0, final_message=1.0)
  cfg.scale = 0.1
  stats = TrajectoryStats(behaviour={"cot_comments": 0.5, "final_message": 0.25})
  assert rewards.behaviour_term(stats, cfg) == pytest.approx(-0.1 * (2 * 0.5 + 0.75))
  with pytest.raises(ValueError, match="no score from grader 'cot_comments'"):
    rewards.behaviour_term(TrajectoryStats(), cfg)
  cfg.scale = 0.0
  assert rewards.behaviour_term(TrajectoryStats(), cfg) == 0.0


def _trajectory(final_text):
  tokens = np.arange(6, dtype=np.int32)
  mask = np.int32([0, 0, 0, 1, 1, 1])
  segment = Segment(tokens, mask, np.where(mask, -0.5, 0).astype(np.float32),
                    np.where(mask, 1, -1).astype(np.int32), np.zeros((6, 1, 2), np.int32),
                    TrajectoryStats(final_message_tokens=3, turns=1))
  stats = TrajectoryStats(tests_passed=1, tests_total=1, final_message_tokens=3, turns=1)
  return Trajectory("t", [segment], stats, "answer",
                    [{"role": "assistant", "content": final_text}], {"t::a": True}, 1.0)


def test_make_group_grades_chains_when_the_term_is_on():
  rl_cfg = config.default_config()
  rl_cfg.group_size = 2
  rl_cfg.reward.behaviour.update(scale=0.2)
  for name in ("cot_comments", "shell_collapse", "model"):
    rl_cfg.reward.behaviour.graders[name].weight = 0.0
  good = "The parser now accepts empty input; the failing test passes again."
  group, _ = rollouts.make_group(rl_cfg, "t", [_trajectory(good), _trajectory("ok")])
  # "ok": too short (1 of 4 checks) -> -0.2 * 0.25 against the good one.
  assert group.rewards_G[0] - group.rewards_G[1] == pytest.approx(0.2 * 0.25, abs=1e-6)
  rl_cfg.reward.behaviour.scale = 0.0
  group, _ = rollouts.make_group(rl_cfg, "t", [_trajectory(good), _trajectory("ok")])
  assert group.rewards_G[0] == pytest.approx(group.rewards_G[1])


def test_config_names_unknown_graders_and_a_judge_without_endpoint():
  cfg = config.default_config()
  cfg.reward.behaviour.graders.unknown_grader = dict(weight=1.0)
  with pytest.raises(configlib.ConfigError, match="not a known key"):
    config.validate(cfg)
  cfg = config.default_config()
  cfg.reward.behaviour.scale = 1.0
  cfg.reward.behaviour.graders.model.weight = 0.5
  with pytest.raises(configlib.ConfigError, match="graders.model.base_url"):
    config.validate(cfg)


class _Judge(http.server.BaseHTTPRequestHandler):
  answer = "7\nClear summary, tidy edits."
  seen: list = []

  def do_POST(self):  # pylint: disable=invalid-name
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    _Judge.seen.append((self.path, self.headers.get("Authorization"), body))
    payload = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": _Judge.answer}}]}
    data = json.dumps(payload).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    pass


@pytest.fixture
def judge():
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  _Judge.seen.clear()
  yield f"http://127.0.0.1:{server.server_address[1]}/v1"
  server.shutdown()
  server.server_close()


def test_model_grader_asks_the_endpoint_with_the_key_from_the_named_env_var(judge,
                                                                           monkeypatch):
  pytest.importorskip("openai")
  monkeypatch.setenv("C2JAX_JUDGE_KEY", "sk-test-123")
  messages = [turn(call("read_file", path="a.py"), content="Looking."),
              {"role": "assistant", "content": "Fixed a.py."}]
  options = dict(base_url=judge, model="judge-1", api_key_env="C2JAX_JUDGE_KEY")
  scores, reasons = score("model", messages, **options)
  assert scores == {"model": pytest.approx(0.7)} and "tidy edits" in reasons["model"]
  path, auth, body = _Judge.seen[-1]
  assert path == "/v1/chat/completions" and auth == "Bearer sk-test-123"
  assert body["model"] == "judge-1" and body["messages"][0]["content"].startswith(
      "You review how a coding agent")
  assert "[tool call read_file" in body["messages"][1]["content"]
  assert "Fixed a.py." in body["messages"][1]["content"]
  monkeypatch.setattr(_Judge, "answer", "I cannot judge this.")
  with pytest.raises(behaviour.GraderError, match="no score from 0 to 10"):
    score("model", messages, **options)
  monkeypatch.delenv("C2JAX_JUDGE_KEY")
  with pytest.raises(behaviour.GraderError, match="'C2JAX_JUDGE_KEY'.*is not set"):
    score("model", messages, **options)


def test_model_grader_reports_an_unreachable_endpoint():
  pytest.importorskip("openai")
  # An infrastructure failure: the actor drops the group and returns the prompt.
  assert issubclass(behaviour.GraderError, RolloutError)
  with pytest.raises(behaviour.GraderError, match="failed"):
    score("model", [{"role": "assistant", "content": "Done."}],
          base_url="http://127.0.0.1:9/v1", model="judge", api_key_env="", timeout_s=2.0)
