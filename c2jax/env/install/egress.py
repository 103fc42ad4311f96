"""Allowlisted egress for install sandboxes: a CONNECT proxy on a unix socket.

A bubblewrap sandbox has a network namespace of its own with nothing but loopback, so
nothing inside can reach the host's network. For installs, the host runs this proxy on a
unix socket in a folder that is bound (read-only; connecting to a socket needs no write
access to the mount) into the sandbox. Inside, `FORWARDER` (a few lines of Python) listens
on 127.0.0.1:PORT of the sandbox's own loopback and relays each connection to the socket;
pip sees an ordinary `https_proxy=http://127.0.0.1:PORT`. The proxy answers `CONNECT
host:port` (HTTPS) and absolute-form plain HTTP requests only when `host` is on the
allowlist (exact names, or `*.suffix`) and the port is 80 or 443; anything else gets 403
and is recorded in `refused`. There is no other way out: no veth, no root needed, and the
same mechanism works for any sandbox that can bind a host folder.
"""

from __future__ import annotations

import os
import select
import socket
import socketserver
import tempfile
import threading

SOCKET_NAME = 'egress.sock'
FORWARDER_NAME = 'forward.py'
PROXY_PORT = 3128  # inside the sandbox's own network namespace; nothing else uses it
_ALLOWED_PORTS = (80, 443)
_MAX_HEAD = 16384

# Runs inside the sandbox (any Python 3): loopback TCP -> the bound unix socket.
FORWARDER = r'''
import os, socket, sys, threading
sock_path, port, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(64)
open(ready, "w").close()
def pump(a, b):
  try:
    while True:
      data = a.recv(65536)
      if not data:
        break
      b.sendall(data)
  except OSError:
    pass
  finally:
    for s in (a, b):
      try:
        s.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass
def serve(client):
  upstream = socket.socket(socket.AF_UNIX)
  try:
    upstream.connect(sock_path)
  except OSError:
    client.close()
    return
  threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
  pump(client, upstream)
while True:
  conn, _ = server.accept()
  threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''


def host_allowed(host: str, allow_hosts: tuple[str, ...]) -> bool:
  host = host.lower().rstrip('.')
  for pattern in allow_hosts:
    pattern = pattern.lower()
    if pattern.startswith('*.'):
      if host.endswith(pattern[1:]):
        return True
    elif host == pattern:
      return True
  return False


def _split_host_port(target: str, default_port: int) -> tuple[str, int]:
  if target.startswith('['):  # [v6]:port
    host, _, rest = target[1:].partition(']')
    return host, int(rest[1:]) if rest.startswith(':') else default_port
  host, sep, port = target.rpartition(':')
  if not sep or not port.isdigit():
    return target, default_port
  return host, int(port)


def _relay(a: socket.socket, b: socket.socket) -> None:
  sockets = [a, b]
  while True:
    ready, _, _ = select.select(sockets, [], [], 300)
    if not ready:
      return
    for s in ready:
      data = s.recv(65536)
      if not data:
        return
      (b if s is a else a).sendall(data)


class _Handler(socketserver.BaseRequestHandler):

  def handle(self):
    proxy: AllowlistProxy = self.server.proxy  # type: ignore[attr-defined]
    head = b''
    while b'\r\n\r\n' not in head and len(head) < _MAX_HEAD:
      chunk = self.request.recv(4096)
      if not chunk:
        return
      head += chunk
    first = head.split(b'\r\n', 1)[0].decode('latin-1')
    parts = first.split()
    if len(parts) != 3:
      return self._refuse(proxy, first, 'malformed request line')
    method, target, _ = parts
    if method == 'CONNECT':
      host, port = _split_host_port(target, 443)
      rest = head.split(b'\r\n\r\n', 1)[1]
    elif target.startswith('http://'):
      host, port = _split_host_port(target[len('http://'):].split('/', 1)[0], 80)
      rest = head
    else:
      return self._refuse(proxy, first, 'only CONNECT and absolute http:// requests')
    if port not in _ALLOWED_PORTS or not host_allowed(host, proxy.allow_hosts):
      return self._refuse(proxy, f'{host}:{port}',
                          f'not on the allowlist {list(proxy.allow_hosts)}')
    try:
      upstream = socket.create_connection((host, port), timeout=30)
    except OSError as e:
      self.request.sendall(f'HTTP/1.1 502 Bad Gateway\r\n\r\n{e}\n'.encode())
      return
    with upstream:
      upstream.settimeout(None)
      if method == 'CONNECT':
        self.request.sendall(b'HTTP/1.1 200 Connection established\r\n\r\n')
      if rest:
        upstream.sendall(rest)
      proxy.allowed.append(f'{host}:{port}')
      _relay(self.request, upstream)

  def _refuse(self, proxy, what: str, why: str) -> None:
    proxy.refused.append(what)
    body = f'c2jax egress: {what} refused: {why}.\n'.encode()
    self.request.sendall(b'HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n'
                         b'Content-Length: %d\r\nConnection: close\r\n\r\n' % len(body) + body)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
  daemon_threads = True


class AllowlistProxy:
  """The host side. Use as a context manager; `folder` is what to bind into a sandbox.

    with AllowlistProxy(('pypi.org', 'files.pythonhosted.org')) as proxy:
      sandbox = BubblewrapSandbox(repo, ro_binds=(..., proxy.folder))
      sandbox.run_shell(proxy.wrap('pip install six'))
  """

  def __init__(self, allow_hosts: tuple[str, ...]):
    if isinstance(allow_hosts, str) or not all(isinstance(h, str) and h for h in allow_hosts):
      raise ValueError(f'allow_hosts must be a tuple of host names, got {allow_hosts!r}.')
    self.allow_hosts = tuple(allow_hosts)
    self.allowed: list[str] = []
    self.refused: list[str] = []
    self.folder = ''
    self._server = None

  def __enter__(self):
    self.folder = tempfile.mkdtemp(prefix='c2jax-egress-')
    os.chmod(self.folder, 0o755)
    with open(os.path.join(self.folder, FORWARDER_NAME), 'w') as f:
      f.write(FORWARDER)
    path = os.path.join(self.folder, SOCKET_NAME)
    self._server = _Server(path, _Handler)
    self._server.proxy = self
    os.chmod(path, 0o777)  # the sandbox user is not the host user
    threading.Thread(target=self._server.serve_forever, daemon=True).start()
    return self

  def __exit__(self, *exc):
    if self._server is not None:
      self._server.shutdown()
      self._server.server_close()
      self._server = None
    for name in (SOCKET_NAME, FORWARDER_NAME):
      try:
        os.remove(os.path.join(self.folder, name))
      except FileNotFoundError:
        pass
    os.rmdir(self.folder)

  def wrap(self, command: str) -> str:
    """`command` as a shell script that first starts the in-sandbox forwarder and points
    the proxy variables at it. The forwarder dies with the sandbox's pid namespace."""
    forwarder = os.path.join(self.folder, FORWARDER_NAME)
    sock = os.path.join(self.folder, SOCKET_NAME)
    url = f'http://127.0.0.1:{PROXY_PORT}'
    return (f'python3 {forwarder} {sock} {PROXY_PORT} /tmp/.egress-ready & '
            'for _ in $(seq 100); do [ -e /tmp/.egress-ready ] && break; sleep 0.05; done; '
            f'export http_proxy={url} https_proxy={url} HTTP_PROXY={url} HTTPS_PROXY={url}; '
            f'{command}')
