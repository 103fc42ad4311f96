"""State-tracking cases (LoCoDiff-style): a file's first version + ordered unified diffs.

A case asks for the file's content after every diff is applied in order. Two builders:

- `git_cases(repo)`: real histories. For each tracked file, `git log --follow -p` along the
  first-parent line (merges shown as their diff against the first parent, renames
  followed) gives one patch per commit that touched it; the case starts at the file's
  oldest version and takes up to `max_diffs` patches. The expected answer is the file as
  git stores it at the last commit taken, and the case is kept only when applying the
  patches (c2jax.eval.base.diffs.apply) reproduces it exactly, so every kept case is
  solvable from its prompt.
- `procedural_cases(count, seed=...)`: generated Python-like files edited at random
  (insertions, deletions, rewrites, moved blocks, appended functions), deterministic in
  the seed, for machines without a repository history.

Cases are stored as JSONL, one `Case.to_json()` per line.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import random
import subprocess

from c2jax.data import sources
from c2jax.eval.base import diffs as diffs_lib
from c2jax.eval.base.codebase import VENDORED_DIRS

SOURCES = ("git", "procedural")


@dataclasses.dataclass(frozen=True)
class Case:
  id: str
  path: str
  initial: str
  diffs: tuple[str, ...]
  final: str
  source: str  # one of SOURCES
  meta: dict = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    return {"id": self.id, "path": self.path, "initial": self.initial,
            "diffs": list(self.diffs), "final": self.final, "source": self.source,
            "meta": self.meta}

  @classmethod
  def from_json(cls, record: dict) -> "Case":
    fields = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(record, dict) or not fields - {"meta"} <= set(record):
      got = sorted(record) if isinstance(record, dict) else type(record).__name__
      raise ValueError(f"state-tracking case has fields {got}; expected "
                       f"{sorted(fields)} (write cases with tools/tasks/build_state_tracking.py).")
    wrong = [k for k in ("id", "path", "initial", "final", "source")
             if not isinstance(record[k], str)]
    if not isinstance(record["diffs"], list) or not all(
        isinstance(d, str) for d in record["diffs"]):
      wrong.append("diffs")
    if wrong or record["source"] not in SOURCES:
      raise ValueError(f"state-tracking case {record.get('id')!r}: fields {wrong or ['source']} "
                       f"have the wrong type or value (strings; diffs a list of strings; "
                       f"source one of {list(SOURCES)}).")
    return cls(**{**{k: record[k] for k in fields if k in record},
                  "diffs": tuple(record["diffs"])})


def save_jsonl(cases, path: str | os.PathLike) -> None:
  path = pathlib.Path(path)
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    for case in cases:
      f.write(json.dumps(case.to_json(), ensure_ascii=False) + "\n")
  os.replace(tmp, path)


def load_jsonl(path: str | os.PathLike) -> list[Case]:
  cases = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if line.strip():
        try:
          cases.append(Case.from_json(json.loads(line)))
        except (ValueError, TypeError) as e:
          raise ValueError(f"{path}:{number}: {e}") from e
  return cases


# ---------------------------------------------------------------- real git histories


def _git(repo: pathlib.Path, *args: str) -> str:
  return _git_bytes(repo, *args).decode("utf-8", "surrogateescape")


def _git_bytes(repo: pathlib.Path, *args: str) -> bytes:
  try:
    result = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
  except FileNotFoundError as e:
    raise RuntimeError("state-tracking cases from histories need the `git` executable; "
                       "install git or use procedural_cases().") from e
  except subprocess.CalledProcessError as e:
    raise RuntimeError(f"`git {' '.join(args[:3])} ...` failed in {repo}: "
                       f"{e.stderr.decode(errors='replace').strip()[:300]}") from e
  return result.stdout


def _show(repo: pathlib.Path, commit: str, path: str) -> str | None:
  """The file at a commit as text, or None when it is not UTF-8 text."""
  data = _git_bytes(repo, "show", f"{commit}:{path}")
  if b"\0" in data:
    return None
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return None


def _touch_counts(repo: pathlib.Path) -> collections.Counter:
  """How many first-parent commits touched each path."""
  out = _git(repo, "log", "--first-parent", "--diff-merges=first-parent", "--name-only",
             "--no-renames", "--format=")
  return collections.Counter(line for line in out.split("\n") if line)


def _patch_path(patch: str) -> str | None:
  """The file's path after this patch, or None (deleted, quoted or unreadable)."""
  for line in patch.split("\n"):
    if line.startswith("+++ "):
      target = line[4:]
      return target[2:] if target.startswith("b/") else None
    if line.startswith("rename to "):
      return line[len("rename to "):]
    if line.startswith("@@"):
      break
  header = patch.split("\n", 1)[0]
  if header.startswith("diff --git a/") and " b/" in header and '"' not in header:
    return header.rsplit(" b/", 1)[1]
  return None


