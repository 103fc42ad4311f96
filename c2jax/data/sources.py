"""Where corpus documents come from: source specs -> repositories -> files.

A source spec is one of
  `stdlib`         the running interpreter's standard library; each top-level package is
                   one repository (`stdlib/json`), the top-level modules together are
                   `stdlib/_modules`;
  `site-packages`  the running interpreter's site-packages; each installed distribution is
                   one repository (`site-packages/numpy`), listed from its RECORD;
  `DIR`            one repository named after the directory; a git checkout lists only
                   its tracked files (`git ls-files`), other trees are walked;
  `DIR/*`          every subdirectory of DIR is one repository (a folder of checkouts).

The repository is the unit of the train / held-out split, so the held-out set is an
unseen codebase rather than unseen files of seen codebases.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.metadata
import os
import pathlib
import posixpath
import subprocess
import sysconfig
from collections.abc import Callable

# Extension (or exact file name) -> language. Files of other types are not code and are
# dropped with reason `unknown_language`.
LANGUAGES: dict[str, str] = {
    ".py": "python", ".pyi": "python", ".pyx": "cython", ".pxd": "cython",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp",
    ".hh": "cpp", ".cu": "cuda", ".rs": "rust", ".go": "go", ".java": "java",
    ".kt": "kotlin", ".scala": "scala", ".js": "javascript", ".mjs": "javascript",
    ".jsx": "javascript", ".ts": "typescript", ".tsx": "typescript", ".rb": "ruby",
    ".php": "php", ".swift": "swift", ".cs": "csharp", ".lua": "lua", ".sh": "shell",
    ".bash": "shell", ".sql": "sql", ".html": "html", ".css": "css", ".md": "markdown",
    ".rst": "restructuredtext", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml",
    ".json": "json", ".cfg": "ini", ".ini": "ini", ".cmake": "cmake",
    "Makefile": "make", "Dockerfile": "dockerfile", "CMakeLists.txt": "cmake",
}

# Directories never worth reading in a walked tree: VCS internals, caches, dependencies.
_SKIP_DIRS = frozenset({"__pycache__", "node_modules", ".git", ".hg", ".svn", ".tox",
                        ".venv", "venv", ".mypy_cache", ".pytest_cache"})


@dataclasses.dataclass(frozen=True)
class Repository:
  """A named set of files under `root`; `files` are sorted root-relative POSIX paths."""
  name: str
  root: pathlib.Path
  files: tuple[str, ...]


def language_of(path: str) -> str | None:
  name = pathlib.PurePosixPath(path).name
  if name in LANGUAGES:
    return LANGUAGES[name]
  return LANGUAGES.get(pathlib.PurePosixPath(path).suffix)


def _walk(root: pathlib.Path) -> tuple[str, ...]:
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
    for filename in filenames:
      full = pathlib.Path(dirpath, filename)
      if not full.is_symlink():
        files.append(full.relative_to(root).as_posix())
  return tuple(sorted(files))


def _git_files(root: pathlib.Path) -> tuple[str, ...]:
  try:
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], check=True,
                         capture_output=True).stdout
  except (OSError, subprocess.CalledProcessError) as e:
    raise ValueError(f"{root} looks like a git checkout but `git ls-files` failed ({e}); "
                     "install git or pass a plain directory copy.") from e
  paths = [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
  return tuple(sorted(p for p in paths
                      if (root / p).is_file() and not (root / p).is_symlink()))


def directory_repository(root: pathlib.Path, name: str | None = None) -> Repository:
  root = root.resolve()
  if not root.is_dir():
    raise ValueError(f"source {root} is not a directory; pass an existing directory, "
                     "`DIR/*`, `stdlib` or `site-packages`.")
  files = _git_files(root) if (root / ".git").exists() else _walk(root)
  return Repository(name or root.name, root, files)


def _stdlib() -> list[Repository]:
  root = pathlib.Path(sysconfig.get_paths()["stdlib"]).resolve()
  site_dirs = {pathlib.Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
  repos, modules = [], []
  for entry in sorted(root.iterdir()):
    if entry.is_dir() and entry.name not in _SKIP_DIRS and entry.resolve() not in site_dirs \
        and entry.name != "site-packages" and (entry / "__init__.py").exists():
      files = tuple(f"{entry.name}/{p}" for p in _walk(entry))
      repos.append(Repository(f"stdlib/{entry.name}", root, files))
    elif entry.is_file() and entry.suffix == ".py":
      modules.append(entry.name)
  if modules:
    repos.append(Repository("stdlib/_modules", root, tuple(sorted(modules))))
  return repos


def _site_packages() -> list[Repository]:
  root = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
  repos = {}
  for dist in importlib.metadata.distributions(path=[str(root)]):
    name, record = dist.metadata["Name"], dist.read_text("RECORD")
    if not name or not record or f"site-packages/{name}" in repos:
      continue
    # RECORD rows are `path,hash,size` relative to site-packages; `../` paths (scripts)
    # lie outside it. Missing files are counted as unreadable by the builder.
    paths = {posixpath.normpath(row[0]) for row in csv.reader(record.splitlines()) if row}
    files = tuple(sorted(p for p in paths if not p.startswith("../")))
    repos[f"site-packages/{name}"] = Repository(f"site-packages/{name}", root, files)
  return list(repos.values())


# Named sources; anything else is a directory path.
NAMED_SOURCES: dict[str, Callable[[], list[Repository]]] = {
    "stdlib": _stdlib,
    "site-packages": _site_packages,
}
DEFAULT_SOURCES = ("stdlib", "site-packages")


def discover(specs: tuple[str, ...] | list[str]) -> list[Repository]:
  """Expands source specs into repositories with unique names (order not significant)."""
  if not specs:
    raise ValueError(f"no sources given; pass directories or one of {sorted(NAMED_SOURCES)}.")
  repos: dict[str, Repository] = {}
  for spec in specs:
    if spec in NAMED_SOURCES:
      found = NAMED_SOURCES[spec]()
    elif spec.endswith("/*"):
      parent = pathlib.Path(spec[:-2]).expanduser()
      if not parent.is_dir():
        raise ValueError(f"source {spec!r}: {parent} is not a directory.")
      found = [directory_repository(d) for d in sorted(parent.iterdir())
               if d.is_dir() and not d.name.startswith(".")]
    else:
      found = [directory_repository(pathlib.Path(spec).expanduser())]
    for repo in found:
      if repo.name in repos and repos[repo.name].root != repo.root:
        raise ValueError(f"two sources are both named repository {repo.name!r} "
                         f"({repos[repo.name].root} and {repo.root}); rename one directory "
                         "or pass only one of them.")
      repos[repo.name] = repo
  return list(repos.values())
