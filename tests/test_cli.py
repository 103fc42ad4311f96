"""The `c2jax` command dispatches verbs and explains mistakes."""

import subprocess
import sys

import pytest

from c2jax import cli


def run_cli(*args):
  return subprocess.run([sys.executable, "-m", "c2jax.cli", *args], capture_output=True,
                        text=True)


def test_usage_lists_every_verb(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.run(["c2jax", "--help"])
  assert exit_info.value.code == 0
  out = capsys.readouterr().out
  for verb in cli.VERBS:
    assert f"  {verb} " in out


def test_unknown_verb_is_an_error():
  result = run_cli("pretrian")
  assert result.returncode == 2
  assert "unknown verb 'pretrian'" in result.stderr


@pytest.mark.parametrize("verb", sorted(cli.VERBS))
def test_every_verb_shows_its_help(verb):
  # One process per verb: each verb module defines its own absl flags at import.
  result = run_cli(verb, "--help")
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith(f"c2jax {verb}: ")
  assert "  --" in result.stdout  # the verb's own flags are listed


def test_config_override_of_unknown_key_is_refused():
  result = run_cli("plan", "--config=configs/models.py:tiny", "--config.hidden_sise=3",
                   "--count")
  assert result.returncode != 0
  assert "hidden_sise" in result.stderr


def test_backend_opt_level_joins_xla_flags_and_a_given_level_wins():
  import c2jax
  env = {"C2JAX_XLA_BACKEND_OPT_LEVEL": "0", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  c2jax._apply_backend_opt_level(env)  # pylint: disable=protected-access
  assert env["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=2 "
                              "--xla_backend_optimization_level=0")
  env = {"C2JAX_XLA_BACKEND_OPT_LEVEL": "1", "XLA_FLAGS": "--xla_backend_optimization_level=3"}
  c2jax._apply_backend_opt_level(env)  # pylint: disable=protected-access
  assert env["XLA_FLAGS"] == "--xla_backend_optimization_level=3"
  env = {}
  c2jax._apply_backend_opt_level(env)  # pylint: disable=protected-access
  assert env == {}
  with pytest.raises(ValueError, match="C2JAX_XLA_BACKEND_OPT_LEVEL='fast'"):
    c2jax._apply_backend_opt_level({"C2JAX_XLA_BACKEND_OPT_LEVEL": "fast"})  # pylint: disable=protected-access
