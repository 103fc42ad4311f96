"""/v1/completions as evaluation clients use it (several prompts, echo scoring, legacy
logprobs with top_logprobs and text_offset, n > 1) and /tokenize, /detokenize."""

import json

import httpx
import numpy as np
import pytest

from c2jax.eval.base.perplexity import WindowScorer
from tests.serve.conftest import MAX_LENGTH, MODEL, USERS, messages

openai = pytest.importorskip("openai")

# (context, continuation) pairs, as a log-likelihood request of an eval harness holds them.
PAIRS = [("def main():\n    return", " parse(args)\n"),
         ("Please fix the failing", " test in src/app.py."),
         ('The tool result says {"ok":', ' true}. What now?'),
         ("Question 3: what", " does awk do?")]


@pytest.fixture(scope="module")
def root(served):
  return f"http://{served.running.host}:{served.running.port}"


@pytest.fixture(scope="module")
def own_scores(served):
  """-NLL of every token after the first, scored by c2jax's eval code (not the engine)."""
  scorer = WindowScorer(served.cfg, served.params, window=MAX_LENGTH, batch_size=1)

  def score(ids):
    nll, windows = scorer.token_nll(np.asarray(ids), stride=MAX_LENGTH - 1)
    assert windows == 1
    return -nll
  return score


def test_echo_loglikelihoods_equal_c2jax_scoring_for_several_prompts(served, client,
                                                                      own_scores):
  tokenizer = served.tokenizer
  contexts = [[tokenizer.bos_id] + tokenizer.encode(c).tolist() for c, _ in PAIRS]
  sequences = [c + tokenizer.encode(x).tolist() for c, (_, x) in zip(contexts, PAIRS)]
  # What lm-eval's loglikelihood requests send: token prompts, echo, logprobs 1, no sampling.
  reply = client.completions.create(model=MODEL, prompt=sequences, echo=True, max_tokens=0,
                                    logprobs=1, temperature=0)
  assert [c.index for c in reply.choices] == list(range(len(PAIRS)))
  for choice, context, sequence in zip(reply.choices, contexts, sequences):
    logprobs = choice.logprobs
    assert len(logprobs.token_logprobs) == len(sequence)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    own = own_scores(sequence)
    continuation = logprobs.token_logprobs[len(context):]
    np.testing.assert_allclose(continuation, own[len(context):], atol=1e-4)
    np.testing.assert_allclose(logprobs.token_logprobs[1:], own[1:], atol=1e-4)
    # Each top_logprobs entry holds the most likely token and the prompt's own token.
    for position, (token, top) in enumerate(zip(logprobs.tokens[1:], logprobs.top_logprobs[1:])):
      assert token in top and 1 <= len(top) <= 2
      assert top[token] == pytest.approx(logprobs.token_logprobs[position + 1], abs=1e-5)
      assert max(top.values()) >= top[token] - 1e-6
    assert choice.text == tokenizer.decode(sequence)
  assert reply.usage.prompt_tokens == sum(map(len, sequences))
  assert reply.usage.completion_tokens == 0
  # Text prompts: the server's <|bos|> is not echoed; its first token is null, the rest
  # are scored given <|bos|> and equal the token-prompt scores.
  text = client.completions.create(model=MODEL, prompt=[c + x for c, x in PAIRS[:2]],
                                   echo=True, max_tokens=0, logprobs=0)
  for choice, (context, continuation) in zip(text.choices, PAIRS):
    sequence = [tokenizer.bos_id] + tokenizer.encode(context + continuation).tolist()
    assert choice.logprobs.token_logprobs[0] is None
    assert len(choice.logprobs.token_logprobs) == len(sequence) - 1
    np.testing.assert_allclose(choice.logprobs.token_logprobs[1:], own_scores(sequence)[2:],
                               atol=1e-4)
    assert [list(t) for t in choice.logprobs.top_logprobs[1:]] == [
        [t] for t in choice.logprobs.tokens[1:]]  # logprobs 0: the chosen token only


