"""Every config file imports and validates; bad configs fail naming the key."""

import importlib.util
import pathlib

import ml_collections
import pytest

from c2jax import config as configlib
from c2jax.model import config as model_config
from c2jax.model import variants
from c2jax.rl import job as rl_job
from c2jax.train import jobs

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"
CONFIG_FILES = sorted(p for p in CONFIG_DIR.glob("*.py") if not p.name.startswith("_"))


def load_config_module(path):
  spec = importlib.util.spec_from_file_location(f"configs_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def validate_any(cfg):
  """Validates a pipeline, job, smoke or model config with the validator it has."""
  if "stages" in cfg:
    for stage in cfg.stages:
      if "train" in cfg[stage] or cfg[stage].get("task") == "rl":
        validate_any(cfg[stage])  # training and RL stages; others: checked by their command
  elif cfg.get("task") == "rl":
    rl_job.validate(cfg)
  elif cfg.get("task") == "serve":  # configs/serve.py: the model comes from the command line
    from c2jax.serve import settings
    cfg = cfg.copy_and_resolve_references()
    cfg.model = cfg.model or "runs/any"
    settings.validate(cfg)
  elif "suite" in cfg:  # configs/eval.py
    from c2jax.eval import runner as eval_runner
    eval_runner.validate(cfg)
  elif "train" in cfg:
    jobs.validate(cfg)
  elif "model" in cfg:
    model_config.validate(cfg.model)
  else:
    model_config.validate(cfg)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_every_config_file_validates(path):
  module = load_config_module(path)
  # A config file lists the args worth checking in TEST_ARGS; default: its default arg.
  for arg in getattr(module, "TEST_ARGS", ("",)):
    cfg = module.get_config(arg)
    assert isinstance(cfg, ml_collections.ConfigDict)
    validate_any(cfg)


@pytest.mark.parametrize("file", ["pretrain.py", "longctx.py", "mtp.py"])
@pytest.mark.parametrize("variant", ["deepseek_v3", "kimi_k25", "qwen3_moe_30b_a3b"])
def test_real_scale_jobs_validate_on_their_mesh(file, variant):
  """With the checks that need a device count (256): the DeepSeek-V3 pretrain config and
  every MTP config once asked for load-balanced context shards, which MTP cannot use, and
  the long-context configs had 32 rows for 128 batch ways (pretraining's CP=2)."""
  cfg = load_config_module(CONFIG_DIR / file).get_config(variant)
  jobs.validate(cfg, num_devices=256)


@pytest.mark.parametrize("name", sorted(variants.VARIANTS))
def test_variants_validate(name):
  model_config.validate(variants.get(name))


def test_unknown_variant_lists_choices():
  with pytest.raises(ValueError, match="kimi_k25"):
    variants.get("kimi_k3")


@pytest.mark.parametrize("mutate, key", [
    (lambda c: setattr(c.moe, "num_experts_per_tok", 9), "moe.num_experts_per_tok"),
    (lambda c: setattr(c, "attention", "mqa"), "attention"),
    (lambda c: setattr(c.moe, "router", "topk"), "moe.router"),
    (lambda c: setattr(c, "moe_impl", "cuda"), "moe_impl"),
    (lambda c: setattr(c, "first_k_dense", 5), "first_k_dense"),
    (lambda c: setattr(c.moe, "n_group", 3), "moe.num_experts"),
    (lambda c: (setattr(c.moe, "n_group", 4), setattr(c.moe, "topk_group", 5)),
     "moe.topk_group"),
    (lambda c: (setattr(c.moe, "n_group", 4), setattr(c.moe, "topk_group", 1),
                setattr(c.moe, "num_experts_per_tok", 3)), "moe.topk_group"),
    (lambda c: setattr(c, "hidden_size", 0), "hidden_size"),
    (lambda c: setattr(c, "qk_rope_head_dim", 7), "qk_rope_head_dim"),
    (lambda c: setattr(c, "remat", "sometimes"), "remat"),
    (lambda c: setattr(c.rope, "scaling", "ntk"), "rope.scaling"),
])
def test_bad_model_configs_name_the_key(mutate, key):
  cfg = variants.get("tiny")
  mutate(cfg)
  with pytest.raises(configlib.ConfigError) as err:
    model_config.validate(cfg)
  assert err.value.key == key
  assert str(err.value).startswith(f"config.{key}:")


def test_gqa_heads_must_divide():
  cfg = variants.get("qwen3_moe_30b_a3b")
  cfg.num_kv_heads = 5
  with pytest.raises(configlib.ConfigError, match=r"config\.num_heads: = 32 must be divisible"):
    model_config.validate(cfg)


def test_unknown_and_mistyped_keys_are_rejected():
  cfg = variants.get("tiny")
  cfg.unlock()
  cfg.hiden_size = 3
  with pytest.raises(configlib.ConfigError, match=r"config\.hiden_size: is not a known key"):
    model_config.validate(cfg)
  cfg = variants.get("tiny")
  with pytest.raises(TypeError):
    cfg.num_heads = "four"  # ml-collections refuses the type change itself
  cfg.rope.unlock()
  cfg.rope = ml_collections.ConfigDict({"theta": "big"})
  with pytest.raises(configlib.ConfigError, match=r"config\.rope\.theta: has type str"):
    model_config.validate(cfg)


def test_variant_override_of_unknown_key_fails():
  with pytest.raises(configlib.ConfigError, match=r"config\.moe\.experts:"):
    variants.get("tiny", moe={"experts": 4})


def test_q_lora_rank_may_be_none():
  cfg = variants.get("tiny", q_lora_rank=None)
  model_config.validate(cfg)
  assert cfg.q_lora_rank is None
  cfg.q_lora_rank = 16  # placeholder keeps the int type after None
  model_config.validate(cfg)


def test_job_config_errors_name_the_key():
  from c2jax.train import jobs as jobs_lib

  cfg = jobs_lib.job_defaults("tiny")
  cfg.train.batch_size = 6
  jobs_lib.validate(cfg)  # no device count: mesh-dependent checks are skipped
  with pytest.raises(configlib.ConfigError, match=r"config\.train\.batch_size: = 6"):
    jobs_lib.validate(cfg, num_devices=4)
  cfg = jobs_lib.job_defaults("tiny")
  cfg.train.schedule = "linear"
  with pytest.raises(configlib.ConfigError, match=r"config\.train\.schedule"):
    jobs_lib.validate(cfg)
  cfg = jobs_lib.job_defaults("tiny")
  cfg.parallel.mesh.fsdp = 3
  with pytest.raises(configlib.ConfigError, match=r"config\.parallel\.mesh"):
    jobs_lib.validate(cfg, num_devices=8)
  cfg = jobs_lib.job_defaults("tiny")
  cfg.data.vocab_size = cfg.model.vocab_size + 1
  with pytest.raises(configlib.ConfigError, match=r"config\.data\.vocab_size"):
    jobs_lib.validate(cfg)
