"""Checkpointer.restore_latest: damaged steps are set aside, every other failure stops
with a named cause and leaves all checkpoints in place."""

import pathlib
import re

import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train.step import TrainState


def _state(width=4, extra=False):
  params = {"w": jnp.arange(3 * width, dtype=jnp.float32).reshape(3, width),
            "b": {"c": jnp.ones((2,))}}
  if extra:
    params["b"]["new"] = jnp.zeros((5,))
  optimizer = optax.adam(1e-3)
  return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))


@pytest.fixture
def run_dir(tmp_path):
  """Steps 1 and 2 of a run (step 2's params are step 1's + 1)."""
  ck = checkpoint_lib.Checkpointer(tmp_path / "ck", async_save=False, every=1)
  state = _state()
  ck.save(1, state, {"pos": 1}, {})
  ck.save(2, state.replace(params={"w": state.params["w"] + 1, "b": state.params["b"]}),
          {"pos": 2}, {})
  ck.close()
  return tmp_path / "ck"


def _restore(directory, state=None):
  ck = checkpoint_lib.Checkpointer(directory, async_save=False, every=1)
  try:
    return ck.restore_latest(checkpoint_lib.abstract_like(state or _state()))
  finally:
    ck.close()


def _entries(directory):
  return sorted(p.name for p in pathlib.Path(directory).iterdir())


def _array_files(step_dir):
  # The array chunks: every file in an OCDBT data directory `d/`.
  return [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]


def test_intact_run_restores_newest(run_dir):
  step, state, data = _restore(run_dir)
  assert step == 2 and data == [{"pos": 2}]
  np.testing.assert_array_equal(state.params["w"], np.arange(12).reshape(3, 4) + 1)


def test_data_states_are_read_alone_and_skip_a_step_whose_data_slot_is_gone(run_dir):
  """What a resume reads before it builds anything: the newest readable data slot, as
  a list of the writing processes' states (one here); no arrays are read."""
  ck = checkpoint_lib.Checkpointer(run_dir, async_save=False, every=1)
  try:
    assert ck.data_states() == [{"pos": 2}]
    for path in (run_dir / "2" / "data").rglob("*"):
      if path.is_file():
        path.unlink()
    assert ck.data_states() == [{"pos": 1}]
  finally:
    ck.close()
  assert _entries(run_dir)[:2] == ["1", "2"]  # nothing was moved


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_damaged_array_files_are_set_aside(run_dir, damage, capsys):
  files = _array_files(run_dir / "2")
  assert files
  for path in files:
    if damage == "truncate":
      path.write_bytes(path.read_bytes()[:3])
    else:
      path.unlink()
  step, state, data = _restore(run_dir)
  assert step == 1 and data == [{"pos": 1}]
  np.testing.assert_array_equal(state.params["w"], np.arange(12).reshape(3, 4))
  assert _entries(run_dir) == ["1", "2.corrupt"]
  assert "step 2 is corrupt or partial" in capsys.readouterr().out


def test_unreadable_metadata_is_damage(run_dir):
  (run_dir / "2" / "state" / "_METADATA").write_text("{not json")
  assert _restore(run_dir)[0] == 1
  assert _entries(run_dir) == ["1", "2.corrupt"]


@pytest.mark.parametrize("state,message", [
    (_state(width=5), r"params/w has shape \(3, 4\) in the checkpoint, \(3, 5\)"),
    (_state(extra=True), "params/b/new is missing from the checkpoint"),
])
def test_config_mismatch_stops_and_moves_nothing(run_dir, state, message):
  with pytest.raises(checkpoint_lib.CheckpointRestoreError, match="config") as info:
    _restore(run_dir, state)
  assert "left in place" in str(info.value)
  assert re.search(message, str(info.value))
  assert _entries(run_dir) == ["1", "2"]


@pytest.mark.parametrize("error,cause", [
    (ModuleNotFoundError("No module named 'zarr_plugin'"), "dependency is missing"),
    (PermissionError(13, "Permission denied", "/ck/2/state/d/x"), "I/O error"),
    (ValueError("PERMISSION_DENIED: Error reading gs://bucket/ck/2/state"), "I/O error"),
    (RuntimeError("something unforeseen"), "files look intact"),
])
def test_other_failures_stop_and_move_nothing(run_dir, monkeypatch, error, cause):
  # Storage faults cannot be produced for real here (tests run as root, no object
  # store), so the manager's restore raises them the way orbax / tensorstore surface them.
  def failing_restore(self, step, *args, **kwargs):
    raise error
  monkeypatch.setattr(ocp.CheckpointManager, "restore", failing_restore)
  with pytest.raises(checkpoint_lib.CheckpointRestoreError, match=cause) as info:
    _restore(run_dir)
  assert "checkpoint step 2" in str(info.value)
  assert _entries(run_dir) == ["1", "2"]