def test_logprobs_n_lists_alternatives_and_offsets(served, client):
  prompt = served.prompts[2].tolist()
  reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, logprobs=3,
                                    temperature=0, echo=True)
  logprobs = reply.choices[0].logprobs
  assert len(logprobs.tokens) == len(prompt) + 6
  text = reply.choices[0].text
  for token, offset, top, value in zip(logprobs.tokens, logprobs.text_offset,
                                       logprobs.top_logprobs, logprobs.token_logprobs):
    if "\ufffd" not in token:
      assert text[offset:offset + len(token)] == token
    if top is not None:
      # 3 alternatives + the chosen token, keyed by text: tokens of partial characters
      # share the text U+FFFD and collapse into one key.
      assert token in top and len(top) <= 4
      assert len(top) >= 3 or "\ufffd" in "".join(top)
      assert top[token] == pytest.approx(value, abs=1e-4)
  # Greedy: each sampled token is the most likely one.
  for token, top in zip(logprobs.tokens[len(prompt):], logprobs.top_logprobs[len(prompt):]):
    assert max(top, key=top.get) == token
  # A sampled token's logprob equals the engine's own for the same greedy decode.
  plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, logprobs=0,
                                    temperature=0)
  np.testing.assert_allclose(logprobs.token_logprobs[len(prompt):],
                             plain.choices[0].logprobs.token_logprobs, atol=1e-5)


def test_several_prompts_and_n_choices(served, client):
  reply = client.completions.create(model=MODEL, prompt=["def main", "Please fix"], n=3,
                                    max_tokens=5, temperature=1.0, seed=5, logprobs=0)
  assert [c.index for c in reply.choices] == list(range(6))
  texts = [c.text for c in reply.choices]
  assert len(set(texts[:3])) > 1  # choice j samples with seed + j
  again = client.completions.create(model=MODEL, prompt=["def main", "Please fix"], n=3,
                                    max_tokens=5, temperature=1.0, seed=5)
  assert [c.text for c in again.choices] == texts
  assert reply.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in reply.choices)
  greedy = client.completions.create(model=MODEL, prompt="def main", max_tokens=5,
                                     temperature=0, n=2)
  assert greedy.choices[0].text == greedy.choices[1].text
  chat = client.chat.completions.create(model=MODEL, messages=messages(USERS[0]), n=3,
                                        max_tokens=6, temperature=1.0, seed=3, logprobs=True)
  assert [c.index for c in chat.choices] == [0, 1, 2]
  assert len({c.message.content for c in chat.choices}) > 1
  assert chat.usage.completion_tokens == sum(len(c.logprobs.content) for c in chat.choices)


def test_tokenize_and_detokenize(served, root):
  tokenizer = served.tokenizer
  reply = httpx.post(root + "/tokenize", json={"prompt": "def main():", "model": MODEL})
  assert reply.status_code == 200, reply.text
  body = reply.json()
  expected = [tokenizer.bos_id] + tokenizer.encode("def main():").tolist()
  assert body == {"count": len(expected), "max_model_len": MAX_LENGTH, "tokens": expected,
                  "token_strs": None}
  bare = httpx.post(root + "/tokenize", json={"prompt": "def main():",
                                              "add_special_tokens": False,
                                              "return_token_strs": True}).json()
  assert bare["tokens"] == expected[1:]
  assert "".join(bare["token_strs"]) == "def main():"
  chat = httpx.post(root + "/tokenize", json={"messages": messages(USERS[0])}).json()
  assert chat["tokens"] == served.prompts[0].tolist()  # exactly what chat feeds the model
  text = httpx.post(root + "/detokenize", json={"tokens": expected[1:]}).json()
  assert text == {"prompt": "def main():"}
  for path, body, status, param in [
      ("/detokenize", {"tokens": [10**6]}, 400, "tokens"),
      ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
      ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
      ("/tokenize", {"prompt": "\ud800"}, 400, "prompt"),
      ("/tokenize", {"prompt": "x" * 10**6}, 400, "prompt"),
      # Tool descriptions count towards the context, as in /v1/chat/completions.
      ("/tokenize", {"messages": messages(USERS[0]), "tools": [{"type": "function",
        "function": {"name": "f", "description": "x" * 10**6}}]}, 400, "messages")]:
    # json.dumps escapes the lone surrogate as JSON allows.
    reply = httpx.post(root + path, content=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json"})
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == param
