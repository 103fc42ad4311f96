"""`c2jax serve`'s settings: configs/serve.py, the flags as its short form, and every
mistake refused naming its key before a model is loaded."""

import os
import re
import subprocess
import sys

import pytest

from c2jax import config as configlib
from c2jax.serve import settings
from tests.test_configs import load_config_module

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(**fields):
  cfg = settings.defaults()
  cfg.model = "runs/sft"
  for dotted, value in fields.items():
    *groups, key = dotted.split("__")
    node = cfg
    for group in groups:
      node = node[group]
    node[key] = value
  return cfg


def test_the_config_file_builds_on_the_defaults():
  module = load_config_module(__import__("pathlib").Path(REPO) / "configs" / "serve.py")
  assert module.get_config("").to_dict() == settings.defaults().to_dict()
  long = module.get_config("long")
  assert (long.engine.slots, long.engine.max_length) == (4, 32768)
  with pytest.raises(ValueError, match="unknown variant 'huge'"):
    module.get_config("huge")


def test_every_flag_names_a_field_of_the_config():
  cfg = settings.defaults()
  for flag, field in settings.FLAG_FIELDS.items():
    configlib.get(cfg, field)  # raises naming the field if it is not there
  from c2jax.commands import serve as command  # defines the flags
  del command
  from absl import flags
  assert set(settings.FLAG_FIELDS) <= set(flags.FLAGS)


@pytest.mark.parametrize("fields, key, words", [
    ({"model": ""}, "model", "is empty"),
    ({"port": 70000}, "port", "0 (a free port) to 65535"),
    ({"engine__slots": 0}, "engine.slots", "must be a number > 0"),
    ({"engine__max_length": 1}, "engine.max_length", "at least 2 tokens"),
    ({"limits__max_body_mb": 0.0}, "limits.max_body_mb", "> 0"),
    ({"profile__steps": "5,3"}, "profile.steps", "1 <= FIRST <= LAST"),
    ({"profile__steps": "three"}, "profile.steps", "use FIRST,LAST"),
    ({"engine__mesh": "fsdp=2", "engine__slots": 3}, "engine.mesh", "multiple of 2 slots"),
    ({"task": "rl"}, "task", "configs/serve.py"),
    ({"engine__weights_quant": "int3"}, "engine.weights_quant",
     "expected one of ['fp8', 'int4', 'int8', 'none']"),
])
def test_a_bad_setting_is_refused_naming_its_key(fields, key, words):
  with pytest.raises(configlib.ConfigError, match=re.escape(words)) as err:
    settings.validate(_config(**fields))
  assert err.value.key == key


def test_an_unknown_field_is_refused():
  cfg = _config()
  cfg.engine.slotz = 2
  with pytest.raises(configlib.ConfigError, match="engine.slotz"):
    settings.validate(cfg)


def test_the_command_refuses_before_loading_and_a_flag_wins_over_the_file():
  """One process: --port (a flag) over the file's port, then the bad slots of the file
  named; and an override of an unknown key refused by the config flag itself."""
  base = [sys.executable, "-m", "c2jax.cli", "serve", "--config=configs/serve.py"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  bad = subprocess.run(base + ["--config.model=nowhere", "--config.port=70000", "--port=0",
                               "--config.engine.slots=0"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
  assert bad.returncode == 2, bad.stderr
  assert "config.engine.slots: is 0" in bad.stderr and "config.port" not in bad.stderr
  unknown = subprocess.run(base + ["--config.engine.slotz=2"], capture_output=True,
                           text=True, cwd=REPO, env=env, timeout=120)
  assert unknown.returncode != 0 and "slotz" in unknown.stderr
