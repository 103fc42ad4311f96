"""Attention modules: masking, GQA head grouping, MLA absorbed == expanded, cache writes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model import attention, attention_forms, init_cache
from c2jax.model import rope as rope_lib
from tests.model.conftest import ATTENTION_CASES, draw_params, tiny_cfg

B, L = 2, 12


def _build(name):
  """(cfg, params, jitted apply) for one attention layer."""
  cfg = tiny_cfg(**ATTENTION_CASES[name])
  module = attention.ATTENTION[cfg.attention](cfg)
  x = jnp.zeros((B, L, cfg.hidden_size))
  positions = jnp.broadcast_to(jnp.arange(L), (B, L))
  shapes = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.key(0), x, positions)))
  params = draw_params(shapes["params"], cfg.init_std)
  run = jax.jit(lambda p, x, pos, seg=None, cache=None: module.apply(
      {"params": p}, x, pos, seg, cache))
  return cfg, params, run


@pytest.fixture(scope="module")
def layers_by_name():
  return {name: _build(name) for name in sorted(ATTENTION_CASES)}


@pytest.fixture(params=sorted(ATTENTION_CASES))
def layer(request, layers_by_name):
  return layers_by_name[request.param]


def _inputs(cfg, seed=1, length=L):
  x = jax.random.normal(jax.random.key(seed), (B, length, cfg.hidden_size))
  return x, jnp.broadcast_to(jnp.arange(length), (B, length))


def test_causal_future_tokens_do_not_change_the_past(layer):
  cfg, params, run = layer
  x, positions = _inputs(cfg)
  y, _ = run(params, x, positions)
  x_changed = x.at[:, 7:].set(jax.random.normal(jax.random.key(9), x[:, 7:].shape))
  y_changed, _ = run(params, x_changed, positions)
  np.testing.assert_allclose(y[:, :7], y_changed[:, :7], atol=1e-6)
  assert not np.allclose(y[:, 7:], y_changed[:, 7:], atol=1e-3)


def test_segments_attend_only_within_their_document(layer):
  cfg, params, run = layer
  x, _ = _inputs(cfg)
  split = L // 2  # two documents of equal length (one compile for both), positions restart
  segments = jnp.broadcast_to(jnp.array([1] * split + [2] * (L - split)), (B, L))
  positions = jnp.broadcast_to(jnp.concatenate([jnp.arange(split), jnp.arange(L - split)]),
                               (B, L))
  packed, _ = run(params, x, positions, segments)
  alone = jax.jit(lambda p, x, pos: run(p, x, pos)[0])
  first = alone(params, x[:, :split], positions[:, :split])
  second = alone(params, x[:, split:], positions[:, split:])
  np.testing.assert_allclose(packed[:, :split], first, atol=1e-5)
  np.testing.assert_allclose(packed[:, split:], second, atol=1e-5)


def test_gqa_matches_repeated_kv_reference(layers_by_name):
  """Query head h reads kv head h // (H / K), as HF's repeat_kv."""
  cfg, params, run = layers_by_name["gqa"]
  h, k, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  x, positions = _inputs(cfg)
  y, _ = run(params, x, positions)

  @jax.jit
  def reference(params, x):
    norm = lambda v, s: v / jnp.sqrt(jnp.mean(v * v, -1, keepdims=True) + cfg.rms_norm_eps) * s
    q = norm(jnp.einsum("bld,dhe->blhe", x, params["q_proj"]["kernel"]),
             params["q_norm"]["scale"])
    kk = norm(jnp.einsum("bld,dke->blke", x, params["k_proj"]["kernel"]),
              params["k_norm"]["scale"])
    v = jnp.einsum("bld,dke->blke", x, params["v_proj"]["kernel"])
    r = rope_lib.Rope(cfg.rope, e)
    q, kk = r(q, positions), r(kk, positions)
    kk, v = jnp.repeat(kk, h // k, axis=2), jnp.repeat(v, h // k, axis=2)
    scores = jnp.einsum("blhe,bthe->bhlt", q, kk) / np.sqrt(e)
    scores = jnp.where(jnp.tril(jnp.ones((L, L), bool)), scores, -jnp.inf)
    out = jnp.einsum("bhlt,bthe->blhe", jax.nn.softmax(scores, -1), v)
    return jnp.einsum("blhe,hed->bld", out, params["o_proj"]["kernel"])

  np.testing.assert_allclose(y, reference(params, x), atol=1e-5)


def test_prefill_through_cache_matches_training_path(layer):
  """With a cache, MLA runs the absorbed-weight formulation over the latent cache."""
  cfg, params, run = layer
  x, positions = _inputs(cfg)
  expected, no_cache = run(params, x, positions)
  assert no_cache is None
  stacked = init_cache(cfg, B, 16)["dense_layers"]
  cache = jax.tree.map(lambda c: c[0], stacked)
  y, new_cache = run(params, x, positions, None, cache)
  np.testing.assert_allclose(y, expected, atol=1e-5)
  assert jax.tree.map(jnp.shape, new_cache) == jax.tree.map(jnp.shape, cache)
  filled = jax.tree.leaves(new_cache)[0]
  assert np.abs(np.asarray(filled[:, :L])).sum() > 0
  assert np.all(np.asarray(filled[:, L:]) == 0)  # slots past the prompt stay untouched


# The one-token GQA form each step_layer case must trace (its thresholds patched).
GQA_STEP_FORMS = {"as_chosen": "gqa_blocks", "gqa_streaming": "gqa_step",
                  "gqa_dots": "gqa_dots"}


@pytest.fixture(name="step_layer", params=sorted(GQA_STEP_FORMS))
def _step_layer(request, layer, monkeypatch):
  """`layer` as chosen (GQA's B = 2 rows over a tiny cache: attention_forms.gqa_blocks),
  and GQA twice more: every one-token step streaming the cache (gqa_step, which these
  tiny caches are below the size of), and as two einsums (gqa_dots, the batch-1 form)."""
  if request.param != "as_chosen" and layer[0].attention != "gqa":
    pytest.skip("GQA's decode form")
  if layer[0].attention == "gqa":
    request.node.gqa_step_form = GQA_STEP_FORMS[request.param]
  if request.param == "as_chosen":
    return layer
  if request.param == "gqa_streaming":
    monkeypatch.setattr(attention_forms, "STREAM_MIN_CACHE", 0)
  else:
    monkeypatch.setattr(attention_forms, "BLOCKS_MIN_ROWS", B + 1)
  return _build("gqa")  # traced afresh under the patched threshold


def test_one_token_steps_through_cache_match_training_path(step_layer, monkeypatch,
                                                            request):
  """Decode steps (one token a row: GQA's dots, block-masked dots or streaming
  `gqa_step`, MLA's absorbed dots) give the training path's outputs, rows at different
  positions included."""
  cfg, params, run = step_layer
  if cfg.attention == "gqa":  # the form each step takes, recorded as it is traced
    forms_used = []
    for form in GQA_STEP_FORMS.values():
      real = getattr(attention_forms, form)
      monkeypatch.setattr(attention_forms, form, lambda *a, real=real, form=form: (
          forms_used.append((form, a[0].shape[1])), real(*a))[1])
  x, positions = _inputs(cfg)
  expected, _ = run(params, x, positions)
  cache = jax.tree.map(lambda c: c[0], init_cache(cfg, B, 16)["dense_layers"])
  _, cache = run(params, x[:, :L - 3], positions[:, :L - 3], None, cache)
  for i in range(L - 3, L):
    y, cache = run(params, x[:, i:i + 1], positions[:, i:i + 1], None, cache)
    np.testing.assert_allclose(y, expected[:, i:i + 1], atol=1e-5)
  # Row 1 rewinds two tokens: it must see only its slots up to its own position, not the
  # entries above it that the steps before wrote.
  step = x[:, L - 2:L - 1]
  staggered, _ = run(params, step, jnp.array([[L - 2], [L - 4]]), None, cache)
  rewound = jnp.concatenate([x[1:, :L - 4], step[1:]], axis=1)
  row1, _ = run(params, rewound, positions[1:, :L - 3])
  np.testing.assert_allclose(staggered[0], expected[0, L - 2:L - 1], atol=1e-5)
  np.testing.assert_allclose(staggered[1], row1[0, -1:], atol=1e-5)
  if cfg.attention == "gqa":
    steps = {form for form, length in forms_used if length == 1}
    assert steps == {request.node.gqa_step_form}


@pytest.mark.parametrize("impl", ["dense", "blockwise"])
def test_mla_long_prefill_chunks_attend_expanded_and_agree(impl):
  """A long chunk up-projects the latent cache and attends per head (dense or blockwise
  tiles); a short one stays absorbed. Chunk after chunk, both give the training path."""
  cfg = tiny_cfg(**ATTENTION_CASES["mla"], attention_impl=impl, attention_block=16)
  n, v, c = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
  expands = attention_forms.prefill_expands
  assert expands(40, n, v, c) and not expands(8, n, v, c)
  module = attention.ATTENTION[cfg.attention](cfg)
  x, positions = _inputs(cfg, length=48)
  shapes = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.key(0), x, positions)))
  params = draw_params(shapes["params"], cfg.init_std)
  run = jax.jit(lambda x, pos, cache=None: module.apply({"params": params}, x, pos, None,
                                                         cache))
  expected, _ = run(x, positions)
  cache = jax.tree.map(lambda leaf: leaf[0], init_cache(cfg, B, 64)["dense_layers"])
  short, cache = run(x[:, :8], positions[:, :8], cache)  # absorbed
  long, cache = run(x[:, 8:], positions[:, 8:], cache)   # expanded, reading the first chunk
  np.testing.assert_allclose(short, expected[:, :8], atol=1e-5)
  np.testing.assert_allclose(long, expected[:, 8:], atol=1e-5)


