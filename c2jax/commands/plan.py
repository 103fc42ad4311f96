"""`c2jax plan`: what a config would allocate, computed abstractly (nothing is allocated).

  c2jax plan --config=configs/models.py:kimi_k25 --count
prints one JSON object: total and active parameter counts.
  c2jax plan --config=configs/pretrain.py:kimi_k25 --shardings --devices=1024
prints how every parameter is split over the job's mesh (axis sizes from
`config.parallel.mesh`, one of them -1 to absorb `--devices`) and the per-device bytes.
`--config` may be a model config or any job config with a `model` field.
"""

from __future__ import annotations

import json

import jax
from absl import flags
from ml_collections import config_flags

from c2jax.model import counting

_CONFIG = config_flags.DEFINE_config_file("config", None, "Model or job config file.")
_COUNT = flags.DEFINE_bool("count", False, "Print total and active parameter counts.")
_SHARDINGS = flags.DEFINE_bool("shardings", False, "Print every parameter's sharding.")
_DEVICES = flags.DEFINE_integer("devices", None, "Mesh size for --shardings (default: the "
                                "devices present).")


def main(argv) -> int:
  if len(argv) > 1:
    raise SystemExit(f"c2jax plan: unexpected arguments {argv[1:]}")
  cfg = _CONFIG.value
  if cfg is None:
    raise SystemExit("c2jax plan: pass --config=configs/<file>.py:<arg>")
  model_cfg = cfg.model if "model" in cfg else cfg
  if not (_COUNT.value or _SHARDINGS.value):
    raise SystemExit("c2jax plan: choose what to plan: --count and/or --shardings")
  if _COUNT.value:
    print(json.dumps(counting.count_params(model_cfg)))
  if _SHARDINGS.value:
    from c2jax import parallel
    from c2jax.parallel import plan

    parallel_cfg = cfg.parallel if "parallel" in cfg else parallel.default_parallel_config()
    devices = _DEVICES.value or jax.device_count()
    parallel.validate_parallel(parallel_cfg, devices)
    plans = plan.param_plans(model_cfg, parallel_cfg, devices)
    sizes = parallel.mesh.mesh_shape(parallel_cfg.mesh, devices)
    print(f"mesh {sizes} ({devices} devices)")
    print(plan.format_table(plans))
    print(json.dumps({"mesh": sizes, **plan.summarize(plans)}))
  return 0
