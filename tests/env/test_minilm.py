"""The JAX MiniLM port matches torch + transformers, and semantic_search ranks by it."""

import json
import os

import numpy as np
import pytest

from c2jax.toolcalls import protocol
from c2jax.env import minilm, tools as tools_lib

FIXTURE = os.path.join(os.path.dirname(__file__), 'fixtures', 'minilm_reference.json')


@pytest.fixture(scope='module')
def model():
  try:
    return minilm.shared()
  except ImportError as e:
    pytest.skip(str(e))


def test_embeddings_match_the_torch_reference(model):
  with open(FIXTURE) as f:
    ref = json.load(f)
  got = model.embed(ref['sentences'])
  assert got.shape == (3, 384)
  np.testing.assert_allclose(got[:, :16], np.array(ref['first16']), atol=2e-5)
  np.testing.assert_allclose(got @ got.T, np.array(ref['pairwise_cosine']), atol=2e-5)
  np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5)


def test_padding_and_batching_do_not_change_embeddings(model):
  texts = ['short', 'a much longer sentence about sandboxes and tools ' * 3, 'mid text']
  together = model.embed(texts)
  alone = np.concatenate([model.embed([t]) for t in texts])
  np.testing.assert_allclose(together, alone, atol=1e-5)
  assert model.embed([]).shape == (0, 384)


def test_semantic_search_finds_the_related_code(box, model):
  box.write_file('pkg/net.py', b'def download(url):\n    """Fetch a web page over HTTP."""\n'
                 b'    return http_get(url)\n')
  tb = tools_lib.Toolbox(box)
  obs = tb.call(protocol.ToolCall(0, 'semantic_search', {'query': 'fetch a URL from the '
                                                         'internet', 'top_k': 2}))
  assert obs.ok, obs.output
  assert obs.output.splitlines()[0].startswith('pkg/net.py:1 (score')
  cached = len(tb.context.cache['semantic_search'])
  tb.call(protocol.ToolCall(1, 'semantic_search', {'query': 'uppercase a string'}))
  assert len(tb.context.cache['semantic_search']) == cached  # unchanged files not re-embedded
  empty = tb.call(protocol.ToolCall(2, 'semantic_search', {'query': '  '}))
  assert not empty.ok and 'query is empty' in empty.output