def file_history(repo: pathlib.Path, path: str) -> list[tuple[str, str, str]]:
  """[(commit, path at that commit, patch)] of `path`, oldest first."""
  out = _git(repo, "log", "--follow", "--first-parent", "--diff-merges=first-parent", "-p",
             "--no-color", "--no-ext-diff", "--no-textconv", "--format=%x00%H", "--", path)
  history = []
  for chunk in out.split("\x00")[1:]:
    commit, _, patch = chunk.partition("\n")
    patch = patch.lstrip("\n")
    history.append((commit.strip(), _patch_path(patch), patch))
  return history[::-1]


def _case_from_history(repo: pathlib.Path, name: str, history, *, max_diffs: int,
                       max_chars: int) -> tuple[Case | None, str]:
  """(case, '') or (None, why it was skipped)."""
  first_commit, first_path, _ = history[0]
  if first_path is None:
    return None, "unreadable_path"
  initial = _show(repo, first_commit, first_path)
  if initial is None:
    return None, "binary"
  state, taken, size = initial, [], len(initial)
  for commit, path, patch in history[1:1 + max_diffs]:
    if path is None or "\nBinary files " in "\n" + patch or "GIT binary patch" in patch:
      break
    if size + len(patch) > max_chars:
      break
    try:
      state = diffs_lib.apply(state, patch)
    except diffs_lib.DiffError:
      return None, "apply_mismatch"
    taken.append((commit, path, patch))
    size += len(patch)
  if not taken:
    return None, "too_few_diffs"
  last_commit, last_path, _ = taken[-1]
  truth = _show(repo, last_commit, last_path)
  if truth != state:
    return None, "apply_mismatch"
  case_id = f"git:{name}:{last_path}@{last_commit[:12]}"
  meta = {"repository": name, "commits": [first_commit] + [c for c, _, _ in taken],
          "paths": [first_path] + [p for _, p, _ in taken]}
  return Case(case_id, last_path, initial, tuple(p for _, _, p in taken), truth, "git",
              meta), ""


def git_cases(repo: str | os.PathLike, *, max_cases: int = 50, min_diffs: int = 2,
              max_diffs: int = 8, max_chars: int = 24_000,
              extensions: tuple[str, ...] = (), skip_dirs: tuple[str, ...] = VENDORED_DIRS,
              stats: dict | None = None) -> list[Case]:
  """Cases from the histories of `repo`'s tracked files (see the module docstring).

  Files touched by the most commits (not counting renames) are read first, ties by
  path, until max_cases are kept. extensions / skip_dirs
  filter files as in CodebaseOptions (empty extensions: every code type). max_chars
  bounds a case's initial text plus its patches. `stats`, when given, receives how many
  files were skipped for each reason.
  """
  root = pathlib.Path(repo).expanduser().resolve()
  if not (root / ".git").exists():
    raise ValueError(f"{root} is not a git checkout (no .git); pass a repository with "
                     "history, or generate cases instead (procedural_cases(), or "
                     "--procedural N in tools/tasks/build_state_tracking.py).")
  if min_diffs < 1 or max_diffs < min_diffs:
    raise ValueError(f"min_diffs = {min_diffs}, max_diffs = {max_diffs}; use "
                     "1 <= min_diffs <= max_diffs.")
  tracked = set(_git(root, "ls-files", "-z").split("\0")) - {""}
  counts = _touch_counts(root)
  skip = frozenset(skip_dirs)
  candidates = sorted(
      (p for p in tracked if not skip.intersection(pathlib.PurePosixPath(p).parts[:-1])
       and ((pathlib.PurePosixPath(p).suffix in extensions
             or pathlib.PurePosixPath(p).name in extensions) if extensions
            else sources.language_of(p) is not None)),
      key=lambda p: (-counts[p], p))
  skipped = collections.Counter()
  cases = []
  for path in candidates:
    if len(cases) >= max_cases:
      break
    history = file_history(root, path)
    if len(history) < min_diffs + 1:
      skipped["too_few_diffs"] += 1
      continue
    case, why = _case_from_history(root, root.name, history, max_diffs=max_diffs,
                                   max_chars=max_chars)
    if case is None or len(case.diffs) < min_diffs:
      skipped[why or "too_few_diffs"] += 1
      continue
    cases.append(case)
  if stats is not None:
    stats.update(candidates=len(candidates), kept=len(cases), skipped=dict(skipped))
  return cases


