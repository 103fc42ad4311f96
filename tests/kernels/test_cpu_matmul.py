"""c2jax_kernels.cpu_matmul: the panel matmul against numpy, its packing, its errors, and
its build (once per machine, cached; a clear reason without a compiler)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax_kernels import cpu_matmul

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(
    not cpu_matmul.available(),
    reason=f"the panel matmul did not build here: {cpu_matmul.unavailable_reason()}")


@pytest.mark.parametrize("rows,inputs,columns", [
    (1, 7, 32), (3, 64, 96), (8, 128, 64), (9, 33, 32), (17, 64, 128), (0, 5, 32)])
def test_panel_matmul_matches_numpy(rows, inputs, columns):
  # Every row-block size (1-8 rows, then 8 at a time), odd K, several panels and threads.
  rng = np.random.default_rng(rows)
  x = rng.standard_normal((rows, inputs), np.float32)
  w = rng.standard_normal((inputs, columns), np.float32)
  got = jax.jit(cpu_matmul.panel_matmul)(jnp.asarray(x), cpu_matmul.pack(jnp.asarray(w)))
  assert got.shape == (rows, columns) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), x.astype(np.float64) @ w, rtol=1e-5, atol=1e-4)


def test_leading_axes_and_packing_round_trip():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 3, 16), np.float32)
  w = rng.standard_normal((16, 64), np.float32)
  panels = cpu_matmul.pack(jnp.asarray(w))
  assert panels.shape == (2, 16, cpu_matmul.PANEL)
  np.testing.assert_array_equal(panels[1, :, 0], w[:, 32])
  np.testing.assert_array_equal(cpu_matmul.unpack(panels), w)
  np.testing.assert_allclose(cpu_matmul.panel_matmul(jnp.asarray(x), panels), x @ w,
                             rtol=1e-5, atol=1e-4)


def test_bad_shapes_and_dtypes_are_named():
  with pytest.raises(ValueError, match="not a multiple of 32"):
    cpu_matmul.pack(jnp.ones((4, 40)))
  panels = cpu_matmul.pack(jnp.ones((8, 32)))
  with pytest.raises(ValueError, match=r"want x \[..., K\]"):
    cpu_matmul.panel_matmul(jnp.ones((2, 9)), panels)
  with pytest.raises(ValueError, match="float32 only"):
    cpu_matmul.panel_matmul(jnp.ones((2, 8), jnp.bfloat16), panels)


def _in_process(code, **env):
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, PYTHONPATH=ROOT,
                                              JAX_PLATFORMS="cpu", **env))


def test_built_once_per_machine_and_without_a_compiler_says_why(tmp_path):
  cache = tmp_path / "kernels"
  code = ("from c2jax_kernels import cpu_matmul as m; "
          "print(m.available(), m._state.get('library'), m.unavailable_reason())")
  first = _in_process(code, C2JAX_KERNEL_CACHE=str(cache))
  assert first.returncode == 0 and first.stdout.startswith("True"), first.stderr[-2000:]
  [library] = cache.glob("panel_matmul-*.so")
  built = library.stat().st_mtime_ns
  again = _in_process(code, C2JAX_KERNEL_CACHE=str(cache))
  assert again.stdout.split()[:2] == ["True", str(library)]
  assert library.stat().st_mtime_ns == built  # loaded, not rebuilt
  missing = _in_process(
      code + "; import jax.numpy as jnp\ntry:\n  m.panel_matmul(jnp.ones((1, 8)), "
      "m.pack(jnp.ones((8, 32))))\nexcept RuntimeError as e:\n  print('raised:', e)",
      C2JAX_KERNEL_CACHE=str(tmp_path / "other"), CXX=str(tmp_path / "no-such-compiler"))
  assert missing.returncode == 0, missing.stderr[-2000:]
  assert missing.stdout.startswith("False None") and "does not run" in missing.stdout
  assert "raised: cpu_matmul.panel_matmul is not available" in missing.stdout
