"""The CPU decode layout's projection kernel forms (c2jax.rollout.cpu_decode.forms:
transposed, column pieces, 32-column panels) against model.init's stacked tree: the same
prefill and decode step, stack_layers' round trip, and errors that name the kernel."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from c2jax_kernels import cpu_matmul

from c2jax import model
from c2jax.model import layers
from c2jax.rollout import cpu_decode
from c2jax.rollout.cpu_decode import forms
from tests.model.conftest import ATTENTION_CASES, GQA_OVERRIDES, VOCAB, Model, tiny_cfg


def _prefill_then_step(cfg, params):
  """Logits of a one-token decode step after a 5-token prefill, as `params` lays it out."""
  tokens = jnp.asarray([[3, 17, 5, 9, 60, 2]], jnp.int32)
  positions = jnp.arange(6, dtype=jnp.int32)[None]

  @jax.jit
  def run(p):
    cache = model.init_cache(cfg, 1, 8)
    _, _, cache = model.apply(cfg, p, tokens[:, :5], positions_BxL=positions[:, :5],
                              cache=cache)
    return model.apply(cfg, p, tokens[:, 5:], positions_BxL=positions[:, 5:], cache=cache)[0]
  return run(params)


def _laid_out(params, projection_layout):
  return cpu_decode.relayout(model.unstack_layers(params, split_experts=True),
                             projection_layout)


def _every_way(name, inputs, outputs):
  """A projection_layout that uses every form: transposed, pieces (uneven too), whole."""
  if outputs < inputs or name == "o_proj":
    return cpu_decode.TRANSPOSED
  return 3 if name in ("lm_head", "gate_proj", "q_b_proj") else 1


@pytest.mark.parametrize("attention", ["mla", "gqa"])
def test_projection_layouts_decode_as_stacked_and_round_trip(attention):
  """Transposed kernels (kernel_t) and column pieces, MLA and GQA: the same prefill and
  decode step as the stacked tree, and stack_layers gives model.init's tree back."""
  moe = Model(tiny_cfg(num_layers=2, **ATTENTION_CASES[attention]))
  cfg, params = moe.cfg, moe.params
  laid = _laid_out(params, _every_way)
  layer = laid["dense_layers"]["0"]
  assert "kernel_t" in layer["attn"]["o_proj"] and "kernel" not in layer["attn"]["o_proj"]
  pieces = laid["lm_head"][forms.PIECES_PARAM]
  assert isinstance(pieces, tuple) and len(pieces) == 3
  assert isinstance(layer["mlp"]["gate_proj"][forms.PIECES_PARAM], tuple)
  if attention == "mla":  # read whole by the absorbed decode
    assert not isinstance(layer["attn"]["kv_b_proj"]["kernel"], tuple)
  jax.tree.map(np.testing.assert_array_equal, model.stack_layers(laid), params)
  np.testing.assert_allclose(_prefill_then_step(cfg, laid), _prefill_then_step(cfg, params),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not cpu_matmul.available(), reason="the panel matmul did not build here")
@pytest.mark.parametrize("attention", ["mla", "gqa"])
def test_panel_layouts_decode_as_stacked_and_round_trip(attention):
  """Kernels in 32-column panels (kernel_p; several input axes: o_proj, several output
  axes: q_proj with 32-wide heads): the same prefill and decode step as the stacked tree,
  and stack_layers gives model.init's tree back; a kernel whose last axis is not a
  multiple of 32 (16-wide heads) is named."""
  wide = {"head_dim": 32} if attention == "gqa" else {}
  moe = Model(tiny_cfg(num_layers=2, **{**ATTENTION_CASES[attention], **wide}))
  cfg, params = moe.cfg, moe.params
  divisible = {}
  for _, ins, outs in model.projection_shapes(params):
    key = (math.prod(ins), math.prod(outs))
    divisible[key] = divisible.get(key, True) and outs[-1] % cpu_matmul.PANEL == 0
  laid = _laid_out(params, lambda name, i, o: cpu_decode.PANELS if divisible[i, o] else 1)
  attn = laid["dense_layers"]["0"]["attn"]
  if attention == "gqa":
    assert attn["o_proj"]["kernel_p"].shape == (2, 4, 32, 32)  # D / 32, H, hd, 32
    assert attn["q_proj"]["kernel_p"].shape == (4, 1, 64, 32)  # H, hd / 32, D, 32
  else:  # the absorbed decode reads kv_b_proj's kernel itself
    assert "kernel_p" in attn["o_proj"] and "kernel" in attn["kv_b_proj"]
  assert laid["lm_head"]["kernel_p"].shape == (VOCAB // 32, 64, 32)
  jax.tree.map(np.testing.assert_array_equal, model.stack_layers(laid), params)
  np.testing.assert_allclose(_prefill_then_step(cfg, laid), _prefill_then_step(cfg, params),
                             rtol=1e-5, atol=1e-5)
  narrow = Model(tiny_cfg(num_layers=2, **GQA_OVERRIDES)).params  # 16-wide heads
  with pytest.raises(ValueError, match=r"gave 'panels' for a float32 kernel .* multiple of 32"):
    _laid_out(narrow, lambda name, i, o: cpu_decode.PANELS)


@pytest.mark.skipif(not cpu_matmul.available(), reason="the panel matmul did not build here")
def test_panel_kernel_up_to_max_rows_and_xla_beyond():
  cfg = tiny_cfg()
  linear = layers.Linear((2, 8), (64,), ("heads", "kv", "embed"), cfg)
  kernel = jax.random.normal(jax.random.key(0), (2, 8, 64))
  panels = jnp.transpose(kernel.reshape(2, 8, 2, 32), (2, 0, 1, 3))  # [64/32, 2, 8, 32]
  for rows in (3, cpu_matmul.MAX_ROWS + 2):
    x = jax.random.normal(jax.random.key(rows), (rows, 2, 8))
    want = linear.apply({"params": {"kernel": kernel}}, x)
    jitted = jax.jit(lambda p, x: linear.apply({"params": p}, x))
    text = jitted.lower({"kernel_p": panels}, x).as_text()
    assert (cpu_matmul.TARGET in text) == (rows <= cpu_matmul.MAX_ROWS)
    np.testing.assert_allclose(jitted({"kernel_p": panels}, x), want, rtol=1e-5, atol=1e-5)


def test_projection_layout_errors_name_the_kernel():
  params = Model(tiny_cfg(num_layers=2)).params
  with pytest.raises(ValueError,
                     match=r"projection_layout\('kv_a_proj', ...\) gave 'sideways'"):
    _laid_out(params, lambda name, i, o: "sideways")
  with pytest.raises(ValueError, match="1 to 4"):
    forms.split_columns(jnp.ones((2, 4)), 5)
  cfg = tiny_cfg()
  linear = layers.Linear((4,), (6,), ("embed", "mlp"), cfg)
  with pytest.raises(ValueError, match=r"kernel_t: a transposed kernel needs shape \(6, 4\)"):
    linear.apply({"params": {"kernel_t": jnp.ones((4, 6))}}, jnp.ones((1, 4)))
  with pytest.raises(ValueError, match="widths summing to 6"):
    linear.apply({"params": {forms.PIECES_PARAM: (jnp.ones((4, 2)), jnp.ones((4, 3)))}},
                 jnp.ones((1, 4)))
  pieces = forms.split_columns(jnp.arange(20.0).reshape(2, 10), 3)
  assert [p.shape[-1] for p in pieces] == [4, 3, 3]
  np.testing.assert_array_equal(forms.join_columns(pieces), jnp.arange(20.0).reshape(2, 10))
