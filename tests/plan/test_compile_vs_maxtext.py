"""tools/compile/vs_maxtext.py without MaxText or a compile: the DeepSeek-V3 671B
comparison's MaxText overrides put the chips on c2jax's real-scale mesh, c2jax's settings
give a config that validates on that many devices, and MaxText's printed analyses parse."""

import ast

import pytest

from c2jax.train import jobs
from tests.test_configs import CONFIG_DIR, load_config_module
from tools.compile import vs_maxtext


def _overrides(args):
  return dict(arg.split("=", 1) for arg in args)


def test_deepseek_v3_overrides_put_the_chips_on_the_real_scale_mesh():
  got = _overrides(vs_maxtext.deepseek_v3_overrides(5, 256))
  assert got["model_name"] == "deepseek3-671b" and got["base_num_decoder_layers"] == "5"
  ways = [int(got[f"ici_{axis}_parallelism"]) for axis in ("fsdp", "expert", "context")]
  assert ways == [16, 8, 2]
  assert got["mtp_num_layers"] == "1" and got["context_parallel_load_balance"] == "false"
  assert (got["n_routing_groups"], got["topk_routing_group"]) == ("8", "4")
  with pytest.raises(SystemExit, match="multiple of 16 chips"):
    vs_maxtext.deepseek_v3_overrides(4, 8)


def test_c2jax_settings_match_the_maxtext_side():
  """The same layers, batch and length; dispatch in bf16 as MaxText's; the config's mesh,
  MTP and routing are the ones the MaxText overrides copy, and it validates on 256."""
  settings = vs_maxtext.c2jax_settings(256, 4096, "deepseek_v3", 5)
  cfg = load_config_module(CONFIG_DIR / "pretrain.py").get_config("deepseek_v3")
  typed = {}
  for key, value in _overrides(settings).items():
    try:
      typed[key] = ast.literal_eval(value)
    except ValueError:
      typed[key] = value  # a bare string, as the command line takes it
  cfg.update_from_flattened_dict(typed)
  jobs.validate(cfg, num_devices=256)
  assert (cfg.model.num_layers, cfg.model.scan_unroll) == (5, 5)
  assert (cfg.train.batch_size, cfg.train.seq_len) == (256, 4096)
  assert cfg.model.moe.ep_dispatch_quant == "none"
  maxtext = _overrides(vs_maxtext.deepseek_v3_overrides(5, 256))
  assert cfg.parallel.mesh.expert == int(maxtext["ici_expert_parallelism"])
  assert cfg.parallel.mesh.context == int(maxtext["ici_context_parallelism"])
  assert not cfg.parallel.context_load_balance
  assert cfg.model.num_mtp_layers == int(maxtext["mtp_num_layers"])
  assert (cfg.model.moe.n_group, cfg.model.moe.topk_group) == (8, 4)
  assert cfg.model.first_k_dense == 3  # MaxText's deepseek3-671b: first_num_dense_layers 3


def test_maxtext_analyses_parse():
  log = ("Jitting and compiling train step...\n"
         "Cost analysis: {'utilization0{}': 1.0, 'flops': 2.5e14, 'optimal_seconds': 1.25}\n"
         "Memory analysis: CompiledMemoryStats(generated_code_size_in_bytes=371, "
         "argument_size_in_bytes=1276, output_size_in_bytes=1270, alias_size_in_bytes=1269, "
         "temp_size_in_bytes=49694, host_temp_size_in_bytes=0)\n")
  got = vs_maxtext.parse_maxtext(log)
  assert got == {"argument_bytes": 1276, "output_bytes": 1270, "alias_bytes": 1269,
                 "temp_bytes": 49694, "code_bytes": 371, "flops": 2.5e14,
                 "cost_model_seconds": 1.25}
  with pytest.raises(SystemExit, match="no cost/memory analysis"):
    vs_maxtext.parse_maxtext("Traceback (most recent call last):\n  ValueError: bad override\n")
