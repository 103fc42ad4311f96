"""c2jax serve through the official openai client: greedy chat and completions equal the
engine's own results, streaming equals non-streaming, concurrency, errors, capture."""

import concurrent.futures
import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from c2jax.serve import read_capture
from c2jax.serve.output import Output
from tests.serve.conftest import MAX_LENGTH, MAX_TOKENS, MODEL, USERS, VOCAB, messages

VOCAB_OUT = VOCAB + 5

openai = pytest.importorskip("openai")


def chat(client, i, **kwargs):
  kwargs = {"temperature": 0, "max_tokens": MAX_TOKENS, **kwargs}
  return client.chat.completions.create(model=MODEL, messages=messages(USERS[i]), **kwargs)


def expected_content(served, generation):
  output = Output(served.tokenizer.decode, stop_ids=generation_stops(served),
                  stop_strings=(), tools=False, call_id_prefix="")
  return output.final(generation.tokens.tolist(), generation.finish_reason)[0].content


def generation_stops(served):
  return (served.tokenizer.token_id("<|end|>"), served.tokenizer.eos_id)


def captured(served, request_id):
  rows = [r for r in read_capture(served.capture) if r["id"] == request_id]
  assert len(rows) == 1, f"{len(rows)} capture lines for {request_id}"
  return rows[0]


def test_models_list(client):
  [model] = client.models.list().data
  assert model.id == MODEL and model.owned_by == "c2jax"
  assert model.model_extra["max_model_len"] == MAX_LENGTH


def test_greedy_chat_matches_engine_and_capture(served, client):
  reference, teacher = served.reference[0], served.teacher[0]
  response = chat(client, 0, logprobs=True)
  choice = response.choices[0]
  assert choice.message.content == expected_content(served, reference)
  logprobs = [entry.logprob for entry in choice.logprobs.content]
  np.testing.assert_allclose(logprobs, reference.logprobs, atol=1e-5)
  # The sampler's log-probs are the teacher-forced ones of the same tokens.
  np.testing.assert_allclose(logprobs, teacher[-len(reference.tokens):], atol=1e-4)
  assert [e.token for e in choice.logprobs.content] == [
      served.tokenizer.decode([t]) for t in reference.tokens]
  # The bytes of the tokens rebuild the text, even where a token splits a character.
  joined = b"".join(bytes(e.bytes) for e in choice.logprobs.content)
  assert joined.decode("utf-8", "replace") == served.tokenizer.decode(reference.tokens)
  assert response.usage.prompt_tokens == len(served.prompts[0])
  assert response.usage.completion_tokens == len(reference.tokens)
  assert response.system_fingerprint == "c2jax-v7"
  row = captured(served, response.id)
  np.testing.assert_array_equal(row["prompt_ids"], served.prompts[0])
  np.testing.assert_array_equal(row["completion_ids"], reference.tokens)
  np.testing.assert_array_equal(row["logprobs"], np.float32(logprobs))
  np.testing.assert_array_equal(row["versions"], np.full(len(reference.tokens), 7))
  np.testing.assert_array_equal(row["expert_indices"], reference.expert_indices)
  assert row["finish_reason"] == reference.finish_reason
  assert row["created"] <= row["first_token"] <= row["finished"]


def test_streaming_equals_non_streaming(served, client):
  plain = chat(client, 1)
  chunks = list(chat(client, 1, stream=True, stream_options={"include_usage": True}))
  deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
  assert "".join(deltas) == plain.choices[0].message.content
  assert len([d for d in deltas if d]) > 1  # it really streamed
  assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
  assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
  text = client.completions.create(model=MODEL, prompt="def main", temperature=0,
                                   max_tokens=MAX_TOKENS)
  streamed = client.completions.create(model=MODEL, prompt="def main", temperature=0,
                                       max_tokens=MAX_TOKENS, stream=True)
  assert "".join(c.choices[0].text for c in streamed) == text.choices[0].text


def test_completions_token_prompt_and_logprobs(served, client):
  prompt = served.prompts[2].tolist()
  response = client.completions.create(model=MODEL, prompt=prompt, temperature=0,
                                       max_tokens=MAX_TOKENS, logprobs=0)
  reference = served.reference[2]
  # Completions stop only at <|eos|>, so they run past an <|end|> the chat would stop at.
  count = len(response.choices[0].logprobs.token_logprobs)
  assert count >= len(reference.tokens)
  np.testing.assert_allclose(response.choices[0].logprobs.token_logprobs[:len(reference.tokens)],
                             reference.logprobs, atol=1e-5)
  row = captured(served, response.id)
  np.testing.assert_array_equal(row["prompt_ids"], prompt)
  assert response.choices[0].text == served.tokenizer.decode(row["completion_ids"])


