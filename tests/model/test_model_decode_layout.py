"""The decode layout (model.unstack_layers: one array per layer and per routed expert, or
a layer's experts fused, the layers as a Python loop) against model.init's stacked tree,
and the 'per_expert' and 'all_experts' MoE dispatches it runs against the sorted 'ragged'
one."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from c2jax_kernels import cpu_matmul

from c2jax import model
from c2jax.model import moe_dispatch
from tests.model.conftest import VOCAB, Model, tiny_cfg

D, F, E, K = 8, 6, 8, 2


def _experts(seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return moe_dispatch.ExpertWeights(*(0.3 * jax.random.normal(k, s) for k, s in zip(
      keys, [(E, D, F), (E, D, F), (E, F, D)])))


def _split(experts):
  return moe_dispatch.ExpertWeights(*(tuple(w) for w in experts))


def _routed(tokens):
  """(x [T, D], combine weights [T, K], expert indices [T, K]): skewed to experts 0..3, so
  4..7 stay empty, and row 0 repeats its expert (a replayed duplicate index)."""
  keys = jax.random.split(jax.random.key(tokens), 3)
  x = jax.random.normal(keys[0], (tokens, D))
  weights = jax.nn.softmax(jax.random.normal(keys[1], (tokens, K)), axis=-1)
  return x, weights, jax.random.randint(keys[2], (tokens, K), 0, 4).at[0].set(2)


@pytest.mark.parametrize("tokens", [1, 3, 20])
def test_per_expert_matches_ragged(tokens):
  """Both paths of per_expert: every chosen expert on all tokens (T <= ALL_TOKENS_MAX_TOKENS)
  and the loop over experts' tiles (skewed groups, empty experts, a replayed duplicate
  index)."""
  x, weights, indices = _routed(tokens)
  experts = _experts()
  want = moe_dispatch.ragged(x, weights, indices, experts)
  got = jax.jit(moe_dispatch.per_expert)(x, weights, indices, _split(experts))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # 1 and 3 tokens take the all-tokens path, 20 the tile loop.
  assert 3 <= moe_dispatch.ALL_TOKENS_MAX_TOKENS < 20


def _fused(experts):
  """gate and up [E, D, F] as unstack_layers(fuse_experts=True) stores them: [D, 2, E, F]."""
  return jnp.stack([experts.gate_ExDxF.transpose(1, 0, 2),
                    experts.up_ExDxF.transpose(1, 0, 2)], axis=1)


@pytest.mark.parametrize("tokens", [1, 20])
def test_all_experts_matches_ragged(tokens):
  """Every expert on every token from fused weights, weighted by the combine weights:
  the chosen experts' sum, empty experts and a replayed duplicate index included."""
  x, weights, indices = _routed(tokens)
  experts = _experts()
  want = moe_dispatch.ragged(x, weights, indices, experts)
  got = jax.jit(moe_dispatch.all_experts)(x, weights, indices, _fused(experts),
                                          experts.down_ExFxD)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_per_expert_selected_for_split_weights_and_checks_them():
  assert moe_dispatch.select("dense", "none", 64, 2, 8, split=True) is moe_dispatch.per_expert
  assert moe_dispatch.select("ragged", "none", 1, 2, 8, split=True) is moe_dispatch.per_expert
  x, weights = jnp.ones((2, D)), jnp.full((2, K), 0.5)
  indices = jnp.zeros((2, K), jnp.int32)
  with pytest.raises(ValueError, match="one weight array per expert"):
    moe_dispatch.per_expert(x, weights, indices, _experts())
  with pytest.raises(ValueError, match="unquantised"):
    moe_dispatch.per_expert(x, weights, indices, _split(_experts()), quant="mxfp8")


@pytest.fixture(scope="module")
def small_moe():
  # 3 MoE layers so the unrolled loop has several layers per stack.
  return Model(tiny_cfg(num_layers=4))


EXPERT_LAYOUTS = {"stacked": {}, "split": dict(split_experts=True),
                  "fused": dict(fuse_experts=True)}


def test_unstack_round_trip(small_moe):
  params = small_moe.params
  for layout, kwargs in EXPERT_LAYOUTS.items():
    unstacked = model.unstack_layers(params, **kwargs)
    assert sorted(unstacked["moe_layers"]) == ["0", "1", "2"]
    experts = unstacked["moe_layers"]["1"]["moe"]["experts"]
    if layout == "fused":
      assert sorted(experts) == ["down_proj", moe_dispatch.FUSED_GATE_UP]
      cfg = small_moe.cfg
      assert experts[moe_dispatch.FUSED_GATE_UP].shape == (
          cfg.hidden_size, 2, cfg.moe.num_experts, cfg.moe.intermediate_size)
    else:
      assert isinstance(experts["gate_proj"], tuple) == (layout == "split")
    back = model.stack_layers(unstacked)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, back, params)
    assert model.has_unstacked_layers(unstacked) and not model.has_unstacked_layers(params)
  with pytest.raises(ValueError, match="pass at most one"):
    model.unstack_layers(params, split_experts=True, fuse_experts=True)


