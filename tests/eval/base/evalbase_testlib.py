"""Helpers shared by the eval/base tests: a little repository to evaluate."""

import pathlib

REPO = {
    "b/util.py": "def clamp(x, lo, hi):\n  return max(lo, min(x, hi))\n",
    "a/main.py": "from b.util import clamp\n\nprint(clamp(5, 0, 3))\n",
    "README.md": "# demo\nA tiny repository.\n",
    "vendor/lib.py": "VENDORED = True\n",
    "logo.png": b"\x89PNG\r\n\x1a\n\0\0binary",
    "notes.txt": "not code\n",
    "empty.py": "\n  \n",
}


def write_repo(root: pathlib.Path, files=None) -> pathlib.Path:
  for path, content in (REPO if files is None else files).items():
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
      full.write_bytes(content)
    else:
      full.write_text(content, encoding="utf-8")
  return root
