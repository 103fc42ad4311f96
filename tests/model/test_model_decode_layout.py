"""The decode layout (model.unstack_layers: one array per layer and per routed expert, or
a layer's experts fused, the layers as a Python loop) against model.init's stacked tree,
the 'per_expert' and 'all_experts' MoE dispatches it runs against the sorted 'ragged'
one, and the registry of kernel forms a Linear multiplies by (the CPU decode layout's
forms are tested in tests/rollout/test_cpu_decode_forms.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import model
from c2jax.model import layers, moe_dispatch, projections
from tests.model.conftest import Model, tiny_cfg

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
@pytest.mark.slow
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


def _negated_form():
  """A kernel form for the tests: the kernel negated."""
  return projections.KernelForm(
      product=lambda x, stored, i, o, dtype, out_dtype: projections.plain_product(
          x, -stored, i, o, dtype, out_dtype),
      problem=lambda stored, i, o: (None if stored.shape == (*i, *o)
                                    else f"want {(*i, *o)}, got {stored.shape}"),
      join=lambda stored, n_in: -stored)


def test_linear_takes_registered_kernel_forms_and_names_others(small_moe, monkeypatch):
  """A Linear multiplies by a kernel form registered with model.projections (the model
  knows none but its own 'kernel'), store_projections and stack_layers store and join
  it, and a param name nobody registered is an error naming it and the registered ones."""
  monkeypatch.setitem(projections.FORMS, "kernel_neg", _negated_form())
  cfg, params = small_moe.cfg, small_moe.params
  laid = model.store_projections(model.unstack_layers(params),
                                 lambda name, kernel, n_in: {"kernel_neg": -kernel})
  assert "kernel_neg" in laid["moe_layers"]["1"]["attn"]["o_proj"]
  assert "kernel_neg" in laid["lm_head"]
  tokens = jnp.asarray([[3, 17, 5, 9]], jnp.int32)
  np.testing.assert_allclose(model.forward(cfg, laid, tokens), model.forward(cfg, params, tokens),
                             rtol=1e-5, atol=1e-5)
  jax.tree.map(np.testing.assert_array_equal, model.stack_layers(laid), params)
  with pytest.raises(ValueError, match="unstack them first"):
    model.store_projections(params, lambda name, kernel, n_in: {"kernel": kernel})
  linear = layers.Linear((4,), (6,), ("embed", "mlp"), cfg)
  with pytest.raises(ValueError, match=r"/kernel_neg: want \(4, 6\), got \(6, 4\)"):
    linear.apply({"params": {"kernel_neg": jnp.ones((6, 4))}}, jnp.ones((1, 4)))
  with pytest.raises(ValueError, match=r"hold \['kernel_x'\].*registered kernel forms "
                     r"\[.*'kernel', 'kernel_neg'"):
    linear.apply({"params": {"kernel_x": jnp.ones((4, 6))}}, jnp.ones((1, 4)))
  with pytest.raises(ValueError, match="registered already"):
    projections.register("kernel_neg", projections.FORMS[projections.PLAIN])


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
