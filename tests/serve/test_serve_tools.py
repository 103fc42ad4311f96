"""Tool calls and disconnects through a scripted engine: its output is exact, so the
server's parsing, rendering of the next turn and slot freeing can be checked exactly."""

import json
import socket
import time

import numpy as np
import pytest

from c2jax.agent import prompt as agent_prompt
from c2jax.data import chat
from c2jax.serve import Running, Service, read_capture
from c2jax.serve.output import Output
from tests.serve.conftest import VOCAB, ScriptedEngine

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]
SYSTEM = "You are a coding agent."
USER = "What is in src/app.py?"
ARGS = {"path": "src/app.py"}


def conversation(assistant=None, tool_result=None):
  system = agent_prompt.system_message(SYSTEM, TOOLS)
  messages = [{"role": "system", "content": system}, {"role": "user", "content": USER}]
  if assistant is not None:
    messages.append(assistant)
  if tool_result is not None:
    messages.append(tool_result)
  return messages


@pytest.fixture(scope="module")
def scripted(served, tmp_path_factory):
  """A server whose engine emits a tool-call turn, laid out by the chat template."""
  tokenizer = served.tokenizer
  turn = {"role": "assistant", "content": "Let me look.",
          "tool_calls": [{"id": "x", "type": "function",
                          "function": {"name": "read_file", "arguments": json.dumps(ARGS)}}]}
  prompt = chat.render(tokenizer, conversation(), add_generation_prompt=True).ids
  full = chat.render(tokenizer, conversation(turn)).ids
  script = full[len(prompt):-1]  # through the assistant's closing <|end|>
  assert script[-1] == tokenizer.token_id("<|end|>")
  engine = ScriptedEngine(script.tolist(), num_slots=2, delay=0.002)
  capture = tmp_path_factory.mktemp("tools") / "capture.jsonl"
  with Running(Service(engine, tokenizer, "scripted", vocab_size=VOCAB,
                       capture_path=str(capture))) as running:
    client = openai.OpenAI(base_url=running.base_url, api_key="none", max_retries=0)
    yield engine, client, prompt, script, capture, running


def ask(client, messages, **kwargs):
  return client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS,
                                        temperature=0, **kwargs)


def test_tool_call_round_trip(scripted, served):
  engine, client, prompt, script, capture, _ = scripted
  request = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
  response = ask(client, request)
  choice = response.choices[0]
  assert choice.finish_reason == "tool_calls"
  assert choice.message.content == "Let me look."
  [call] = choice.message.tool_calls
  assert call.function.name == "read_file"
  assert json.loads(call.function.arguments) == ARGS
  # The tools were listed in the system message the way the agent lists them.
  np.testing.assert_array_equal(engine.prompts[-1], prompt)
  [row] = [r for r in read_capture(capture) if r["id"] == response.id]
  np.testing.assert_array_equal(row["completion_ids"], script)

  # Send the call back with its result: the next prompt continues the exact tokens.
  answer = {"role": "tool", "tool_call_id": call.id, "content": "print('hi')"}
  follow = request + [choice.message.model_dump(exclude_none=True), answer]
  ask(client, follow)
  next_prompt = engine.prompts[-1]
  np.testing.assert_array_equal(next_prompt[:len(prompt) + len(script)],
                                np.concatenate([prompt, script]))
  expected = chat.render(served.tokenizer, conversation(
      choice.message.model_dump(exclude_none=True), answer), add_generation_prompt=True).ids
  np.testing.assert_array_equal(next_prompt, expected)


def test_streamed_tool_call_equals_plain(scripted):
  _, client, *_ = scripted
  request = [{"role": "user", "content": USER}]
  plain = ask(client, request).choices[0]
  chunks = list(ask(client, request, stream=True))
  content = "".join(c.choices[0].delta.content or "" for c in chunks)
  assert content == plain.message.content
  calls = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
  assert [(c.index, c.function.name, c.function.arguments) for c in calls] == [
      (0, c.function.name, c.function.arguments) for c in plain.message.tool_calls]
  assert calls[0].id.startswith("call_")
  assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_without_tools_the_markers_stay_text(scripted):
  _, client, *_ = scripted
  response = client.chat.completions.create(
      model="scripted", messages=[{"role": "user", "content": USER}], temperature=0)
  assert response.choices[0].finish_reason == "stop"
  assert response.choices[0].message.tool_calls is None
  assert "<tool_call>" in response.choices[0].message.content


def test_client_disconnect_mid_stream_frees_the_slot(scripted):
  engine, _, _, _, capture, running = scripted
  before = len(read_capture(capture)) if capture.exists() else 0
  body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": USER}],
                     "stream": True, "max_tokens": 50_000}).encode()
  head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
          f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
  with socket.create_connection((running.host, running.port)) as sock:
    sock.sendall(head + body)
    received = b""
    while received.count(b"data:") < 5:
      received += sock.recv(4096)
    assert engine.free_slots() == 1  # the request holds a slot while it streams
  deadline = time.time() + 10
  while engine.free_slots() != 2 or running.service.loop.live:
    assert time.time() < deadline, "the slot was not freed after the client went away"
    time.sleep(0.02)
  # A cancelled request is no trajectory: nothing is captured for it.
  assert len(read_capture(capture)) == before


