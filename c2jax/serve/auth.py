"""API keys for `c2jax serve`: `--api_key KEY` (or C2JAX_API_KEY) makes every route but
/health answer 401 unless the request carries `Authorization: Bearer KEY`, the header the
OpenAI clients send from their `api_key`.

    service = Service(engine, tokenizer, "m", vocab_size=V, api_key="sk-local")
    client = openai.OpenAI(base_url=running.base_url, api_key="sk-local")

Without a key the server answers anyone who can reach it, which is right on 127.0.0.1
(the default) and a warning anywhere else.
"""

from __future__ import annotations

import hmac
import ipaddress
import os

from absl import logging
from starlette import responses

ENV_VAR = "C2JAX_API_KEY"
OPEN_PATHS = frozenset({"/health"})  # load balancers and scripts probe it without a key


def resolve_key(flag_value: str | None, environ=os.environ) -> str | None:
  """--api_key, else $C2JAX_API_KEY; None (no authentication) when neither is set."""
  return flag_value or environ.get(ENV_VAR) or None


def is_loopback(host: str) -> bool:
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host.strip("[]")).is_loopback
  except ValueError:
    return False  # a name: it may resolve to any interface


def warn_if_exposed(host: str, api_key: str | None) -> bool:
  """Logs a warning when `host` is reachable from other machines and no key is set;
  returns whether it warned."""
  if api_key or is_loopback(host):
    return False
  logging.warning("c2jax serve listens on %s without an API key: anyone who can reach this "
                  "address can use the model. Set --api_key (or $%s), or listen on "
                  "127.0.0.1.", host, ENV_VAR)
  return True


class BearerAuth:
  """ASGI middleware: a 401 in OpenAI's error shape for requests without the key."""

  def __init__(self, app, api_key: str):
    if not api_key:
      raise ValueError("BearerAuth needs a non-empty api_key.")
    self.app = app
    self._expected = f"Bearer {api_key}".encode()

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
      await self.app(scope, receive, send)
      return
    sent = b""
    for name, value in scope["headers"]:
      if name == b"authorization":
        sent = value
        break
    # compare_digest: the time taken does not tell how much of a guessed key was right.
    if hmac.compare_digest(sent, self._expected):
      await self.app(scope, receive, send)
      return
    reason = ("no API key was sent" if not sent else
              "the API key is not right" if sent.startswith(b"Bearer ") else
              "the Authorization header is not 'Bearer <key>'")
    body = {"error": {"message": f"Unauthorized: {reason}. Send the server's key as "
                                 "'Authorization: Bearer <key>' (the OpenAI clients' "
                                 "api_key).",
                      "type": "invalid_request_error", "param": None,
                      "code": "invalid_api_key"}}
    reply = responses.JSONResponse(body, status_code=401,
                                   headers={"WWW-Authenticate": "Bearer"})
    await reply(scope, receive, send)
