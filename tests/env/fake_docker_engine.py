"""A small fake Docker Engine API server on loopback, for testing the docker backend.

It speaks the subset of the Engine API the backend uses (version, info, containers
create/start/inspect/delete, exec create/start/inspect, archive get/put, commit, image
inspect/delete). A container is a host folder standing for its /workspace; an image is a
frozen copy of one; each exec runs inside a bubblewrap sandbox over that folder with the
container's memory, pids and CPU limits, so the commands the backend sends really run,
isolated. It does not enforce the disk quota (StorageOpt); the real engine's tests do.
"""

import base64
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from http import server

from c2jax.env import bubblewrap
from c2jax.env import limits as limits_lib
from c2jax.env import sandbox as sandbox_lib


class FakeEngine:
  """State of the fake engine; `requests` records (method, path, body) for tests."""

  def __init__(self):
    self.root = tempfile.mkdtemp(prefix='fake-engine-')
    self.containers: dict[str, dict] = {}
    self.images: dict[str, str] = {}  # id -> folder; any other name is an empty image
    self.execs: dict[str, dict] = {}
    self.requests: list[tuple[str, str, dict]] = []
    self.ro_binds = bubblewrap.default_ro_binds()
    self._http = server.ThreadingHTTPServer(('127.0.0.1', 0), _make_handler(self))
    self.base_url = f'tcp://127.0.0.1:{self._http.server_address[1]}'
    threading.Thread(target=self._http.serve_forever, daemon=True).start()

  def close(self):
    self._http.shutdown()
    self._http.server_close()
    shutil.rmtree(self.root, ignore_errors=True)

  def new_folder(self, source: str | None) -> str:
    folder = os.path.join(self.root, uuid.uuid4().hex)
    if source is None:
      os.mkdir(folder)
    else:
      subprocess.run(['cp', '-a', source, folder], check=True)
    return folder


