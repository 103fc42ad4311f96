"""Helpers shared by the env tests."""

import json
import os


def write_tree(root, files) -> str:
  """Writes {relative path: text} under root; returns root as a string."""
  for path, text in files.items():
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, 'w') as f:
      f.write(text)
  return str(root)


_PYPROJECT = ('[build-system]\nrequires = ["setuptools>=61"]\n'
              'build-backend = "setuptools.build_meta"\n[project]\nname = "{name}"\n'
              'version = "0.1"\ndependencies = {deps}\n')
_CALC = '''def clamp(x, lo, hi):
  if x < lo:
    return lo
  if x > hi:
    return hi
  return x


def total(xs):
  s = 0
  for x in xs:
    s = s + x
  return s
'''
_TESTS = '''from calc import clamp, total


def test_clamp_low():
  assert clamp(-1, 0, 5) == 0


def test_clamp_high():
  assert clamp(9, 0, 5) == 5


def test_clamp_mid():
  assert clamp(3, 0, 5) == 3


def test_total():
  assert total([1, 2, 3]) == 6
'''


def calc_repo(root, name, deps, extra='') -> str:
  """A pip-installable package `name` (src layout, setuptools) with 4 passing tests;
  `deps` are its registry dependencies, `extra` code prepended to its module."""
  return write_tree(root, {
      'pyproject.toml': _PYPROJECT.format(name=name, deps=json.dumps(deps)),
      f'src/{name}/__init__.py': extra + _CALC,
      'tests/test_calc.py': _TESTS.replace('calc', name),
  })


def real_docker_engine() -> str:
  """'' where a real Docker engine answers and holds the sandbox image (tools/setup.sh
  builds it), else why not (a skip reason)."""
  import docker  # pylint: disable=g-import-not-at-top
  from c2jax.env import docker_backend  # pylint: disable=g-import-not-at-top

  image = os.environ.get('C2JAX_DOCKER_IMAGE') or docker_backend.DEFAULT_IMAGE
  try:
    client = docker.from_env(timeout=10)
    client.ping()
  except Exception as e:  # pylint: disable=broad-except
    return f'no Docker engine is reachable ({type(e).__name__}); tools/setup.sh starts one as root'
  try:
    client.images.get(image)
  except docker.errors.ImageNotFound:
    return f'the Docker engine has no image {image}; tools/setup.sh builds it'
  finally:
    client.close()
  return ''


# Three processes spin for two seconds of wall time; prints the CPU seconds they used.
CPU_SPIN = '''
import os, time
def spin():
  end = time.monotonic() + 2
  while time.monotonic() < end:
    pass
pids = []
for _ in range(3):
  pid = os.fork()
  if pid == 0:
    spin()
    os._exit(0)
  pids.append(pid)
for pid in pids:
  os.waitpid(pid, 0)
t = os.times()
print('cpu', t.children_user + t.children_system)
'''


def spun_cpu_seconds(box, cpus) -> float:
  """CPU seconds CPU_SPIN used in `box`, checked against a quota of `cpus` cores: at most
  cpus * 2 s of wall time, with a period's slack."""
  result = box.exec(['python', '-c', CPU_SPIN], timeout_s=30)
  used = float(result.text.split('cpu ')[1].split()[0])
  assert used <= cpus * 2 + 0.15, f'{used:.2f} CPU s under a quota of {cpus} cores in 2 s'
  return used


def grade(task, patch: str = '', backend: str = 'bubblewrap'):
  """The task graded as the RL loop grades it, in the sandbox it starts for the task
  (bubblewrap: its language's toolchain mounted; docker: its environment image), after
  applying `patch` (e.g. the gold one) when given."""
  from c2jax.env import reward  # pylint: disable=g-import-not-at-top
  from c2jax.env import sandbox as sandbox_lib  # pylint: disable=g-import-not-at-top

  with sandbox_lib.make_task_sandbox(backend, task, timeout_s=300) as box:
    if patch:
      box.write_file('gold.patch', patch.encode())
      applied = box.run_shell('patch -p1 < gold.patch && rm gold.patch')
      assert applied.exit_code == 0, applied.text
    return reward.grade(box, task)
