"""grouped_matmul: every impl against autodiff of the plain-jnp definition (CPU, interpret)."""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import c2jax_kernels as kernels
from c2jax_kernels.grouped_matmul import mosaic_gpu
from c2jax_kernels.grouped_matmul import reference

M, K, N, G = 200, 128, 64, 6  # M is not a multiple of any kernel's row tile
TOLERANCE = {jnp.float32: dict(rtol=1e-5, atol=1e-4), jnp.bfloat16: dict(rtol=2e-2, atol=1e-1)}


def random_group_sizes(rng, num_groups, num_rows):
  """Sizes with at least one empty group, ragged edges, and a sum strictly below M."""
  total = int(rng.integers(3 * num_rows // 4, num_rows))  # crosses the 128-row tile
  cuts = np.sort(rng.integers(0, total + 1, size=num_groups - 1))
  sizes = np.diff(np.concatenate([[0], cuts, [total]]))
  empty = int(rng.integers(num_groups))
  sizes[(empty + 1) % num_groups] += sizes[empty]
  sizes[empty] = 0
  return sizes.astype(np.int32)


def random_inputs(seed, dtype):
  rng = np.random.default_rng(seed)
  lhs = rng.standard_normal((M, K)).astype(np.float32)
  rhs = rng.standard_normal((G, K, N)).astype(np.float32) / np.sqrt(K)
  dout = rng.standard_normal((M, N)).astype(np.float32)
  sizes = random_group_sizes(rng, G, M)
  return (jnp.asarray(lhs, dtype), jnp.asarray(rhs, dtype), jnp.asarray(sizes),
          jnp.asarray(dout, dtype))


@functools.partial(jax.jit, static_argnames='impl')
def forward_and_grads(lhs, rhs, sizes, dout, *, impl):
  out, vjp = jax.vjp(lambda a, b: kernels.grouped_matmul(a, b, sizes, impl=impl), lhs, rhs)
  return (out, *vjp(dout))


@jax.jit
def expected_forward_and_grads(lhs, rhs, sizes, dout):
  """Autodiff of the plain definition in float32: independent of every custom VJP."""
  def definition(a, b):
    return reference.gmm(a, b, sizes, transpose_rhs=False, out_dtype=jnp.float32)
  out, vjp = jax.vjp(definition, lhs.astype(jnp.float32), rhs.astype(jnp.float32))
  return (out, *vjp(dout.astype(jnp.float32)))


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('impl', sorted(kernels.grouped_matmul_impls()))
def test_forward_and_gradients_match_definition(impl, dtype):
  for seed in (0, 1):
    lhs, rhs, sizes, dout = random_inputs(seed, dtype)
    assert 0 in np.asarray(sizes)
    got = forward_and_grads(lhs, rhs, sizes, dout, impl=impl)
    want = expected_forward_and_grads(lhs, rhs, sizes, dout)
    for name, g, w in zip(('out', 'dlhs', 'drhs'), got, want):
      assert g.dtype == dtype, name
      np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w), err_msg=name,
                                 **TOLERANCE[dtype])
    total = int(sizes.sum())
    assert not np.any(np.asarray(got[0][total:], np.float32)), 'rows past the sum'
    assert not np.any(np.asarray(got[1][total:], np.float32)), 'dlhs rows past the sum'


def test_preferred_element_type_sets_output_dtype():
  lhs, rhs, sizes, _ = random_inputs(2, jnp.bfloat16)
  out = kernels.grouped_matmul(lhs, rhs, sizes, impl='ragged_dot',
                               preferred_element_type=jnp.float32)
  assert out.dtype == jnp.float32
  want = reference.gmm(lhs, rhs, sizes, transpose_rhs=False, out_dtype=jnp.float32)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


def test_default_impl_per_platform():
  assert kernels.default_grouped_matmul_impl('cpu') == 'ragged_dot'
  assert kernels.default_grouped_matmul_impl('gpu') == 'mosaic_gpu'
  assert kernels.default_grouped_matmul_impl('tpu') == 'megablox'
  with pytest.raises(ValueError, match='No default'):
    kernels.default_grouped_matmul_impl('quantum')


@pytest.mark.parametrize('capability, impl', [('9.0', 'mosaic_gpu'), ('10.0', 'tokamax'),
                                              ('8.0', 'tiled'), ('gfx942', 'tiled')])
