"""c2jax serve under hostile input: named cases and a hypothesis fuzz over request shapes.

Whatever a client sends, the answer is a 4xx in OpenAI's error shape or a 200, never a 5xx
or a hang, and a normal request succeeds afterwards. One server (the session's tiny
model) serves every case.
"""

import json
import math
import socket
import time

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from tests.serve.conftest import BODY_LIMIT, MAX_LENGTH, MODEL, messages

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
TOOL = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def http(served):
  with httpx.Client(base_url=f"http://{served.running.host}:{served.running.port}",
                    timeout=60) as client:
    yield client


def check(reply: httpx.Response) -> dict | None:
  """The reply is a 200 or an OpenAI-style 4xx; returns the error body of a 4xx."""
  assert reply.status_code < 500, reply.text[:2000]
  if reply.status_code == 200:
    if reply.headers["content-type"].startswith("text/event-stream"):
      assert "server_error" not in reply.text, reply.text[:2000]
      assert reply.text.rstrip().endswith("data: [DONE]")
    return None
  error = reply.json()["error"]
  assert set(error) == {"message", "type", "param", "code"}
  assert error["message"]
  return error


def assert_still_serves(http):
  reply = http.post(CHAT, json={"model": MODEL, "messages": messages("hi"), "max_tokens": 3,
                                "temperature": 0})
  assert reply.status_code == 200, reply.text
  assert reply.json()["choices"][0]["message"]["role"] == "assistant"


def chat_body(**fields):
  return {"model": MODEL, "messages": messages("Say hi."), "max_tokens": 2, **fields}


def post_raw(http, path, raw: bytes):
  return http.post(path, content=raw, headers={"Content-Type": "application/json"})


# ---- named hostile cases -----------------------------------------------------------------
def nested(depth: int) -> bytes:
  return b'{"model": "%s", "messages": ' % MODEL.encode() + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("path, raw, status, param, code", [
    (CHAT, nested(100_000), 400, None, "invalid_value"),  # past Python's recursion limit
    # Within the recursion limit, past the depth bound (64: the body, messages, 62 more).
    (CHAT, nested(80), 400, "messages" + ".0" * 63, "invalid_value"),
    (CHAT, b'{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
     % MODEL.encode(), 400, "messages.0.content", "invalid_value"),
    (COMPLETIONS, b'{"model": "%s", "prompt": "\\udfff"}' % MODEL.encode(), 400, "prompt",
     "invalid_value"),
    (CHAT, b'{"model": "%s", "messages": [], "\\ud800": 1}' % MODEL.encode(), 400, None,
     "invalid_value"),
    (CHAT, b'{"model": "\xff\xfe"}', 400, None, None),  # not UTF-8
    (CHAT, b"", 400, None, None),
    (CHAT, json.dumps(chat_body(temperature=math.nan)).encode(), 400, "temperature",
     "invalid_value"),
    (CHAT, json.dumps(chat_body(top_p=math.inf)).encode(), 400, "top_p", "invalid_value"),
    (CHAT, json.dumps(chat_body(max_tokens=-1)).encode(), 400, "max_tokens", "invalid_value"),
    (CHAT, json.dumps(chat_body(n=10**9)).encode(), 400, "n", None),
    (CHAT, json.dumps(chat_body(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": [1, 2]}}}])).encode(),
     400, "tools.0.function.parameters", "invalid_value"),
    (CHAT, json.dumps(chat_body(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"properties": {"a": 5}}}}])).encode(),
     400, "tools.0.function.parameters", "invalid_value"),
    (CHAT, json.dumps(chat_body(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"properties": {"a": True}}}}])).encode(),
     400, "tools.0.function.parameters", "invalid_value"),
    (CHAT, json.dumps(chat_body(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}])).encode(),
     400, "tools.0.function.parameters", "invalid_value"),
    (CHAT, json.dumps(chat_body(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "required": "a"}}}])).encode(),
     400, "tools.0.function.parameters", "invalid_value"),
    (COMPLETIONS, json.dumps({"model": MODEL, "prompt": [[]]}).encode(), 400, "prompt.0",
     None),
    (COMPLETIONS, json.dumps({"model": MODEL, "prompt": [-1]}).encode(), 400, "prompt", None),
    (COMPLETIONS, json.dumps({"model": MODEL, "prompt": "x" * 10**6}).encode(), 400, "prompt",
     "context_length_exceeded"),
    (COMPLETIONS, json.dumps({"model": MODEL, "prompt": [5] * 10**6}).encode(), 400, "prompt",
     "context_length_exceeded"),
    (COMPLETIONS, json.dumps({"model": MODEL, "prompt": ["x", "y" * 10**6]}).encode(), 400,
     "prompt.1", "context_length_exceeded"),
    ("/tokenize", json.dumps({"messages": [{"role": "user", "content": "x" * 10**6}]}).encode(),
     400, "messages", "context_length_exceeded"),
    ("/detokenize", b'{"tokens": [1, -1]}', 400, "tokens", None),
])
def test_hostile_requests_get_named_4xx(served, http, path, raw, status, param, code):
  error = check(post_raw(http, path, raw))
  assert error is not None
  assert (error["param"], error["code"]) == (param, code), error
  assert_still_serves(http)