def test_mla_cache_holds_only_the_latent():
  cfg = tiny_cfg(**ATTENTION_CASES["mla"])
  cache = init_cache(cfg, batch=3, max_length=20)
  assert jax.tree.map(jnp.shape, cache) == {
      "dense_layers": {"c_kv": (1, 3, 20, cfg.kv_lora_rank),
                       "k_rope": (1, 3, 20, cfg.qk_rope_head_dim)},
      "moe_layers": {"c_kv": (2, 3, 20, cfg.kv_lora_rank),
                     "k_rope": (2, 3, 20, cfg.qk_rope_head_dim)}}


def test_write_cache_places_rows_at_their_positions_and_drops_overflow():
  cache = jnp.zeros((2, 4, 1))
  new = jnp.array([[[1.0], [2.0]], [[3.0], [4.0]]])
  positions = jnp.array([[0, 1], [3, 4]])  # row 1's second entry is past the end
  out = attention.write_cache(cache, new, positions)
  np.testing.assert_array_equal(out[..., 0], [[1, 2, 0, 0], [0, 0, 0, 3]])


def test_segment_ids_with_cache_is_an_error(layer):
  cfg, params, run = layer
  x, positions = _inputs(cfg)
  cache = jax.tree.map(lambda c: c[0], init_cache(cfg, B, 16)["dense_layers"])
  with pytest.raises(ValueError, match="segment_ids"):
    run(params, x, positions, jnp.ones((B, L), jnp.int32), cache)


