import os

import pytest


@pytest.fixture(scope="module")
def v5p_devices():
  """Compile-only devices of two v5p-8 slices (the TPU compiler; the tests that use them
  skip without libtpu)."""
  from c2jax.plan import topologies  # pylint: disable=g-import-not-at-top

  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # as c2jax plan --target does
  return topologies.parse_target("v5p-8", slices=2).devices()