@pytest.mark.parametrize("fields", [
    {"top_k": 10**30}, {"seed": 10**40}, {"max_tokens": 10**30}, {"stop": ["\U0001F600"]},
    # Sent as JSON escapes, the surrogate pair is one character (U+1F600).
    {"messages": [{"role": "user", "content": "\u202e\u0000\U0001F600\ud83d\ude00 x"}]},
    {"messages": [{"role": "user", "content": None}]},
])
def test_extreme_but_valid_values_are_served(http, fields):
  reply = post_raw(http, CHAT, _dump(chat_body(temperature=0, **fields)))
  assert reply.status_code == 200, reply.text
  assert reply.json()["usage"]["prompt_tokens"] + reply.json()["usage"][
      "completion_tokens"] <= MAX_LENGTH


def _raw_request(served, headers: str) -> socket.socket:
  sock = socket.create_connection((served.running.host, served.running.port), timeout=30)
  sock.sendall(headers.encode())
  return sock


def _response_status(sock: socket.socket) -> tuple[int, bytes]:
  data = b""
  while b"\r\n\r\n" not in data:
    chunk = sock.recv(65536)
    if not chunk:
      break
    data += chunk
  return int(data.split(b" ", 2)[1]), data


def test_bodies_over_the_limit_get_413_before_they_are_read(served):
  with _raw_request(served, f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    f"application/json\r\nContent-Length: {BODY_LIMIT + 1}\r\n\r\n") as sock:
    status, reply = _response_status(sock)  # nothing of the body was sent
  assert status == 413 and b"request_too_large" in reply
  # A declared length is exact: the reply gives it, not "at least".
  assert b"has %d bytes" % (BODY_LIMIT + 1) in reply and b"at least" not in reply
  # Without a Content-Length (chunked), the server stops once the limit is passed.
  with _raw_request(served, f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    "application/json\r\nTransfer-Encoding: chunked\r\n\r\n") as sock:
    piece = b"x" * 2**20
    try:
      for _ in range(BODY_LIMIT // len(piece) + 2):
        sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
    except (BrokenPipeError, ConnectionResetError):
      pass  # the server answered and closed while we were still sending
    status, reply = _response_status(sock)
  assert status == 413


def test_a_50mb_prompt_in_flight_never_stalls_health(served, http):
  content = "word " * 10_000_000
  body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}]})
  body = body.encode()
  del content
  assert 50_000_000 < len(body) < BODY_LIMIT
  with _raw_request(served, f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    f"application/json\r\nContent-Length: {len(body)}\r\n\r\n") as sock:
    waits = []

    def health():
      start = time.perf_counter()
      assert http.get("/health", timeout=5).json()["status"] == "ok"
      waits.append(time.perf_counter() - start)

    half = len(body) // 2
    sock.sendall(body[:half])
    health()  # the upload is half done; other clients are served meanwhile
    assert_still_serves(http)
    sock.sendall(body[half:])
    for _ in range(5):  # while the server reads and checks the whole body
      health()
    status, reply = _response_status(sock)
  assert max(waits) < 1.0, waits
  assert status == 400 and b"context_length_exceeded" in reply
  assert_still_serves(http)


# ---- fuzz --------------------------------------------------------------------------------
# A body is drawn valid, then up to three of its fields are replaced by hostile values (or
# dropped), so the fuzz reaches every stage of a request, generation included, not only
# the first field's type check.
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
_JUNK = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                     max_leaves=8)
_ODD_TEXT = st.sampled_from(["", "\u0000", "\ud800", "a\udfffb", "\U0001F600" * 5,
                             "\u202e\u200b", "<|end|>", "<|bos|>", "<tool_call>", "x" * 5000,
                             "\ufffd\ufeff", "word " * 200])