@pytest.mark.parametrize("script_text, tools, stops, expected", [
    ("Hello world. STOP and more", False, ("STOP",), ["Hello world. "]),
    ("  Plan: <tool_call>{\"name\": \"a\"}</tool_call>  done  ", True, (), ["Plan:   done"]),
    ("x <tool_call>{broken</tool_call>", True, (), ["x"]),
    ("☃ héllo ünïcode ✓ snow", False, ("✓",), ["☃ héllo ünïcode "]),
])
def test_output_deltas_concatenate_to_the_final_content(served, script_text, tools, stops,
                                                        expected):
  tokenizer = served.tokenizer
  ids = tokenizer.encode(script_text).tolist()
  output = Output(tokenizer.decode, stop_ids=(), stop_strings=stops, tools=tools,
                  call_id_prefix="call")
  streamed = "".join(output.delta(ids[:n]) for n in range(1, len(ids) + 1))
  final, rest = output.final(ids, "stop_string" if stops else "stop_token")
  assert streamed + rest == final.content == expected[0]
  if "broken" in script_text:
    assert final.call_errors and final.tool_calls == []


def test_client_disconnect_while_waiting_for_a_plain_reply_frees_the_slot(scripted):
  engine, _, _, _, _, running = scripted
  body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": USER}],
                     "max_tokens": 50_000}).encode()
  head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
          f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
  with socket.create_connection((running.host, running.port)) as sock:
    sock.sendall(head + body)
    deadline = time.time() + 10
    while engine.free_slots() != 1:
      assert time.time() < deadline, "the request never started"
      time.sleep(0.01)
  deadline = time.time() + 10
  while engine.free_slots() != 2 or running.service.loop.live:
    assert time.time() < deadline, "the slot was not freed after the client went away"
    time.sleep(0.02)


def test_followed_weights_tag_the_tokens_they_sample(served, tmp_path):
  from c2jax.rollout import weights as weights_lib
  from c2jax.serve import follow

  tokenizer = served.tokenizer
  engine = ScriptedEngine(tokenizer.encode("ok").tolist() + [tokenizer.eos_id])
  publisher = weights_lib.WeightPublisher(str(tmp_path / "weights"))
  follower = follow.WeightFollower(engine, str(tmp_path / "weights"), interval_s=0.05)
  assert follower.poll_once() is None  # nothing published yet
  capture = tmp_path / "capture.jsonl"
  with Running(Service(engine, tokenizer, "scripted", vocab_size=VOCAB,
                       capture_path=str(capture))) as running:
    client = openai.OpenAI(base_url=running.base_url, api_key="none", max_retries=0)
    publisher.publish({"w": np.ones(3, np.float32)}, 5, full=True)
    follower.start()
    deadline = time.time() + 10
    while follower.installed != 5:
      assert time.time() < deadline, "the follower did not pick up version 5"
      time.sleep(0.02)
    response = client.completions.create(model="scripted", prompt="hi", max_tokens=3)
    follower.stop()
  assert response.usage.completion_tokens == len(tokenizer.encode("ok")) + 1
  [row] = read_capture(capture)
  np.testing.assert_array_equal(row["versions"], [5] * len(row["completion_ids"]))


def test_history_keeps_the_exact_sampled_tokens(served):
  """A turn whose text re-encodes differently (compact JSON, a character split across
  tokens) comes back in the next prompt as the very tokens that were sampled."""
  tokenizer = served.tokenizer
  ids = lambda text: tokenizer.encode(text).tolist()
  marker = tokenizer.token_id
  script = (ids("Looking ") + ids("☃")[:1] + ids("☃")[1:] + ids(".\n")
            + [marker("<tool_call>")] + ids('{"name":"read_file","arguments":{"path":"a"}}')
            + [marker("</tool_call>"), marker("<|end|>")])
  engine = ScriptedEngine(script)
  with Running(Service(engine, tokenizer, "scripted", vocab_size=VOCAB)) as running:
    client = openai.OpenAI(base_url=running.base_url, api_key="none", max_retries=0)
    request = [{"role": "user", "content": USER}]
    reply = ask(client, request).choices[0].message
    assert json.loads(reply.tool_calls[0].function.arguments) == {"path": "a"}
    prompt = engine.prompts[-1]
    history = request + [reply.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": reply.tool_calls[0].id,
                          "content": "x = 1"}]
    ask(client, history)
    follow = engine.prompts[-1]
  np.testing.assert_array_equal(follow[:len(prompt) + len(script)],
                                np.concatenate([prompt, script]))
  # Re-encoding the returned text would not have given these tokens.
  system = agent_prompt.system_message("", TOOLS)
  plain = chat.render(tokenizer, [{"role": "system", "content": system}] + history,
                      add_generation_prompt=True).ids
  assert not np.array_equal(plain[:len(prompt) + len(script)],
                            np.concatenate([prompt, script]))