def test_eight_concurrent_requests_equal_sequential_greedy(served, client):
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    responses = list(pool.map(lambda i: chat(client, i, logprobs=True), range(8)))
  for response, reference in zip(responses, served.reference):
    assert response.choices[0].message.content == expected_content(served, reference)
    np.testing.assert_allclose([e.logprob for e in response.choices[0].logprobs.content],
                               reference.logprobs, atol=1e-5)
    np.testing.assert_array_equal(captured(served, response.id)["completion_ids"],
                                  reference.tokens)


def test_seeded_sampling_is_reproducible(client):
  first, second = (chat(client, 3, temperature=1.0, seed=11, logprobs=True)
                   for _ in range(2))
  assert first.choices[0].message.content == second.choices[0].message.content
  other = chat(client, 3, temperature=1.0, seed=12)
  assert other.choices[0].message.content != first.choices[0].message.content
  # Any integer is a seed (taken modulo 2**32); a negative one must not upset the engine.
  wrapped = chat(client, 3, temperature=1.0, seed=11 - 2**32)
  assert wrapped.choices[0].message.content == first.choices[0].message.content


def post(served, path, body: bytes):
  request = urllib.request.Request(served.running.base_url + path, data=body,
                                   headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=30) as reply:
      return reply.status, json.loads(reply.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"model": MODEL}).encode(), "messages"),
    (json.dumps({"model": MODEL, "messages": []}).encode(), "messages"),
    (json.dumps({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}).encode(),
     "messages"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": 3}]}).encode(),
     "messages.0.content"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                 "temperature": "hot"}).encode(), "temperature"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                 "n": 0}).encode(), "n"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                 "n": 2, "stream": True}).encode(), "stream"),
    (json.dumps({"model": MODEL, "messages": [{"role": "tool", "content": "x",
                                                "tool_call_id": "nope"}]}).encode(),
     "messages"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(served, client, body,
                                                                      param):
  status, reply = post(served, "/chat/completions", body)
  assert status == 400
  assert set(reply["error"]) == {"message", "type", "param", "code"}
  assert reply["error"]["type"] == "invalid_request_error"
  assert reply["error"]["param"] == param
  assert chat(client, 0).choices[0].message.content == expected_content(
      served, served.reference[0])


def test_unsupported_completion_options_are_refused(client):
  for kwargs, param in [({"logprobs": 21}, "logprobs"), ({"echo": True, "stream": True}, "echo"),
                        ({"max_tokens": 0}, "max_tokens"), ({"logprobs": 2, "stream": True},
                                                            "logprobs"),
                        ({"prompt": ["a", "b"], "stream": True}, "stream"),
                        ({"prompt": ["a", "b"], "n": 65}, "n"),
                        ({"prompt": [VOCAB_OUT]}, "prompt"),
                        ({"prompt": [[1], [VOCAB_OUT]]}, "prompt.1")]:
    with pytest.raises(openai.BadRequestError) as raised:
      client.completions.create(**{"model": MODEL, "prompt": "x", **kwargs})
    assert raised.value.body["param"] == param


def test_unknown_model_and_route(served, client):
  with pytest.raises(openai.NotFoundError, match="is not served here"):
    client.chat.completions.create(model="gpt-9", messages=messages("hi"))
  status, reply = post(served, "/embeddings", b"{}")
  assert status == 404 and "error" in reply


def test_too_long_prompt_is_a_400_naming_the_limit(served, client):
  with pytest.raises(openai.BadRequestError) as raised:
    client.chat.completions.create(model=MODEL, messages=messages("word " * 400))
  error = raised.value.body
  assert error["code"] == "context_length_exceeded"
  assert f"maximum context length is {MAX_LENGTH} tokens" in error["message"]
  prompt_length = int(error["message"].split("the prompt has ")[1].split()[0])
  assert prompt_length > MAX_LENGTH
  with pytest.raises(openai.BadRequestError, match="maximum context length"):
    client.completions.create(model=MODEL, prompt=[5] * MAX_LENGTH)
  assert chat(client, 0).choices[0].finish_reason == "length"


def test_stop_string_cuts_the_content(served, client):
  full = expected_content(served, served.reference[4])
  stop = full[3:5]
  cut = full[:full.index(stop)]
  response = chat(client, 4, stop=[stop])
  assert response.choices[0].message.content == cut
  assert response.choices[0].finish_reason == "stop"
  streamed = chat(client, 4, stop=stop, stream=True)
  assert "".join(c.choices[0].delta.content or "" for c in streamed) == cut
  # The capture keeps every sampled token, the stop string's included.
  tokens = captured(served, response.id)["completion_ids"]
  assert stop in served.tokenizer.decode(tokens)
  np.testing.assert_array_equal(tokens, served.reference[4].tokens[:len(tokens)])


def test_streamed_requests_are_captured(served, client):
  chunks = list(chat(client, 5, stream=True, logprobs=True))
  logprobs = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs
              for e in c.choices[0].logprobs.content]
  row = captured(served, chunks[0].id)
  np.testing.assert_array_equal(row["completion_ids"], served.reference[5].tokens)
  np.testing.assert_array_equal(row["logprobs"], np.float32(logprobs))


