"""semantic_search: nearest workspace chunks to a query, by MiniLM embeddings."""

import hashlib

import numpy as np

from c2jax.env.tools.registry import ToolError, register_tool

CHUNK_LINES = 30
_TEXT_SUFFIXES = ('.py', '.md', '.txt', '.rst', '.toml', '.cfg', '.ini', '.json', '.yaml',
                  '.yml', '.sh', '.c', '.h', '.cc', '.cpp', '.rs', '.go', '.js', '.ts',
                  '.java', '.html', '.css')


def _chunks(ctx) -> list[tuple[str, int, str]]:
  out = []
  for path in ctx.sandbox.list_files():
    if not path.endswith(_TEXT_SUFFIXES) or path.startswith('.git/'):
      continue
    data = ctx.sandbox.read_file(path)
    if len(data) > 1 << 20 or b'\0' in data[:4096]:
      continue
    lines = data.decode('utf-8', errors='replace').splitlines()
    for start in range(0, max(len(lines), 1), CHUNK_LINES):
      text = '\n'.join(lines[start:start + CHUNK_LINES])
      if text.strip():
        out.append((path, start + 1, text))
  return out


@register_tool('semantic_search', 'Find the code most related in meaning to a '
               'natural-language query.', {
                   'query': {'type': 'string', 'description': 'What you look for.'},
                   'top_k': {'type': 'integer', 'default': 5, 'minimum': 1,
                             'description': 'Number of results.'}}, required=('query',))
def semantic_search(ctx, query, top_k=5):
  if not query.strip():
    raise ToolError('query is empty; describe the code you are looking for.')
  # Imported here: JAX costs seconds to import and only this tool needs it.
  from c2jax.env import minilm  # pylint: disable=g-import-not-at-top
  model = minilm.shared()
  chunks = _chunks(ctx)
  if not chunks:
    return 'No text files to search.'
  # Embeddings are cached by chunk content, so unchanged code is embedded once.
  cache = ctx.cache.setdefault('semantic_search', {})
  keys = [hashlib.sha1(f'{p}\0{t}'.encode()).hexdigest() for p, _, t in chunks]
  missing = [i for i, k in enumerate(keys) if k not in cache]
  if missing:
    vectors = model.embed([f'{chunks[i][0]}\n{chunks[i][2]}' for i in missing])
    cache.update({keys[i]: v for i, v in zip(missing, vectors)})
  matrix_NxD = np.stack([cache[k] for k in keys])
  scores_N = matrix_NxD @ model.embed([query])[0]
  best = np.argsort(-scores_N)[:min(top_k, ctx.config.max_matches)]
  parts = []
  for i in best:
    path, line, text = chunks[i]
    preview = '\n'.join(text.splitlines()[:8])
    parts.append(f'{path}:{line} (score {scores_N[i]:.3f})\n{preview}')
  return '\n\n'.join(parts)