@pytest.mark.parametrize("prompt_len", [5, 20])
def test_unstacked_layout_decodes_as_stacked(small_moe, prompt_len):
  """Prefill then one decode step against a cache: logits, routing and the cache agree.
  A 20-token prompt of 2 rows (40 tokens, over ALL_EXPERTS_MAX_TOKENS) prefills fused
  experts through the stacked weights and the usual dispatch, its decode step through
  all_experts."""
  cfg, params = small_moe.cfg, small_moe.params
  assert 2 * 5 <= moe_dispatch.ALL_EXPERTS_MAX_TOKENS < 2 * 20
  tokens = jax.random.randint(jax.random.key(prompt_len), (2, prompt_len + 1), 1,
                              cfg.vocab_size).at[1, 0:2].set(7)
  prompt, step = tokens[:, :prompt_len], tokens[:, prompt_len:]
  positions = jnp.broadcast_to(jnp.arange(prompt_len + 1, dtype=jnp.int32),
                               (2, prompt_len + 1))

  def run(p):
    cache = model.init_cache(cfg, 2, prompt_len + 3)
    _, _, cache = model.apply(cfg, p, prompt, positions_BxL=positions[:, :prompt_len],
                              cache=cache)
    logits, aux, cache = model.apply(cfg, p, step, positions_BxL=positions[:, prompt_len:],
                                     cache=cache)
    return logits, aux["expert_indices"], aux["expert_loads"], cache

  want = jax.jit(run)(params)
  for kwargs in EXPERT_LAYOUTS.values():
    got = jax.jit(run)(model.unstack_layers(params, **kwargs))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2], want[2])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), got[3], want[3])


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


def _every_way(name, inputs, outputs):
  """A projection_layout that uses every form: transposed, pieces (uneven too), whole."""
  if outputs < inputs or name == "o_proj":
    return model.TRANSPOSED
  return 3 if name in ("lm_head", "gate_proj", "q_b_proj") else 1


@pytest.mark.parametrize("attention", ["mla", "gqa"])
def test_projection_layouts_decode_as_stacked_and_round_trip(attention):
  """Transposed kernels (kernel_t) and column pieces, MLA and GQA: the same prefill and
  decode step as the stacked tree, and stack_layers gives model.init's tree back."""
  from tests.model.conftest import ATTENTION_CASES
  moe = Model(tiny_cfg(num_layers=2, **ATTENTION_CASES[attention]))
  cfg, params = moe.cfg, moe.params
  laid = model.unstack_layers(params, split_experts=True, projection_layout=_every_way)
  layer = laid["dense_layers"]["0"]
  assert "kernel_t" in layer["attn"]["o_proj"] and "kernel" not in layer["attn"]["o_proj"]
  assert isinstance(laid["lm_head"]["kernel"], tuple) and len(laid["lm_head"]["kernel"]) == 3
  assert isinstance(layer["mlp"]["gate_proj"]["kernel"], tuple)
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
  from tests.model.conftest import ATTENTION_CASES, GQA_OVERRIDES
  wide = {"head_dim": 32} if attention == "gqa" else {}
  moe = Model(tiny_cfg(num_layers=2, **{**ATTENTION_CASES[attention], **wide}))
  cfg, params = moe.cfg, moe.params
  divisible = {}
  for _, ins, outs in model.projection_shapes(params):
    key = (math.prod(ins), math.prod(outs))
    divisible[key] = divisible.get(key, True) and outs[-1] % cpu_matmul.PANEL == 0
  laid = model.unstack_layers(params, split_experts=True, projection_layout=lambda name, i, o:
                              model.PANELS if divisible[i, o] else 1)
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
    model.unstack_layers(narrow, projection_layout=lambda name, i, o: model.PANELS)


@pytest.mark.skipif(not cpu_matmul.available(), reason="the panel matmul did not build here")
def test_panel_kernel_up_to_max_rows_and_xla_beyond():
  from c2jax.model import layers
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
  from c2jax.model import layers
  params = Model(tiny_cfg(num_layers=2)).params
  with pytest.raises(ValueError,
                     match=r"projection_layout\('kv_a_proj', ...\) gave 'sideways'"):
    model.unstack_layers(params, projection_layout=lambda name, i, o: "sideways")
  with pytest.raises(ValueError, match="1 to 4"):
    layers.split_columns(jnp.ones((2, 4)), 5)
  cfg = tiny_cfg()
  linear = layers.Linear((4,), (6,), ("embed", "mlp"), cfg)
  with pytest.raises(ValueError, match=r"kernel_t: a transposed kernel needs shape \(6, 4\)"):
    linear.apply({"params": {"kernel_t": jnp.ones((4, 6))}}, jnp.ones((1, 4)))
  with pytest.raises(ValueError, match="widths summing to 6"):
    linear.apply({"params": {"kernel": (jnp.ones((4, 2)), jnp.ones((4, 3)))}},
                 jnp.ones((1, 4)))
  pieces = layers.split_columns(jnp.arange(20.0).reshape(2, 10), 3)
  assert [p.shape[-1] for p in pieces] == [4, 3, 3]
  np.testing.assert_array_equal(layers.join_columns(pieces), jnp.arange(20.0).reshape(2, 10))


def test_fused_expert_errors_name_the_weight(small_moe):
  cfg, params = small_moe.cfg, small_moe.params
  fused = model.unstack_layers(params, fuse_experts=True)
  experts = fused["moe_layers"]["0"]["moe"]["experts"]
  tokens = jnp.ones((1, 3), jnp.int32)
  experts[moe_dispatch.FUSED_GATE_UP] = experts[moe_dispatch.FUSED_GATE_UP][..., :-1]
  with pytest.raises(ValueError, match="gate_up_proj: fused weights need shape"):
    model.forward(cfg, fused, tokens)
  quantised = tiny_cfg(num_layers=4, quant="mxfp8")
  with pytest.raises(ValueError, match="run unquantised"):
    model.forward(quantised, model.unstack_layers(params, fuse_experts=True), tokens)
