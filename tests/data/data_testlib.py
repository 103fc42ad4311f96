"""Helpers shared by the data tests (a module of its own name: `conftest` is ambiguous
when pytest collects several test folders in one process)."""

import pathlib
import subprocess

from c2jax.data import corpus

# Repository name -> {path: contents}. Bytes values are written as-is.
TREE = {
    "alpha": {
        "pkg/__init__.py": "from .core import add\n",
        "pkg/core.py": "def add(a, b):\n  return a + b\n\n\ndef sub(a, b):\n  return a - b\n",
        "README.md": "# alpha\nAdds numbers. ünïcode ✓\n",
        "logo.png": b"\x89PNG\r\n\x1a\n\0\0\0binary",
        "data.bin": b"\0\1\2",
        "empty.py": "   \n",
    },
    "beta": {
        "main.py": "import sys\n\nprint(sys.argv)\n",
        "copy_of_core.py": "def add(a, b):\n  return a + b\n\n\ndef sub(a, b):\n  return a - b\n",
        "src/lib.rs": "fn main() {\n    println!(\"hi\");\n}\n",
        "big.py": "x = 1\n" * 400,
        "latin1.py": "s = '\xe9'\n".encode("latin-1"),
    },
    "gamma": {
        "a.py": "class A:\n  pass\n",
        "b/c.py": "class C(A):\n  def f(self):\n    return 3\n",
        "b/d.go": "package b\n\nfunc D() int { return 4 }\n",
    },
    "delta": {
        "tool.py": "def run():\n  return 'delta'\n",
        "notes.txt": "not code",
    },
}
MAX_FILE_BYTES = 1000  # big.py (2400 bytes) is too large


def write_tree(root: pathlib.Path) -> pathlib.Path:
  for repo, files in TREE.items():
    for path, content in files.items():
      full = root / repo / path
      full.parent.mkdir(parents=True, exist_ok=True)
      if isinstance(content, bytes):
        full.write_bytes(content)
      else:
        full.write_text(content, encoding="utf-8")
  return root


def options(root: pathlib.Path, **overrides) -> corpus.BuildOptions:
  kwargs = dict(sources=(f"{root}/*",), heldout_repositories=("gamma",),
                heldout_fraction=0.0, max_file_bytes=MAX_FILE_BYTES)
  kwargs.update(overrides)
  return corpus.BuildOptions(**kwargs)


def git_checkout(root: pathlib.Path) -> pathlib.Path:
  """A git repository with one tracked and one untracked file."""
  root.mkdir(parents=True)
  (root / "tracked.py").write_text("print('tracked')\n")
  run = lambda *args: subprocess.run(["git", "-C", str(root), *args], check=True,
                                     capture_output=True)
  run("init", "-q")
  run("add", "tracked.py")
  (root / "untracked.py").write_text("print('untracked')\n")
  return root
