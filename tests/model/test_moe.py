"""The MoE layer: parameter layout, a per-token numpy reference, dense vs ragged dispatch,
router replay, correction bias, aux loss, and HF's own modules when torch is available."""

import functools
import json
import subprocess

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model import moe, moe_routing, variants
from tests import torch_reference

B, L, D = 2, 8, 16

# Loud settings (init_std 0.5) make routing decisive, so no near-tie can flip the choice.
SIGMOID = dict(router="sigmoid_bias", num_experts=8, num_experts_per_tok=3, n_group=4,
               topk_group=2, num_shared_experts=2, intermediate_size=8,
               norm_topk_prob=True, routed_scaling_factor=2.5)
SOFTMAX = dict(router="softmax", num_experts=8, num_experts_per_tok=3, n_group=1,
               topk_group=1, num_shared_experts=0, intermediate_size=8,
               norm_topk_prob=False, routed_scaling_factor=1.0)
ROUTER_CASES = {"sigmoid": SIGMOID, "softmax": SOFTMAX}


def make_cfg(moe_fields, impl="dense", **top):
  return variants.get("tiny", hidden_size=D, init_std=0.5, moe_impl=impl,
                      moe=dict(moe_fields), **top)


def init_params(cfg, seed=0):
  """Random float32 params of the MoE's shapes, drawn with numpy (a jitted flax init costs
  many seconds of CPU compile); the correction bias is large enough to change choices."""
  x = jax.ShapeDtypeStruct((B, L, D), jnp.float32)
  shapes = nn.unbox(jax.eval_shape(lambda x: moe.MoE(cfg).init(jax.random.key(0), x), x))
  rng = np.random.default_rng(seed)
  params = jax.tree.map(
      lambda s: jnp.asarray(cfg.init_std * rng.standard_normal(s.shape), jnp.float32),
      shapes["params"])
  if "correction_bias" in params["router"]:
    params["router"]["correction_bias"] = jnp.asarray(
        0.3 * rng.standard_normal(cfg.moe.num_experts), jnp.float32)
  return params


def make_apply(cfg):
  return jax.jit(lambda p, x, routing=None, valid=None: moe.MoE(cfg).apply(
      {"params": p}, x, routing, valid))


X = jax.random.normal(jax.random.key(42), (B, L, D))
COTANGENT = jax.random.normal(jax.random.key(7), (B, L, D))


def make_grad(apply):
  """Gradient of <y, COTANGENT> w.r.t. (params, x), with optional replayed routing."""
  loss = lambda p, x, routing: jnp.sum(apply(p, x, routing)[0] * COTANGENT)
  return jax.jit(jax.grad(loss, argnums=(0, 1)))


@functools.cache
def build_case(name):
  """One config per router kind, its params, and jitted dense/ragged forwards + grads
  (built once per test session: CPU compiles are the cost here)."""
  fields = ROUTER_CASES[name]
  cfg = make_cfg(fields)
  dense, ragged = make_apply(cfg), make_apply(make_cfg(fields, "ragged"))
  return dict(name=name, cfg=cfg, params=init_params(cfg), dense=dense, ragged=ragged,
              dense_grad=make_grad(dense), ragged_grad=make_grad(ragged))


@pytest.fixture(params=list(ROUTER_CASES))
def case(request):
  return build_case(request.param)