_TEXT = st.one_of(st.text(max_size=30), _ODD_TEXT)
_HOSTILE = st.one_of(_JUNK, _ODD_TEXT, st.sampled_from(
    [-1, 0, 2**31, 2**63, 10**30, -10**30, math.nan, math.inf, -math.inf, 1e308, [], {},
     [[[[[]]]]]]))
_MESSAGE = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "user", "assistant", "developer", "tool"]),
    "content": st.one_of(_TEXT, st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": _TEXT}), min_size=1, max_size=2))})
_SCHEMA = st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(
    st.text(max_size=6), st.fixed_dictionaries({"type": st.sampled_from(
        ["string", "integer", "array", "object"])}), max_size=3)})
_TOOLS = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": (
    st.fixed_dictionaries({"name": st.text(min_size=1, max_size=8), "parameters": _SCHEMA}))}),
                  min_size=1, max_size=2)
_SHARED = {"temperature": st.floats(0, 2),
           "top_p": st.floats(0.01, 1), "top_k": st.integers(0, 400),
           "max_tokens": st.integers(1, 6), "n": st.integers(1, 3),
           "seed": st.integers(-2**40, 2**40),
           "stop": st.one_of(st.text(min_size=1, max_size=4),
                             st.lists(st.text(min_size=1, max_size=4), max_size=4)),
           "stream": st.booleans()}
_BODIES = {
    CHAT: st.fixed_dictionaries(
        {"model": st.just(MODEL), "messages": st.lists(_MESSAGE, min_size=1, max_size=3)},
        optional={**_SHARED, "tools": _TOOLS, "logprobs": st.booleans(),
                  "tool_choice": st.sampled_from(["auto", "none"]),
                  "top_logprobs": st.integers(0, 2), "max_completion_tokens":
                  st.integers(1, 6)}),
    COMPLETIONS: st.fixed_dictionaries(
        {"model": st.just(MODEL), "prompt": st.one_of(
            _TEXT, st.lists(st.integers(0, 319), min_size=1, max_size=8),
            st.lists(_TEXT, min_size=1, max_size=3),
            st.lists(st.lists(st.integers(0, 319), min_size=1, max_size=4), min_size=1,
                     max_size=3))},
        optional={**_SHARED, "echo": st.booleans(), "logprobs": st.integers(0, 2)}),
}
_BODIES["/tokenize"] = st.one_of(
    st.fixed_dictionaries({"prompt": _TEXT}, optional={
        "model": st.just(MODEL), "add_special_tokens": st.booleans(),
        "return_token_strs": st.booleans()}),
    st.fixed_dictionaries({"messages": st.lists(_MESSAGE, min_size=1, max_size=3)},
                          optional={"tools": _TOOLS, "return_token_strs": st.booleans()}))
_BODIES["/detokenize"] = st.fixed_dictionaries(
    {"tokens": st.lists(st.integers(0, 319), max_size=8)}, optional={"model": st.just(MODEL)})
_FIELDS = sorted({"model", "messages", "prompt", "tokens", "add_special_tokens", "tools",
                  "echo", "logprobs", "top_logprobs", "tool_choice", *_SHARED})


def _dump(body) -> bytes:
  # ensure_ascii: lone surrogates (in the odd texts) travel as JSON escapes.
  return json.dumps(body, ensure_ascii=True, allow_nan=True).encode()


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(endpoint=st.sampled_from(sorted(_BODIES)), data=st.data())
def test_fuzzed_requests_never_get_5xx(http, endpoint, data):
  body = data.draw(_BODIES[endpoint])
  for field in data.draw(st.lists(st.sampled_from(_FIELDS), max_size=3, unique=True)):
    if data.draw(st.integers(0, 5)) == 0:
      body.pop(field, None)
    else:
      body[field] = data.draw(_HOSTILE)
  reply = post_raw(http, endpoint, _dump(body))
  error = check(reply)
  event(f"{endpoint} {reply.status_code} {error and error['param']}")


def test_normal_requests_succeed_after_the_fuzz(http):
  assert_still_serves(http)
  reply = http.post(COMPLETIONS, json={"model": MODEL, "prompt": "def main", "max_tokens": 2})
  assert reply.status_code == 200, reply.text
