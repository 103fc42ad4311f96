"""--api_key: the official openai client with the right key is served; a wrong or missing
key gets a 401 in OpenAI's error shape; /health stays open; an exposed address without a
key is warned about."""

import logging

import httpx
import pytest

from c2jax.data import tokenizer as tokenizer_lib
from c2jax.serve import Running, Service, auth
from tests.serve.conftest import TEXTS, VOCAB, ScriptedEngine, messages

openai = pytest.importorskip("openai")

KEY = "sk-c2jax-test-0123456789"


@pytest.fixture(scope="module")
def tokenizer():
  return tokenizer_lib.train_bpe(TEXTS, VOCAB - 8)


@pytest.fixture(scope="module")
def guarded(tokenizer):
  script = tokenizer.encode("Hello there, how are you?").tolist()
  service = Service(ScriptedEngine(script), tokenizer, "guarded", vocab_size=VOCAB,
                    api_key=KEY)
  with Running(service) as running:
    yield running


def test_the_right_key_is_served(guarded, tokenizer):
  client = openai.OpenAI(base_url=guarded.base_url, api_key=KEY, max_retries=0)
  reply = client.chat.completions.create(model="guarded", messages=messages("hi"),
                                         max_tokens=3)
  script = tokenizer.encode("Hello there, how are you?")
  assert reply.choices[0].message.content == tokenizer.decode(script[:3])
  assert [m.id for m in client.models.list().data] == ["guarded"]


@pytest.mark.parametrize("key", ["wrong", KEY[:-1], KEY + "x", "Bearer " + KEY])
def test_a_wrong_key_raises_authentication_error(guarded, key):
  client = openai.OpenAI(base_url=guarded.base_url, api_key=key, max_retries=0)
  with pytest.raises(openai.AuthenticationError) as raised:
    client.chat.completions.create(model="guarded", messages=messages("hi"), max_tokens=3)
  assert raised.value.status_code == 401
  assert raised.value.body["code"] == "invalid_api_key"
  with pytest.raises(openai.AuthenticationError):
    client.models.list()


@pytest.mark.parametrize("headers", [{}, {"Authorization": KEY},
                                     {"Authorization": "Basic " + KEY}])
def test_requests_without_a_bearer_key_get_401_and_health_stays_open(guarded, headers):
  root = f"http://{guarded.host}:{guarded.port}"
  reply = httpx.post(root + "/v1/completions", headers=headers,
                     json={"model": "guarded", "prompt": "x"})
  assert reply.status_code == 401
  assert reply.headers["www-authenticate"] == "Bearer"
  assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
  assert reply.json()["error"]["type"] == "invalid_request_error"
  for path in ("/v1/models", "/v1/unknown", "/tokenize"):
    assert httpx.get(root + path, headers=headers).status_code == 401
  health = httpx.get(root + "/health")
  assert health.status_code == 200 and health.json()["status"] == "ok"


def test_the_key_comes_from_the_flag_or_the_environment():
  assert auth.resolve_key("flag", {auth.ENV_VAR: "env"}) == "flag"
  assert auth.resolve_key(None, {auth.ENV_VAR: "env"}) == "env"
  assert auth.resolve_key(None, {}) is None
  assert auth.resolve_key("", {auth.ENV_VAR: ""}) is None


@pytest.mark.parametrize("host, key, warns", [
    ("0.0.0.0", None, True), ("::", None, True), ("10.1.2.3", None, True),
    ("my-host.example", None, True), ("0.0.0.0", KEY, False), ("127.0.0.1", None, False),
    ("::1", None, False), ("localhost", None, False)])
def test_an_exposed_address_without_a_key_is_warned_about(caplog, host, key, warns):
  with caplog.at_level(logging.WARNING):
    assert auth.warn_if_exposed(host, key) == warns
  assert ("without an API key" in caplog.text) == warns