@pytest.mark.parametrize("shape", [(3, 1, 4, 2, 8, 10), (2, 3, 2, 3, 4, 7)])
def test_gqa_blocks_equals_gqa_dots(shape):
  """The block-masked form (every query head scores every kv head's slots, the other
  heads masked out) is GQA: per-row masks, several kv heads and groups, one query token
  and several."""
  b, l, k, g, e, t = shape
  keys = jax.random.split(jax.random.key(3), 3)
  q = jax.random.normal(keys[0], (b, l, k, g, e))
  cache_k, cache_v = (jax.random.normal(key, (b, t, k, e)) for key in keys[1:])
  last_BxL = np.array([[3], [t], [5]])[:b] + np.arange(l)[None, :]  # visible slots
  mask = jnp.asarray(np.arange(t)[None, None, :] < last_BxL[:, :, None])[:, None]
  expected = attention_forms.gqa_dots(q, cache_k, cache_v, mask, jnp.float32)
  got = attention_forms.gqa_blocks(q, cache_k, cache_v, mask, jnp.float32)
  np.testing.assert_allclose(got, expected, atol=1e-5)
  head0 = attention_forms.gqa_blocks(q, cache_k.at[:, :, 1:].set(0), cache_v, mask,
                                     jnp.float32)[:, :, 0]
  np.testing.assert_allclose(head0, expected[:, :, 0], atol=1e-5)  # reads only its head
