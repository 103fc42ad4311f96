"""Model config inheritance between phases (c2jax/model/lineage.py): pure config, no
arrays. What is inherited, what is free, what is an error and what a phase may declare."""

import pytest

from c2jax import config as configlib
from c2jax.model import config as model_config
from c2jax.model import lineage, variants


def _yarn_source():
  """A checkpoint's model: tiny after the long-context phase (YaRN x8 over 128)."""
  return variants.get("tiny", max_position=1024, rope=dict(
      scaling="yarn", factor=8.0, original_max_position=128, mscale_all_dim=1.0))


def test_every_schema_key_is_free_or_architecture():
  keys = lineage.schema_keys()
  assert set(lineage.FREE_KEYS) <= set(keys)
  assert set(lineage.architecture_keys()) == set(keys) - set(lineage.FREE_KEYS)
  for key in ("rope.factor", "rope.scaling", "moe.routed_scaling_factor",
              "moe.norm_topk_prob", "moe.router", "moe.num_experts", "hidden_size",
              "attention", "dtype", "quant", "num_mtp_layers", "rms_norm_eps"):
    assert key in lineage.architecture_keys(), key
  for key in ("remat", "moe_impl", "attention_impl", "param_dtype", "opt_state_dtype"):
    assert key in lineage.FREE_KEYS, key


def test_a_variant_phase_inherits_everything_it_does_not_state():
  phase = variants.get("tiny")  # configs/rl.py's model: states nothing
  resolved, notes = lineage.inherit(_yarn_source(), phase)
  assert resolved.rope.scaling == "yarn" and resolved.rope.factor == 8.0
  assert resolved.rope.original_max_position == 128
  assert len(notes) == 1 and "rope.scaling='yarn'" in notes[0] and "'tiny'" in notes[0]


def test_free_keys_are_the_phases_own():
  phase = variants.get("tiny", remat="full", moe_impl="ragged", attention_impl="blockwise",
                       param_dtype="bfloat16", max_position=512)
  resolved, _ = lineage.inherit(_yarn_source(), phase)
  assert (resolved.remat, resolved.moe_impl, resolved.attention_impl) == (
      "full", "ragged", "blockwise")
  assert resolved.param_dtype == "bfloat16" and resolved.max_position == 512


@pytest.mark.parametrize("key, mine, theirs", [
    ("rope.factor", 16.0, 8.0),
    ("moe.routed_scaling_factor", 2.5, 1.0),
    ("moe.norm_topk_prob", False, True),
    ("dtype", "bfloat16", "float32"),
    ("moe.num_experts", 16, 8),
])
def test_an_undeclared_override_names_the_key_and_both_values(key, mine, theirs):
  phase = variants.get("tiny")
  *parents, last = key.split(".")
  node = phase
  for part in parents:
    node = node[part]
  node[last] = mine
  with pytest.raises(configlib.ConfigError) as err:
    lineage.inherit(_yarn_source(), phase, where="the run R")
  assert err.value.key == f"model.{key}"
  message = str(err.value)
  assert f"is {mine!r} in this config but {theirs!r} in the run R" in message
  assert "config.model_changes" in message


def test_a_declared_change_is_applied():
  phase = variants.get("tiny", rope=dict(factor=16.0, scaling="yarn",
                                         original_max_position=128, mscale_all_dim=1.0))
  resolved, notes = lineage.inherit(_yarn_source(), phase, declared=("rope.factor",))
  assert resolved.rope.factor == 16.0
  assert any("rope.factor: 8.0 -> 16.0" in note for note in notes)


def test_a_declared_key_takes_the_phase_value_even_at_its_variant_default():
  """Dropping MTP: 0 is tiny's default, but the phase says so on purpose."""
  source = variants.get("tiny", num_mtp_layers=1)
  resolved, _ = lineage.inherit(source, variants.get("tiny"), declared=("num_mtp_layers",))
  assert resolved.num_mtp_layers == 0
  resolved, _ = lineage.inherit(source, variants.get("tiny"))
  assert resolved.num_mtp_layers == 1


def test_a_model_that_is_no_variant_states_every_key():
  phase = variants.get("tiny")
  phase.name = "my_model"
  assert lineage.overrides(phase) == lineage.architecture_keys()
  with pytest.raises(configlib.ConfigError, match=r"config\.model\.rope\.factor: is 1\.0"):
    lineage.inherit(_yarn_source(), phase)
  same, _ = lineage.inherit(variants.get("tiny"), phase)
  assert model_config.validate(same).name == "my_model"


@pytest.mark.parametrize("declared, match", [
    (("rope.factr",), "not a model config key"),
    (("remat",), "may always change"),
])
def test_bad_declarations_are_named(declared, match):
  with pytest.raises(configlib.ConfigError, match=match) as err:
    lineage.check_declared(declared)
  assert err.value.key == "model_changes"


def test_real_scale_variants_train_fp32_masters_with_bf16_compute():
  for name in ("deepseek_v3", "kimi_k25", "qwen3_moe_30b_a3b"):
    cfg = variants.get(name)
    assert (cfg.param_dtype, cfg.opt_state_dtype, cfg.dtype) == (
        "float32", "float32", "bfloat16"), name
  for name in ("tiny", "small"):
    cfg = variants.get(name)
    assert (cfg.param_dtype, cfg.opt_state_dtype, cfg.dtype) == (
        "float32", "float32", "float32"), name
  cfg = variants.get("tiny", opt_state_dtype="float16")
  with pytest.raises(configlib.ConfigError, match=r"config\.opt_state_dtype"):
    model_config.validate(cfg)
