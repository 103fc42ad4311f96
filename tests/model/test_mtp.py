"""MTP modules: the recurrence and shift conventions, the cached single-depth path used
for drafting, and the self-distillation loss (values, masking, gradients, frozen trunk)."""

import functools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import model
from c2jax.model import mtp
from tests.model.conftest import MLA_OVERRIDES, draw_params, random_params, tiny_cfg
from tests.subprocess_checks import child_env

LENGTH = 10
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup():
  cfg = tiny_cfg(vocab_size=32, num_layers=2, num_mtp_layers=2, **MLA_OVERRIDES)
  params = random_params(cfg)
  shapes = jax.eval_shape(lambda: mtp.init(cfg, jax.random.key(0)))
  params[mtp.PARAMS_KEY] = draw_params(shapes, cfg.init_std, seed=3)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, LENGTH)), jnp.int32)
  return cfg, params, tokens


def test_init_shapes_and_validation(setup):
  cfg, params, _ = setup
  layers = params[mtp.PARAMS_KEY]
  d = cfg.hidden_size
  assert layers["eh_proj"]["kernel"].shape == (2, 2 * d, d)
  assert layers["enorm"]["scale"].shape == layers["final_norm"]["scale"].shape == (2, d)
  assert "moe" in layers["block"]  # the extra layer is past first_k_dense: an MoE block
  with pytest.raises(ValueError, match="num_mtp_layers"):
    mtp.init(tiny_cfg(), jax.random.key(0))


def test_forward_with_hidden_is_the_final_norm_output(setup):
  cfg, params, tokens = setup
  logits, _, _, hidden = mtp.forward_with_hidden(cfg, params, tokens)
  np.testing.assert_allclose(logits, model.forward(cfg, params, tokens), atol=1e-5)
  np.testing.assert_allclose(hidden @ params["lm_head"]["kernel"], logits, atol=1e-4)


def test_depths_chain_and_cached_layer_matches(setup):
  """Depth 1 consumes depth 0's hidden; the cached single-depth path equals apply."""
  cfg, params, tokens = setup
  _, _, _, hidden = mtp.forward_with_hidden(cfg, params, tokens)
  logits, _ = mtp.apply(cfg, params, hidden, tokens)
  assert logits.shape == (2, 2, LENGTH, 32)
  positions = jnp.broadcast_to(jnp.arange(LENGTH), (2, LENGTH))
  cache = mtp.init_layer_cache(cfg, 2, 16)
  h0, logits0, cache = mtp.apply_layer(cfg, params, 0, hidden, jnp.roll(tokens, -1, 1).at[
      :, -1].set(0), positions, cache)
  np.testing.assert_allclose(logits0, logits[0], atol=1e-4)
  h1, logits1, _ = mtp.apply_layer(cfg, params, 1, h0, jnp.pad(tokens[:, 2:], ((0, 0), (0, 2))),
                                   positions, mtp.init_layer_cache(cfg, 2, 16))
  np.testing.assert_allclose(logits1, logits[1], atol=1e-4)
  # Decoding the last position alone against the cache written above gives the same.
  _, last, _ = mtp.apply_layer(cfg, params, 0, hidden[:, -3:-2], tokens[:, -2:-1],
                               positions[:, -3:-2], cache)
  np.testing.assert_allclose(last[:, 0], logits[0][:, -3], atol=1e-4)


def _loss(cfg, params, tokens, segments, **kw):
  logits, _, _, hidden = mtp.forward_with_hidden(cfg, params, tokens,
                                                 segment_ids_BxL=segments)
  targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
  # The last target is padding here (a real batch has it): masked out.
  mask = jnp.ones_like(tokens).at[:, -1].set(0)
  return mtp.loss(cfg, params, tokens, hidden, logits, targets_BxL=targets,
                  segment_ids_BxL=segments, loss_mask_BxL=mask, **kw)


