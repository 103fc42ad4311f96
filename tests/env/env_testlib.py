"""Helpers shared by the env tests."""

import os


def write_tree(root, files) -> str:
  """Writes {relative path: text} under root; returns root as a string."""
  for path, text in files.items():
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, 'w') as f:
      f.write(text)
  return str(root)