def _make_handler(engine: FakeEngine):

  class Handler(server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args):  # keep test output quiet
      pass

    def _reply(self, status, payload=None, headers=None, raw: bytes | None = None):
      body = raw if raw is not None else json.dumps(payload or {}).encode()
      self.send_response(status)
      for key, value in (headers or {'Content-Type': 'application/json'}).items():
        self.send_header(key, value)
      self.send_header('Content-Length', str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def _body(self) -> bytes:
      return self.rfile.read(int(self.headers.get('Content-Length') or 0))

    def _route(self, method):
      path, _, query = self.path.partition('?')
      path = re.sub(r'^/v[0-9.]+', '', path)
      params = dict(p.split('=', 1) for p in query.split('&') if '=' in p)
      body = self._body()
      parsed = json.loads(body) if body and self.headers.get(
          'Content-Type', '').startswith('application/json') else {}
      engine.requests.append((method, path, parsed))
      for pattern, handler in ROUTES[method]:
        match = re.fullmatch(pattern, path)
        if match:
          return handler(self, params, parsed, body, *match.groups())
      return self._reply(404, {'message': f'fake engine: no route {method} {path}'})

    def do_GET(self):
      self._route('GET')

    def do_POST(self):
      self._route('POST')

    def do_PUT(self):
      self._route('PUT')

    def do_DELETE(self):
      self._route('DELETE')

    # -- handlers -------------------------------------------------------------------

    def version(self, *_):
      self._reply(200, {'ApiVersion': '1.44', 'Version': 'fake'})

    def info(self, *_):
      self._reply(200, {'NCPU': os.cpu_count()})

    def create(self, params, config, *_):
      image = config['Image']
      source = engine.images.get(image)
      if source is None and image.startswith('sha256:'):
        return self._reply(404, {'message': f'No such image: {image}'})
      cid = uuid.uuid4().hex
      engine.containers[cid] = {'folder': engine.new_folder(source), 'config': config,
                                'name': params.get('name')}
      self._reply(201, {'Id': cid, 'Warnings': []})

    def inspect(self, params, config, body, cid):
      if cid not in engine.containers:
        return self._reply(404, {'message': f'No such container: {cid}'})
      self._reply(200, {'Id': cid, 'Config': engine.containers[cid]['config'],
                        'State': {'Running': True}})

    def start(self, params, config, body, cid):
      self._reply(204, raw=b'', headers={})

    def delete(self, params, config, body, cid):
      container = engine.containers.pop(cid, None)
      if container:
        shutil.rmtree(container['folder'], ignore_errors=True)
      self._reply(204, raw=b'', headers={})

    def exec_create(self, params, config, body, cid):
      eid = uuid.uuid4().hex
      engine.execs[eid] = {'container': cid, 'cmd': config['Cmd'], 'exit': None}
      self._reply(201, {'Id': eid})

    def exec_start(self, params, config, body, eid):
      record = engine.execs[eid]
      container = engine.containers[record['container']]
      host = container['config']['HostConfig']
      limits = limits_lib.Limits(memory_mb=host['Memory'] >> 20,
                                 max_processes=host['PidsLimit'],
                                 cpus=host['NanoCpus'] / 1e9, timeout_s=600)
      # Like the real engine: the image's ENV (here the sandbox's) under the container's.
      env = bubblewrap.environment(engine.ro_binds)
      env.update(item.split('=', 1) for item in container['config'].get('Env') or [])
      options = bubblewrap.bwrap_options(container['folder'], engine.ro_binds, env)
      result = bubblewrap.run_in_bwrap(options, record['cmd'], env, limits,
                                       limits.timeout_s)
      record['exit'] = result.exit_code
      # Like the real engine: answer 101, then hijack the connection for raw frames.
      self.send_response(101)
      self.send_header('Content-Type', 'application/vnd.docker.multiplexed-stream')
      self.send_header('Connection', 'Upgrade')
      self.send_header('Upgrade', 'tcp')
      self.end_headers()
      self.wfile.flush()
      time.sleep(0.02)  # headers and frames in separate reads, as from a real engine
      for i in range(0, len(result.output), 1 << 15):
        chunk = result.output[i:i + (1 << 15)]
        self.wfile.write(bytes([1, 0, 0, 0]) + len(chunk).to_bytes(4, 'big') + chunk)
      self.wfile.flush()
      self.close_connection = True

    def exec_inspect(self, params, config, body, eid):
      record = engine.execs[eid]
      self._reply(200, {'ID': eid, 'Running': False, 'ExitCode': record['exit']})

    def _host_path(self, cid, path):
      rel = sandbox_lib.normalize_relpath(path)
      return os.path.join(engine.containers[cid]['folder'], rel)

    def archive_get(self, params, config, body, cid):
      from urllib.parse import unquote  # pylint: disable=g-import-not-at-top
      host = self._host_path(cid, unquote(params['path']))
      if not os.path.lexists(host):
        return self._reply(404, {'message': 'Could not find the file'})
      buf = io.BytesIO()
      with tarfile.open(fileobj=buf, mode='w') as tar:
        tar.add(host, arcname=os.path.basename(host), recursive=False)
      stat = base64.b64encode(json.dumps({'name': os.path.basename(host)}).encode())
      self._reply(200, raw=buf.getvalue(), headers={
          'Content-Type': 'application/x-tar', 'X-Docker-Container-Path-Stat': stat.decode()})

    def archive_put(self, params, config, body, cid):
      from urllib.parse import unquote  # pylint: disable=g-import-not-at-top
      target = self._host_path(cid, unquote(params['path']))
      with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        tar.extractall(target, filter='data')
      self._reply(200, raw=b'', headers={})

    def commit(self, params, config, body, *_):
      cid = params['container']
      image_id = 'sha256:' + uuid.uuid4().hex
      engine.images[image_id] = engine.new_folder(engine.containers[cid]['folder'])
      self._reply(201, {'Id': image_id})

    def image_inspect(self, params, config, body, image_id):
      from urllib.parse import unquote  # pylint: disable=g-import-not-at-top
      image = unquote(image_id)
      if image.startswith('sha256:') and image not in engine.images:
        return self._reply(404, {'message': f'No such image: {image}'})
      self._reply(200, {'Id': image, 'Size': 0})

    def image_delete(self, params, config, body, image_id):
      from urllib.parse import unquote  # pylint: disable=g-import-not-at-top
      folder = engine.images.pop(unquote(image_id), None)
      if folder is None:
        return self._reply(404, {'message': f'No such image: {unquote(image_id)}'})
      shutil.rmtree(folder, ignore_errors=True)
      self._reply(200, [{'Deleted': unquote(image_id)}])

  ROUTES = {
      'GET': [(r'/version', Handler.version),
              (r'/info', Handler.info),
              (r'/containers/(\w+)/json', Handler.inspect),
              (r'/exec/(\w+)/json', Handler.exec_inspect),
              (r'/containers/(\w+)/archive', Handler.archive_get),
              (r'/images/(.+)/json', Handler.image_inspect)],
      'POST': [(r'/containers/create', Handler.create),
               (r'/containers/(\w+)/start', Handler.start),
               (r'/containers/(\w+)/exec', Handler.exec_create),
               (r'/exec/(\w+)/start', Handler.exec_start),
               (r'/commit', Handler.commit)],
      'PUT': [(r'/containers/(\w+)/archive', Handler.archive_put)],
      'DELETE': [(r'/containers/(\w+)', Handler.delete),
                 (r'/images/(.+)', Handler.image_delete)],
  }
  return Handler