def test_loss_is_kl_to_the_main_head(setup):
  cfg, params, tokens = setup
  segments = jnp.ones_like(tokens)
  value, metrics, _ = _loss(cfg, params, tokens, segments, kl_weight=0.5, ce_weight=0.25)
  # Reference for depth 0 by hand: position i vs main position i + 1; the masked last
  # target leaves i < L - 2, where the label t_{i+2} exists.
  logits, _, _, hidden = mtp.forward_with_hidden(cfg, params, tokens)
  student = jax.nn.log_softmax(mtp.apply(cfg, params, hidden, tokens)[0][0][:, :-2], -1)
  teacher = jax.nn.log_softmax(logits[:, 1:-1], -1)
  kl = np.mean(np.sum(np.exp(teacher) * (teacher - student), -1))
  np.testing.assert_allclose(metrics["mtp0/kl"], kl, rtol=1e-5)
  ce = -np.mean(np.take_along_axis(np.asarray(student), np.asarray(tokens)[:, 2:, None], -1))
  np.testing.assert_allclose(metrics["mtp0/ce"], ce, rtol=1e-5)
  assert kl > 0.01
  depth_losses = [0.5 * metrics[f"mtp{k}/kl"] + 0.25 * metrics[f"mtp{k}/ce"] for k in (0, 1)]
  np.testing.assert_allclose(value, np.mean(depth_losses), rtol=1e-6)
  # ... and a document boundary removes the pairs that straddle it.
  split = segments.at[:, LENGTH // 2:].set(2)
  _, split_metrics, _ = _loss(cfg, params, tokens, split, kl_weight=1.0)
  assert not np.isclose(split_metrics["mtp0/kl"], metrics["mtp0/kl"])


def test_frozen_trunk_gets_no_gradient(setup):
  """Gradients of the MTP loss reach the main hidden state, embedding and head only when
  trained jointly; the MTP layers train either way."""
  cfg, params, tokens = setup
  logits, _, _, hidden = mtp.forward_with_hidden(cfg, params, tokens)

  @functools.partial(jax.jit, static_argnums=0)
  def grads(frozen, params, hidden):
    def fn(p, h):
      return mtp.loss(cfg, p, tokens, h, logits, kl_weight=1.0, frozen_trunk=frozen)[0]
    return jax.grad(fn, argnums=(0, 1))(params, hidden)

  for frozen in (True, False):
    param_grads, hidden_grad = grads(frozen, params, hidden)
    for key in ("embed", "lm_head"):
      nonzero = any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(param_grads[key]))
      assert nonzero != frozen, key
    assert np.any(np.asarray(hidden_grad) != 0) != frozen
    assert all(np.any(np.asarray(g) != 0)
               for g in jax.tree.leaves(param_grads[mtp.PARAMS_KEY]["eh_proj"]))


@pytest.mark.slow
def test_vocab_chunked_loss_matches_the_full_logits(setup):
  """The chunked loss (teacher recomputed from the shifted hidden state, no [B, L, V]
  array; 5 columns per chunk, which does not divide V = 32) gives the plain computation's
  loss, metrics and gradients (trunk, embedding, head, MTP layers and the hidden state),
  with a document boundary and a masked target. A frozen trunk is the same stop-gradients
  before either path (test_frozen_trunk_gets_no_gradient)."""
  cfg, params, tokens = setup
  segments = jnp.ones_like(tokens).at[1, LENGTH // 2:].set(2)
  targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
  mask = jnp.ones_like(tokens).at[:, -1].set(0)

  @functools.partial(jax.jit, static_argnums=0)
  def value_and_grads(chunk, params):
    def fn(p, h):
      logits, _, _, hidden = mtp.forward_with_hidden(cfg, p, tokens, segment_ids_BxL=segments)
      total, metrics, _ = mtp.loss(
          cfg, p, tokens, hidden * h, None if chunk else logits, targets_BxL=targets,
          segment_ids_BxL=segments, loss_mask_BxL=mask, kl_weight=0.7, ce_weight=0.3,
          vocab_chunk=chunk)
      return total, metrics
    return jax.value_and_grad(fn, argnums=(0, 1), has_aux=True)(params, jnp.float32(1.0))

  (value, metrics), grads = value_and_grads(5, params)
  (value_ref, metrics_ref), grads_ref = value_and_grads(0, params)
  np.testing.assert_allclose(value, value_ref, rtol=1e-5)
  assert set(metrics) == set(metrics_ref) == {f"mtp{k}/{m}" for k in (0, 1)
                                              for m in ("kl", "ce", "agree")}
  for key in metrics:
    np.testing.assert_allclose(metrics[key], metrics_ref[key], rtol=1e-5, atol=1e-6)
  assert float(metrics["mtp0/kl"]) > 0.01
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  with pytest.raises(ValueError, match="vocab_chunk"):
    mtp.loss(cfg, params, tokens, jnp.zeros((2, LENGTH, cfg.hidden_size)), None)


def test_model_init_includes_mtp_with_axes_and_mask():
  cfg = tiny_cfg(vocab_size=32, num_layers=2, num_mtp_layers=2, **MLA_OVERRIDES)
  shapes = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  alone = jax.eval_shape(lambda: mtp.init(cfg, jax.random.key(0)))
  assert jax.tree.map(lambda s: s.shape, shapes[mtp.PARAMS_KEY]) == jax.tree.map(
      lambda s: s.shape, alone)
  without = jax.eval_shape(lambda: model.init(tiny_cfg(vocab_size=32, num_layers=2),
                                              jax.random.key(0)))
  assert set(shapes) - set(without) == {mtp.PARAMS_KEY}
  # Every parameter, the MTP ones included, has one logical axis name per dimension.
  axes = model.param_axes(cfg)
  is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)
  assert jax.tree.structure(axes, is_leaf=is_spec) == jax.tree.structure(shapes)
  for spec, leaf in zip(jax.tree.leaves(axes, is_leaf=is_spec), jax.tree.leaves(shapes)):
    assert len(spec) == leaf.ndim
  layers_axes = axes[mtp.PARAMS_KEY]
  assert layers_axes["eh_proj"]["kernel"] == jax.sharding.PartitionSpec(
      "layers", None, "embed")
  assert layers_axes["block"]["moe"]["experts"]["up_proj"][:2] == ("layers", "expert")
  mask = model.trainable_mask(shapes)[mtp.PARAMS_KEY]
  assert mask["eh_proj"]["kernel"] and mask["block"]["attn_norm"]["scale"]
  assert not mask["block"]["moe"]["router"]["correction_bias"]


