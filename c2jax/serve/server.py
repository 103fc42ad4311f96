"""Running the app under uvicorn: blocking (the CLI) or on a background thread (tests,
benchmarks, notebooks), on an explicit socket so port 0 picks a free port."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from c2jax.rollout import resident
from c2jax.serve import auth
from c2jax.serve.app import Service
from c2jax.serve.endpoints import create_app


def _socket(host: str, port: int) -> socket.socket:
  sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
    # Listening before the address is announced: a client that connects while uvicorn is
    # still starting waits in the backlog instead of being refused.
    sock.listen(2048)
  except OSError as e:
    sock.close()
    raise OSError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port "
                  "(0 picks a free one).") from e
  return sock


def _server(service: Service, log_level: str, own_logging: bool) -> uvicorn.Server:
  # In-process servers (tests, notebooks) leave the host's logging setup alone: uvicorn's
  # own config would bind handlers to whatever sys.stderr is at that moment.
  config = uvicorn.Config(create_app(service), log_level=log_level, access_log=False,
                          timeout_graceful_shutdown=1,
                          **({} if own_logging else {"log_config": None}))
  return uvicorn.Server(config)


class Running:
  """A server on a background thread; `stop()` (or leaving the `with`) shuts it down."""

  def __init__(self, service: Service, host: str = "127.0.0.1", port: int = 0,
               log_level: str = "warning"):
    auth.warn_if_exposed(host, service.api_key)
    self.service = service.start()
    self._sock = _socket(host, port)
    self.host, self.port = host, self._sock.getsockname()[1]
    self._server = _server(service, log_level, own_logging=False)
    self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                    name="c2jax-http", daemon=True)
    self._thread.start()
    deadline = time.time() + 30
    while not self._server.started:
      if not self._thread.is_alive() or time.time() > deadline:
        raise RuntimeError("the HTTP server did not start; see the log above.")
      time.sleep(0.01)

  @property
  def base_url(self) -> str:
    return f"http://{self.host}:{self.port}/v1"

  def stop(self) -> None:
    self._server.should_exit = True
    self._thread.join(10)
    self.service.close()
    self._sock.close()

  def __enter__(self) -> "Running":
    return self

  def __exit__(self, *exc) -> None:
    self.stop()


def serve_forever(service: Service, host: str, port: int, log_level: str = "info") -> None:
  auth.warn_if_exposed(host, service.api_key)
  sock = _socket(host, port)
  service.start()
  print(f"c2jax serve: {service.model_name!r} on http://{host}:{sock.getsockname()[1]}/v1 "
        f"({service.engine.num_slots} slots, max_length {service.engine.max_length})",
        flush=True)
  if hasattr(service.engine, "resident_weights"):
    print(f"c2jax serve: {resident.describe(service.engine.resident_weights())}", flush=True)
  try:
    _server(service, log_level, own_logging=True).run(sockets=[sock])
  finally:
    service.close()
    sock.close()
