"""The openai policy against a tiny fake OpenAI-compatible server on 127.0.0.1.

The fake "model" solves procedural difficulty-0 tasks (the prompt states the fix): turn
1 edits the constant, turn 2 calls finish; with `tools` in the request it answers with
native tool_calls, without them in the <tool_call> text protocol. It can fail the first N
requests with HTTP 503 to exercise the infra-error path.
"""

import http.server
import json
import re
import threading

import pytest

from c2jax.agent import config as agent_config
from c2jax.toolcalls import protocol
from c2jax.eval import openai_policy, policies, runner, suites

PROMPT_TOKENS_PER_CHAR = 0.25
COMPLETION_TOKENS = 7


class _Handler(http.server.BaseHTTPRequestHandler):
  def log_message(self, *args):
    pass

  def _send(self, status, body):
    data = json.dumps(body).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def do_POST(self):
    server = self.server
    request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    with server.lock:
      server.requests += 1
      failing = server.requests <= server.fail_first
    if self.headers.get("Authorization") != "Bearer secret":
      return self._send(401, {"error": {"message": "bad key", "type": "auth"}})
    if failing:
      return self._send(503, {"error": {"message": "overloaded", "type": "server_error"}})
    if request["model"] != "fake-coder":
      return self._send(404, {"error": {"message": "no such model", "type": "not_found"}})
    messages = request["messages"]
    path, name, bad, good = re.search(r"In (\S+), ([A-Z_]+) is (\d+) but it should be "
                                      r"(\d+)\.", messages[1]["content"]).groups()
    if any(m["role"] == "assistant" for m in messages):
      call = ("finish", {"message": f"Set {name} to {good}."})
    else:
      call = ("edit_file", {"path": path, "old_string": f"{name} = {bad}\n",
                            "new_string": f"{name} = {good}\n"})
    message = {"role": "assistant", "content": None}
    if request.get("tools"):
      message["tool_calls"] = [{"id": f"call_{server.requests}", "type": "function",
                                "function": {"name": call[0],
                                             "arguments": json.dumps(call[1])}}]
    else:
      message["content"] = protocol.render_turn("", [call])
    prompt_tokens = int(len(json.dumps(messages)) * PROMPT_TOKENS_PER_CHAR)
    self._send(200, {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "fake-coder",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": COMPLETION_TOKENS,
                  "total_tokens": prompt_tokens + COMPLETION_TOKENS}})


@pytest.fixture
def server():
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  httpd.lock, httpd.requests, httpd.fail_first = threading.Lock(), 0, 0
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield httpd
  httpd.shutdown()
  httpd.server_close()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
  args = suites.get_suite("procgen").defaults()
  args.count, args.difficulties = 3, (0,)
  return suites.build_tasks(suites.get_suite("procgen"), args,
                            str(tmp_path_factory.mktemp("tasks")))


def _policy(server, monkeypatch, tool_calls="native", **overrides):
  monkeypatch.setenv("FAKE_KEY", "secret")
  cfg = policies.default_config()
  cfg.kind, cfg.model, cfg.api_key_env = "openai", "fake-coder", "FAKE_KEY"
  cfg.base_url = f"http://127.0.0.1:{server.server_port}/v1"
  cfg.tool_calls, cfg.timeout_s = tool_calls, 20.0
  cfg.price_prompt_per_mtok, cfg.price_completion_per_mtok = 3.0, 15.0
  for key, value in overrides.items():
    cfg[key] = value
  agent = agent_config.default_config()
  agent.tools = ("read_file", "edit_file", "finish")
  return openai_policy.OpenAIPolicy(cfg, agent)


@pytest.mark.parametrize("tool_calls", ["native", "text"])
def test_endpoint_policy_solves_and_counts_tokens_and_cost(server, monkeypatch, tmp_path,
                                                           tasks, tool_calls):
  policy = _policy(server, monkeypatch, tool_calls)
  summary = runner.evaluate_tasks(policy, tasks, tmp_path, samples=2, ks=(1, 2),
                                  progress=False)
  overall = summary["overall"]
  assert overall["accuracy"] == 1.0 and overall["infra_errors"] == 0
  assert overall["turns"]["mean"] == 2 and overall["tool_calls"]["mean"] == 2
  assert overall["completion_tokens"]["median"] == 2 * COMPLETION_TOKENS
  records = [json.loads(l) for l in (tmp_path / "results.jsonl").read_text().splitlines()]
  for r in records:
    assert r["cost"] == pytest.approx((r["prompt_tokens"] * 3.0 + r["completion_tokens"]
                                       * 15.0) / 1e6)
    assert r["prompt_tokens"] > 0 and r["final_answer"].startswith("Set ")
  assert overall["total_cost"] == pytest.approx(sum(r["cost"] for r in records))
  assert server.requests == 2 * len(records)


def test_endpoint_5xx_is_retried_then_reported_as_infra_error(server, monkeypatch, tmp_path,
                                                              tasks):
  server.fail_first = 2  # two episodes' first requests fail; their retries succeed
  policy = _policy(server, monkeypatch, concurrency=1)
  overall = runner.evaluate_tasks(policy, tasks, tmp_path / "a", retries=1,
                                  retry_backoff_s=0.0, progress=False)["overall"]
  assert overall["accuracy"] == 1.0 and overall["infra_errors"] == 0
  server.fail_first = 10**6  # the endpoint is down
  overall = runner.evaluate_tasks(policy, tasks, tmp_path / "b", retries=1,
                                  retry_backoff_s=0.0, progress=False)["overall"]
  assert overall["infra_errors"] == len(tasks) and overall["accuracy"] is None


def test_wrong_model_or_key_stops_with_the_config_key(server, monkeypatch, tmp_path, tasks):
  policy = _policy(server, monkeypatch, model="other")
  with pytest.raises(openai_policy.EndpointConfigError, match="config.policy.model"):
    runner.evaluate_tasks(policy, tasks, tmp_path / "a", progress=False)
  monkeypatch.delenv("FAKE_KEY")
  cfg = policies.default_config()
  cfg.base_url, cfg.model, cfg.api_key_env = "http://127.0.0.1:1/v1", "m", "FAKE_KEY"
  with pytest.raises(openai_policy.EndpointConfigError, match="api_key_env"):
    openai_policy.OpenAIPolicy(cfg, agent_config.default_config())