def test_gpu_default_follows_the_target_devices_generation(monkeypatch, capability, impl):
  """The Mosaic GPU kernel issues Hopper's wgmma, which ptxas rejects for sm_100 (seen
  compiling for compile-only B200s): Blackwell gets tokamax's tcgen05 kernels (installed
  with the suite), other GPUs 'tiled' (XLA's GPU ragged_dot expands into a dense product
  per group). The device is the one the program compiles for (the mesh in force), not
  this process's."""
  from c2jax_kernels import platform as platform_lib
  device = types.SimpleNamespace(platform='gpu', compute_capability=capability)
  monkeypatch.setattr(platform_lib, 'target_device', lambda: device)
  assert kernels.default_grouped_matmul_impl('gpu') == impl


def test_bad_arguments_are_explained():
  lhs, rhs, sizes, _ = random_inputs(3, jnp.float32)
  with pytest.raises(ValueError, match='Unknown grouped-matmul impl'):
    kernels.grouped_matmul(lhs, rhs, sizes, impl='cutlass')
  with pytest.raises(ValueError, match='shape mismatch'):
    kernels.grouped_matmul(lhs[:, :64], rhs, sizes)
  with pytest.raises(ValueError, match='integers'):
    kernels.grouped_matmul(lhs, rhs, sizes.astype(jnp.float32))
  with pytest.raises(ValueError, match='multiple of'):
    mosaic_gpu.gmm(lhs[:, :100], rhs[:, :100], sizes, transpose_rhs=False,
                   out_dtype=jnp.float32, interpret=True)
  with pytest.raises(ValueError, match='bfloat16/float16'):
    mosaic_gpu.gmm(lhs, rhs, sizes, transpose_rhs=False, out_dtype=jnp.float32)


@pytest.mark.parametrize('kernel', ['gmm', 'gmm_transposed', 'tgmm'])
def test_mosaic_gpu_kernels_lower_for_cuda(kernel):
  """No GPU here: check the kernels pass Mosaic GPU lowering (layouts, SMEM budget)."""
  m, k, n, g = 512, 256, 128, 8
  bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  sizes = jax.ShapeDtypeStruct((g,), jnp.int32)
  fn, args = {
      'gmm': (functools.partial(mosaic_gpu.gmm, transpose_rhs=False, out_dtype=jnp.bfloat16),
              (bf16(m, k), bf16(g, k, n), sizes)),
      'gmm_transposed': (functools.partial(mosaic_gpu.gmm, transpose_rhs=True,
                                           out_dtype=jnp.float32),
                         (bf16(m, n), bf16(g, k, n), sizes)),
      'tgmm': (functools.partial(mosaic_gpu.tgmm, out_dtype=jnp.bfloat16),
               (bf16(m, k), bf16(m, n), sizes)),
  }[kernel]
  lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=('cuda',))
  assert 'mosaic_gpu' in lowered.as_text()


@pytest.mark.parametrize('kernel', ['gmm', 'tgmm'])
def test_ragged_dot_runs_row_tiles_on_cpu_and_ragged_dot_elsewhere(kernel):
  """On CPU XLA would expand ragged_dot to G dense dots; there it runs tiled.py's loop."""
  from c2jax_kernels.grouped_matmul import ragged
  m, k, n, g = 64, 32, 16, 4
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  sizes = jax.ShapeDtypeStruct((g,), jnp.int32)
  fn, args = {
      'gmm': (functools.partial(ragged.gmm, transpose_rhs=False, out_dtype=jnp.float32),
              (f32(m, k), f32(g, k, n), sizes)),
      'tgmm': (functools.partial(ragged.tgmm, out_dtype=jnp.float32),
               (f32(m, k), f32(m, n), sizes)),
  }[kernel]
  traced = jax.jit(fn).trace(*args)
  cpu = traced.lower(lowering_platforms=('cpu',)).as_text()
  assert 'while' in cpu and 'ragged_dot' not in cpu
  tpu = traced.lower(lowering_platforms=('tpu',)).as_text()
  assert 'ragged_dot' in tpu and 'while' not in tpu


def test_tiled_work_follows_group_sizes():
  """Tiles in use: sum of ceil(size / tile) (empty groups cost nothing), within the bound."""
  from c2jax_kernels.grouped_matmul import tiled
  sizes = jnp.asarray([0, 9, 0, 16, 1, 0], jnp.int32)
  group_W, first_row_W, count_W, used = tiled._tiles(sizes, 32, 8)
  assert int(used) == 2 + 2 + 1
  assert group_W.shape == (32 // 8 + 6 - 1,)
  np.testing.assert_array_equal(group_W[:5], [1, 1, 3, 3, 4])
  np.testing.assert_array_equal(first_row_W[:5], [0, 8, 9, 17, 25])
  np.testing.assert_array_equal(count_W[:5], [8, 1, 8, 8, 1])
  assert tiled.tile_rows(4096, 16) == 128 and tiled.tile_rows(64, 16) == 8
  assert tiled.tile_rows(3, 16) == 3