# ---------------------------------------------------------------- procedural


_NAMES = ("total", "count", "index", "value", "items", "result", "offset", "limit",
          "buffer", "state", "cache", "score", "delta", "width", "height", "node")
_OPS = ("+", "-", "*", "//", "%")


def _statement(rng: random.Random, indent: str = "  ") -> str:
  target, left, right = rng.choice(_NAMES), rng.choice(_NAMES), rng.choice(_NAMES)
  kind = rng.random()
  if kind < 0.5:
    return f"{indent}{target} = {left} {rng.choice(_OPS)} {rng.randint(1, 99)}\n"
  if kind < 0.75:
    return f"{indent}{target} = {left} {rng.choice(_OPS)} {right}\n"
  if kind < 0.9:
    return f"{indent}if {left} > {rng.randint(0, 50)}:\n{indent}  {target} += 1\n"
  return f"{indent}{target} = helper_{rng.randint(0, 9)}({left}, {right})\n"


def _function(rng: random.Random, number: int) -> list[str]:
  args = ", ".join(rng.sample(_NAMES, rng.randint(1, 3)))
  body = [_statement(rng) for _ in range(rng.randint(2, 6))]
  return [f"def step_{number}({args}):\n", *body, f"  return {rng.choice(_NAMES)}\n", "\n"]


def _edit(rng: random.Random, lines: list[str], next_function: list[int]) -> list[str]:
  lines = list(lines)
  op = rng.choice(("insert", "delete", "rewrite", "move", "append"))
  body = [i for i, line in enumerate(lines) if line.startswith("  ")]
  if op == "insert" or not body:
    lines.insert(rng.randint(0, len(lines)), _statement(rng))
  elif op == "delete":
    del lines[rng.choice(body)]
  elif op == "rewrite":
    index = rng.choice(body)
    lines[index] = _statement(rng)
  elif op == "move":
    start = rng.randrange(len(lines))
    block = lines[start:start + rng.randint(1, 4)]
    del lines[start:start + len(block)]
    at = rng.randint(0, len(lines))
    lines[at:at] = block
  else:
    lines.extend(_function(rng, next_function[0]))
    next_function[0] += 1
  return lines


def procedural_cases(count: int, *, seed: int = 0, num_diffs: tuple[int, int] = (2, 6),
                     num_functions: tuple[int, int] = (2, 5),
                     edits_per_diff: tuple[int, int] = (1, 3)) -> list[Case]:
  """`count` generated cases; the same arguments give the same cases. Ranges are
  inclusive (low, high)."""
  for name, (low, high) in (("num_diffs", num_diffs), ("num_functions", num_functions),
                            ("edits_per_diff", edits_per_diff)):
    if not 1 <= low <= high:
      raise ValueError(f"procedural_cases {name} = {(low, high)}; use 1 <= low <= high.")
  cases = []
  for index in range(count):
    rng = random.Random(f"c2jax-state-tracking:{seed}:{index}")
    functions = rng.randint(*num_functions)
    lines = [f"# module {index} generated with seed {seed}\n", "\n"]
    for number in range(functions):
      lines += _function(rng, number)
    path = f"generated/module_{seed}_{index}.py"
    initial = state = "".join(lines)
    patches, next_function, wanted = [], [functions], rng.randint(*num_diffs)
    while len(patches) < wanted:
      for _ in range(rng.randint(*edits_per_diff)):
        lines = _edit(rng, lines, next_function)
      new = "".join(lines)
      if new != state:
        patches.append(diffs_lib.make(state, new, path))
        state = new
    cases.append(Case(f"procedural:{seed}:{index}", path, initial, tuple(patches), state,
                      "procedural", {"seed": seed, "index": index}))
  return cases
