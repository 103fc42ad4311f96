import pytest


@pytest.fixture(scope="session")
def two_process_reference(tmp_path_factory, data_cache):
  """An uninterrupted 2-process run of distributed_testlib's settings (checkpoints at
  steps 10 and 14): what the preemption and resume tests of every launcher (loopback,
  SLURM) continue."""
  from distributed_testlib import finish, start_pair  # pylint: disable=g-import-not-at-top

  workdir = tmp_path_factory.mktemp("reference")
  finish(start_pair(workdir, data_cache))
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [10, 14]
  return workdir
