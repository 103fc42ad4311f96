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


def _pci(root, *functions):
  """A fake /sys/bus/pci/devices holding (vendor, device) functions."""
  for i, (vendor, device) in enumerate(functions):
    function = root / f"0000:00:{i:02x}.0"
    function.mkdir(parents=True)
    (function / "vendor").write_text(vendor + "\n")
    (function / "device").write_text(device + "\n")
  return str(root)


def test_libtpu_is_kept_quiet_only_where_no_tpu_can_be_present(tmp_path):
  import importlib.util

  import c2jax
  if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu (the tpu-compile extra) is not installed: nothing to keep quiet")
  quiet = c2jax._quiet_absent_tpu  # pylint: disable=protected-access
  dev = tmp_path / "dev"
  dev.mkdir()
  # A Cloud CPU VM: an Intel bridge, gVNIC and Persistent Disk NVMe. No TPU: one host.
  cpu_vm = _pci(tmp_path / "cpu_vm", ("0x8086", "0x1237"), ("0x1ae0", "0x0042"),
                ("0x1ae0", "0x001f"))
  env = {}
  quiet(env, pci_devices=cpu_vm, dev=str(dev))
  assert env == {"TPU_HOST_BOUNDS": "1,1,1", "TPU_WORKER_HOSTNAMES": "localhost"}
  env = {"TPU_WORKER_HOSTNAMES": "10.0.0.2"}  # the user's value wins
  quiet(env, pci_devices=cpu_vm, dev=str(dev))
  assert env["TPU_WORKER_HOSTNAMES"] == "10.0.0.2"
  # A v5p host (Google device 0x0062), or a Google device this code does not know, or a
  # TPU device node: nothing is set, libtpu finds its own layout.
  for functions in ((("0x1ae0", "0x0062"),), (("0x1ae0", "0x0999"),)):
    env = {}
    quiet(env, pci_devices=_pci(tmp_path / functions[0][1], *functions), dev=str(dev))
    assert env == {}
  (dev / "accel0").touch()
  env = {}
  quiet(env, pci_devices=cpu_vm, dev=str(dev))
  assert env == {}
  env = {"TPU_ACCELERATOR_TYPE": "v5p-8"}
  quiet(env, pci_devices=cpu_vm, dev=str(tmp_path / "nothing"))
  assert env == {"TPU_ACCELERATOR_TYPE": "v5p-8"}