def numpy_reference(cfg, params, x, indices):
  """y_t = shared(x_t) + sum_k w_k expert_{i_k}(x_t), one token at a time in float64."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64).reshape(-1, D)
  indices = np.asarray(indices).reshape(x.shape[0], -1)
  silu = lambda v: v / (1 + np.exp(-v))
  logits = x @ p["router"]["kernel"]
  if cfg.moe.router == "softmax":
    scores = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  else:
    scores = 1 / (1 + np.exp(-logits))
  y = np.zeros_like(x)
  ex = p["experts"]
  for t in range(x.shape[0]):
    w = scores[t, indices[t]]
    if cfg.moe.norm_topk_prob:
      w = w / w.sum()
    w = w * cfg.moe.routed_scaling_factor
    for weight, e in zip(w, indices[t]):
      h = silu(x[t] @ ex["gate_proj"][e]) * (x[t] @ ex["up_proj"][e])
      y[t] += weight * (h @ ex["down_proj"][e])
    if cfg.moe.num_shared_experts:
      sh = p["shared"]
      h = silu(x[t] @ sh["gate_proj"]["kernel"]) * (x[t] @ sh["up_proj"]["kernel"])
      y[t] += h @ sh["down_proj"]["kernel"]
  return y.reshape(B, L, D)


def test_parameter_layout_matches_contract():
  boxed = jax.eval_shape(lambda: moe.MoE(make_cfg(SIGMOID, param_dtype="bfloat16")).init(
      jax.random.key(0), jnp.zeros((B, L, D))))["params"]
  e, f = SIGMOID["num_experts"], SIGMOID["intermediate_size"]
  expected = {
      ("router", "kernel"): ((D, e), ("embed", "expert")),
      ("router", "correction_bias"): ((e,), ("expert",)),
      ("experts", "gate_proj"): ((e, D, f), ("expert", "embed", "expert_mlp")),
      ("experts", "up_proj"): ((e, D, f), ("expert", "embed", "expert_mlp")),
      ("experts", "down_proj"): ((e, f, D), ("expert", "expert_mlp", "embed")),
      # Two shared experts are one MLP of width 2 * Fe, as HF builds them.
      ("shared", "gate_proj", "kernel"): ((D, 2 * f), ("embed", "mlp")),
      ("shared", "up_proj", "kernel"): ((D, 2 * f), ("embed", "mlp")),
      ("shared", "down_proj", "kernel"): ((2 * f, D), ("mlp", "embed")),
  }
  flat = {tuple(k.key for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(
      boxed, is_leaf=lambda v: isinstance(v, nn.LogicallyPartitioned))}
  assert {k: (v.value.shape, v.names) for k, v in flat.items()} == expected
  assert flat[("router", "correction_bias")].value.dtype == jnp.float32
  assert flat[("router", "kernel")].value.dtype == jnp.bfloat16

  qwen_like = jax.eval_shape(lambda: moe.MoE(make_cfg(SOFTMAX)).init(
      jax.random.key(0), jnp.zeros((B, L, D))))["params"]
  assert set(qwen_like) == {"router", "experts"} and set(qwen_like["router"]) == {"kernel"}


@pytest.mark.parametrize("impl", ["dense", "ragged"])
def test_matches_per_token_reference(case, impl):
  y, stats = case[impl](case["params"], X)
  want = numpy_reference(case["cfg"], case["params"], X, stats["expert_indices"])
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
  assert stats["expert_indices"].dtype == jnp.int32
  assert stats["expert_indices"].shape == (B, L, case["cfg"].moe.num_experts_per_tok)
  moe_cfg = case["cfg"].moe
  loads = np.bincount(np.asarray(stats["expert_indices"]).ravel(), minlength=moe_cfg.num_experts)
  np.testing.assert_array_equal(stats["expert_loads"], loads)
  # The router's choice is the one moe_routing computes from the same logits and bias.
  logits = X.reshape(-1, D) @ case["params"]["router"]["kernel"]
  bias = case["params"]["router"].get("correction_bias")
  chosen = moe_routing.route(logits, bias, moe_cfg).indices_TxK
  np.testing.assert_array_equal(stats["expert_indices"].reshape(chosen.shape), chosen)


def test_ragged_matches_dense_forward_and_gradients(case):
  y_dense, _ = case["dense"](case["params"], X)
  y_ragged, _ = case["ragged"](case["params"], X)
  np.testing.assert_allclose(y_ragged, y_dense, atol=1e-5, rtol=0)
  g_dense = case["dense_grad"](case["params"], X, None)
  g_ragged = case["ragged_grad"](case["params"], X, None)
  for path, dense_leaf in jax.tree_util.tree_leaves_with_path(g_dense):
    ragged_leaf = _at(g_ragged, path)
    scale = max(1.0, float(jnp.abs(dense_leaf).max()))
    np.testing.assert_allclose(ragged_leaf, dense_leaf, atol=1e-5 * scale, rtol=0,
                               err_msg=jax.tree_util.keystr(path))
  assert float(jnp.abs(g_dense[0]["router"]["kernel"]).max()) > 0


def _at(tree, path):
  for key in path:
    tree = tree[getattr(key, "key", getattr(key, "idx", None))]
  return tree


def test_router_replay(case):
  params, apply = case["params"], case["dense"]
  y_own, stats = apply(params, X)
  own = stats["expert_indices"]
  y_replayed, replayed_stats = apply(params, X, own)
  np.testing.assert_array_equal(y_replayed, y_own)
  np.testing.assert_array_equal(replayed_stats["expert_loads"], stats["expert_loads"])

  other = (own + 1) % case["cfg"].moe.num_experts  # still distinct experts per token
  y_other, other_stats = apply(params, X, other)
  np.testing.assert_array_equal(other_stats["expert_indices"], other)
  assert float(jnp.abs(y_other - y_own).max()) > 1e-2
  np.testing.assert_allclose(y_other, numpy_reference(case["cfg"], params, X, other),
                             rtol=1e-4, atol=1e-4)

  grad, _ = case["dense_grad"](params, X, other)
  assert float(jnp.abs(grad["router"]["kernel"]).max()) > 1e-3


def test_padding_is_left_out_of_stats():
  case = build_case("sigmoid")
  valid = jnp.arange(L)[None, :] < jnp.array([[L], [3]])  # sequence 1 has 3 real tokens
  y_all, stats_all = case["dense"](case["params"], X)
  y, stats = case["dense"](case["params"], X, None, valid)
  np.testing.assert_array_equal(y, y_all)  # padding is still computed, just not counted
  kept = np.asarray(stats["expert_indices"])[np.asarray(valid)]
  np.testing.assert_array_equal(stats["expert_loads"], np.bincount(kept.ravel(), minlength=8))
  assert float(stats["expert_loads"].sum()) < float(stats_all["expert_loads"].sum())


def test_replay_shape_is_checked(case):
  with pytest.raises(ValueError, match="router replay"):
    moe.MoE(case["cfg"]).apply({"params": case["params"]}, X, jnp.zeros((B, L, 2), jnp.int32))


def test_correction_bias_selects_but_never_weights():
  case = build_case("sigmoid")
  params = dict(case["params"], router=dict(case["params"]["router"]))
  params["router"]["correction_bias"] = jnp.zeros(8).at[5].set(10.0)
  y, stats = case["dense"](params, X)
  assert bool((stats["expert_indices"] == 5).any(-1).all())  # every token takes expert 5
  # A selection-only bias leaves the gate weights (and so the output) as the unbiased
  # scores of the same experts would give.
  np.testing.assert_allclose(
      y, numpy_reference(case["cfg"], params, X, stats["expert_indices"]), rtol=1e-4,
      atol=1e-4)
  grad, _ = case["dense_grad"](params, X, None)
  np.testing.assert_array_equal(grad["router"]["correction_bias"], 0.0)


def test_aux_loss(case):
  _, stats = case["dense"](case["params"], X)
  assert float(stats["aux_loss"]) == 0.0  # coefficient 0: aux-loss-free balancing only

  fields = dict(ROUTER_CASES[case["name"]], aux_loss_coef=0.01)
  apply = make_apply(make_cfg(fields))
  aux_and_stats = lambda p: (apply(p, X)[1]["aux_loss"], apply(p, X)[1])
  grad, stats = jax.jit(jax.grad(aux_and_stats, has_aux=True))(case["params"])
  params = case["params"]
  logits = np.asarray(X, np.float64) @ np.asarray(params["router"]["kernel"], np.float64)
  scores = (np.exp(logits) if fields["router"] == "softmax" else 1 / (1 + np.exp(-logits)))
  affinity = scores / scores.sum(-1, keepdims=True)
  e, k = fields["num_experts"], fields["num_experts_per_tok"]
  per_sequence = []
  for b in range(B):
    counts = np.bincount(np.asarray(stats["expert_indices"][b]).ravel(), minlength=e)
    per_sequence.append(np.sum(e / (k * L) * counts * affinity[b].mean(0)))
  assert float(stats["aux_loss"]) == pytest.approx(0.01 * np.mean(per_sequence), rel=1e-5)
  assert float(jnp.abs(grad["router"]["kernel"]).max()) > 0


def test_bfloat16_compute_keeps_router_and_bias_in_float32():
  cfg = make_cfg(SIGMOID, impl="ragged", dtype="bfloat16", param_dtype="bfloat16")
  x = jax.ShapeDtypeStruct((B, L, D), jnp.bfloat16)
  variables = jax.eval_shape(lambda x: moe.MoE(cfg).init(jax.random.key(0), x), x)
  params = nn.unbox(variables)["params"]
  assert params["router"]["correction_bias"].dtype == jnp.float32
  assert params["experts"]["gate_proj"].dtype == jnp.bfloat16
  y, stats = jax.eval_shape(make_apply(cfg), params, x)
  assert y.dtype == jnp.bfloat16
  assert stats["expert_loads"].dtype == jnp.float32 and stats["aux_loss"].dtype == jnp.float32


# ---------------------------------------------------------------------------------------
# Live comparison with HF's DeepseekV3MoE / Qwen3MoeSparseMoeBlock in a torch interpreter.

HF_SCRIPT = r"""
import json, sys
import numpy as np, torch
import transformers
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