def test_counts_report_mtp_apart_from_the_main_model():
  from c2jax.model import counting, variants
  base = tiny_cfg(vocab_size=32, num_layers=2, **MLA_OVERRIDES)
  with_mtp = tiny_cfg(vocab_size=32, num_layers=2, num_mtp_layers=2, **MLA_OVERRIDES)
  plain, counted = counting.count_params(base), counting.count_params(with_mtp)
  assert plain["mtp_params"] == 0
  assert (counted["total_params"], counted["active_params"]) == (
      plain["total_params"], plain["active_params"])
  shapes = jax.eval_shape(lambda: mtp.init(with_mtp, jax.random.key(0)))
  assert counted["mtp_params"] == sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes))
  # DeepSeek-V3 (one MTP depth): ~11.6B of its own beside the 671B main model (the
  # reported 14B adds the depth's copies of the 0.93B embedding and head).
  ds = counting.count_params(variants.get("deepseek_v3"))
  assert 11e9 < ds["mtp_params"] < 12e9
  assert ds["total_params"] == pytest.approx(671e9, rel=0.01)


_EMBED_SHARDING_CHILD = """
import json
import flax.linen as nn, jax, jax.numpy as jnp
from c2jax import parallel
from c2jax.model import mtp
from tests.model.conftest import MLA_OVERRIDES, random_params, tiny_cfg
cfg = tiny_cfg(vocab_size=32, num_layers=2, num_mtp_layers=2, **MLA_OVERRIDES)
params = random_params(cfg)
par = parallel.default_parallel_config()
par.mesh.update({"data": 1, "fsdp": 2, "expert": 1, "context": 2, "tensor": 1})
mesh = parallel.make_mesh(par.mesh)
with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.rules_of(par)):
  embed = jax.jit(lambda p, t: mtp._embed(cfg, p, t))
  compiled = embed.lower(params, jnp.zeros((2, 4, 8), jnp.int32)).compile()
print(json.dumps({"spec": [list(e) if isinstance(e, tuple) else e
                           for e in compiled.output_shardings.spec]}))
"""


def test_mtp_token_embeddings_are_split_like_the_main_models():
  """The next-token embeddings [Dm, B, L, D] are split over the batch and length axes
  (fsdp, context), as the main model's: left to the partitioner, DeepSeek-V3's were
  gathered whole on every device (docs/scaling.md)."""
  result = subprocess.run([sys.executable, "-c", _EMBED_SHARDING_CHILD], capture_output=True,
                          text=True, timeout=300, cwd=str(REPO_ROOT), env=child_env(
                              XLA_FLAGS="--xla_force_host_platform_device_count=4"))
  assert result.returncode == 0, result.stderr[-3000:]
  spec = json.loads(result.stdout.strip().splitlines()[-1])["spec"]
  assert spec[1] in ("fsdp", ["fsdp"]) and spec[2] in ("context", ["context"]), spec
