import pytest


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
  """One small corpus + tokenizer shared by every job test (built by the first job)."""
  return tmp_path_factory.mktemp("data_cache")