for stem in sys.argv[1:]:
  spec = json.load(open(stem + ".json"))
  a = {k: torch.from_numpy(v) for k, v in np.load(stem + ".npz").items()}
  common = dict(hidden_size=spec["hidden"], moe_intermediate_size=spec["width"],
                num_experts_per_tok=spec["top_k"], norm_topk_prob=spec["norm_topk_prob"],
                hidden_act="silu")
  if spec["router"] == "sigmoid_bias":
    module = DeepseekV3MoE(transformers.DeepseekV3Config(
        n_routed_experts=spec["experts"], n_group=spec["n_group"],
        topk_group=spec["topk_group"], n_shared_experts=spec["shared"],
        routed_scaling_factor=spec["scaling"], **common))
  else:
    module = Qwen3MoeSparseMoeBlock(transformers.Qwen3MoeConfig(
        num_experts=spec["experts"], **common))
  state = {k: v for k, v in a.items() if k != "x"}
  module.load_state_dict(state, strict=True)
  with torch.no_grad():
    np.save(stem + ".out.npy", module(a["x"]).numpy())
"""


def _hf_state(params):
  """HF's in-memory names and [out, in] layouts for one MoE layer's parameters."""
  p = jax.tree.map(np.asarray, params)
  ex = p["experts"]
  state = {
      "gate.weight": p["router"]["kernel"].T,
      "experts.gate_up_proj": np.concatenate(
          [ex["gate_proj"].transpose(0, 2, 1), ex["up_proj"].transpose(0, 2, 1)], axis=1),
      "experts.down_proj": ex["down_proj"].transpose(0, 2, 1),
  }
  if "correction_bias" in p["router"]:
    state["gate.e_score_correction_bias"] = p["router"]["correction_bias"]
  for name in ("gate_proj", "up_proj", "down_proj") if "shared" in p else ():
    state[f"shared_experts.{name}.weight"] = p["shared"][name]["kernel"].T
  return {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}


def test_matches_hf_modules(tmp_path):
  python = torch_reference.torch_python()
  renorm = dict(SOFTMAX, norm_topk_prob=True)
  cases = {"sigmoid": build_case("sigmoid"), "softmax": build_case("softmax"),
           "softmax_renorm": dict(cfg=make_cfg(renorm), params=build_case("softmax")["params"],
                                  dense=make_apply(make_cfg(renorm)))}
  ours = {}
  for name, case in cases.items():
    ours[name] = np.asarray(case["dense"](case["params"], X)[0])
    m = case["cfg"].moe
    spec = dict(router=m.router, hidden=D, width=m.intermediate_size,
                top_k=m.num_experts_per_tok, norm_topk_prob=m.norm_topk_prob,
                experts=m.num_experts, n_group=m.n_group, topk_group=m.topk_group,
                shared=m.num_shared_experts, scaling=m.routed_scaling_factor)
    (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    np.savez(tmp_path / f"{name}.npz", x=np.asarray(X), **_hf_state(case["params"]))
  # Run outside the checkout (see torch_reference.clean_env).
  run = subprocess.run([python, "-c", HF_SCRIPT, *(str(tmp_path / n) for n in cases)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env=torch_reference.clean_env())
  assert run.returncode == 0, run.stderr
  for name in cases:
    theirs = np.load(tmp_path / f"{name}.out.npy")
    np.testing.assert_allclose(ours[name], theirs, atol=1e-4, rtol=1e-5, err_msg=name)
