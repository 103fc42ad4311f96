"""c2jax installs its kernels as `c2jax_kernels`, never as a top-level `kernels`: the
PyPI `kernels` package that transformers imports when present must stay importable beside
c2jax. Checked on real installs of a copy of the project (no network: setuptools comes
from this environment), both a regular install and an editable one (`pip install -e`,
what developers use), in a process that does not see the source tree."""

import json
import pathlib
import shutil
import site
import subprocess
import sys
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_PROBE = """
import importlib.util, json
def where(name):
  spec = importlib.util.find_spec(name)
  return None if spec is None else str(spec.origin)
print(json.dumps({n: where(n) for n in ("c2jax", "c2jax_kernels", "kernels")}))
"""

pytest.importorskip("setuptools", reason="installing needs setuptools (the 'test' extra)")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
  """A copy of the installable parts of the tree (the real tree stays untouched)."""
  src = tmp_path_factory.mktemp("install") / "src"
  ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
  for part in ("c2jax", "kernels"):
    shutil.copytree(ROOT / part, src / part, ignore=ignore)
  shutil.copy2(ROOT / "setup.py", src / "setup.py")
  return src


def _pip(python, *args):
  done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                         "--no-build-isolation", "--no-compile", *args],
                        capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _probe(python, cwd, env=None):
  done = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True,
                        cwd=cwd, env=env, timeout=120, check=True)
  return json.loads(done.stdout)


def test_regular_install_has_no_top_level_kernels(project, tmp_path):
  target = tmp_path / "site"
  _pip(sys.executable, "--target", str(target), str(project))
  assert (target / "c2jax_kernels" / "grouped_matmul" / "api.py").exists()
  assert not (target / "kernels").exists()
  found = _probe(sys.executable, tmp_path, env={"PYTHONPATH": str(target),
                                               "PYTHONNOUSERSITE": "1"})
  assert found["c2jax_kernels"] == str(target / "c2jax_kernels" / "__init__.py")
  assert found["kernels"] is None or str(target) not in found["kernels"], found


def test_editable_install_maps_only_c2jax_names(project, tmp_path):
  env_dir = tmp_path / "venv"
  venv.create(env_dir, with_pip=False)
  python = env_dir / "bin" / "python"
  purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                            "get_path('purelib'))"], capture_output=True, text=True,
                           check=True).stdout.strip()
  # pip and setuptools of this environment, without its own site hooks (.pth files).
  (pathlib.Path(purelib) / "tools.pth").write_text("\n".join(site.getsitepackages()) + "\n")
  _pip(python, "-e", str(project))
  found = _probe(python, tmp_path, env={"PYTHONNOUSERSITE": "1"})
  assert found["c2jax"] == str(project / "c2jax" / "__init__.py"), found
  assert found["c2jax_kernels"] == str(project / "kernels" / "__init__.py"), found
  assert found["kernels"] is None or not found["kernels"].startswith(str(project)), found