def test_developer_role_and_text_parts_render_like_system_and_plain_text(served, client):
  parts = [{"type": "text", "text": USERS[6][:9]}, {"type": "text", "text": USERS[6][9:]}]
  response = client.chat.completions.create(
      model=MODEL, temperature=0, max_tokens=MAX_TOKENS, logprobs=True,
      messages=[{"role": "developer", "content": "You are terse."},
                {"role": "user", "content": parts}])
  np.testing.assert_array_equal(captured(served, response.id)["prompt_ids"], served.prompts[6])
  assert response.choices[0].message.content == expected_content(served, served.reference[6])


def test_echo_scores_the_prompt(served, client):
  prompt, reference = served.prompts[7], served.reference[7]
  scored = client.completions.create(model=MODEL, prompt=prompt.tolist(), echo=True,
                                     max_tokens=0, logprobs=0)
  logprobs = scored.choices[0].logprobs
  assert logprobs.token_logprobs[0] is None and len(logprobs.token_logprobs) == len(prompt)
  teacher = served.teacher[7][:len(prompt) - 1]  # log p(prompt[t] | prompt[:t])
  np.testing.assert_allclose(logprobs.token_logprobs[1:], teacher, atol=1e-4)
  assert scored.choices[0].text == served.tokenizer.decode(prompt)
  assert scored.usage.completion_tokens == 0
  both = client.completions.create(model=MODEL, prompt=prompt.tolist(), echo=True,
                                   max_tokens=len(reference.tokens), logprobs=0,
                                   temperature=0)
  token_logprobs = both.choices[0].logprobs.token_logprobs
  np.testing.assert_allclose(token_logprobs[1:len(prompt)], teacher, atol=1e-4)
  np.testing.assert_allclose(token_logprobs[len(prompt):], reference.logprobs, atol=1e-5)
  assert both.choices[0].text.startswith(served.tokenizer.decode(prompt))
  text = client.completions.create(model=MODEL, prompt="def main", echo=True, max_tokens=0)
  assert text.choices[0].text == "def main"  # the server's <|bos|> is not echoed


def test_top_logprobs_list_the_alternatives(served, client):
  reference = served.reference[1]
  response = chat(client, 1, logprobs=True, top_logprobs=3)
  entries = response.choices[0].logprobs.content
  assert len(entries) == len(reference.tokens)
  for entry, token, logprob in zip(entries, reference.tokens, reference.logprobs):
    values = [alt.logprob for alt in entry.top_logprobs]
    assert len(values) == 3 and values == sorted(values, reverse=True)
    # Greedy: the sampled token is the most likely one, with the same log-prob.
    assert entry.top_logprobs[0].token == served.tokenizer.decode([int(token)])
    assert values[0] == pytest.approx(float(logprob), abs=1e-4)
  with pytest.raises(openai.BadRequestError, match="stream"):
    chat(client, 1, logprobs=True, top_logprobs=2, stream=True).close()


@pytest.mark.parametrize("capture", [False, True])
def test_engine_computes_logprobs_when_asked_or_captured(capture, tmp_path):
  """The engine's requests ask for log-probs when the client does (chat `logprobs: true`,
  legacy `logprobs: N`, N = 0 included) or the capture records them; otherwise not, and
  the engine skips that work."""
  from c2jax.serve import Service, schema
  from tests.serve.conftest import ScriptedEngine
  service = Service(ScriptedEngine([1, 2]), None, MODEL, vocab_size=VOCAB,
                    capture_path=str(tmp_path / "capture.jsonl") if capture else None)
  try:
    chat = {"model": MODEL, "messages": messages("hi")}
    cases = [(schema.ChatRequest(**chat), False),
             (schema.ChatRequest(**chat, logprobs=True), True),
             (schema.CompletionRequest(model=MODEL, prompt="hi"), False),
             (schema.CompletionRequest(model=MODEL, prompt="hi", logprobs=0), True),
             (schema.CompletionRequest(model=MODEL, prompt="hi", logprobs=3), True)]
    for request, asked in cases:
      sampling = service.sampling(request, 4, 3, ())
      assert sampling.logprobs is (asked or capture), request
  finally:
    service.close()
