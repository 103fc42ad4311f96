"""SWE-bench-format instances against one local git clone of their repository.

The official JSONL names a `base_commit` per instance but ships no code. With
`suite.args.repo_dir` (a clone holding those commits) each instance's snapshot is
exported once with `git archive <base_commit>` into OUT/repos/<instance_id>, the layout
`c2jax.env.tasks.load_swebench_jsonl` reads. With `suite.args.repos_root` the checkouts
already exist there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile


def _git(repo_dir: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run(["git", "-C", repo_dir, *args], capture_output=True, timeout=600)


def export_snapshots(jsonl_path: str, repo_dir: str, out_root: str) -> str:
  """Writes out_root/<instance_id> at each instance's base_commit; returns out_root."""
  if _git(repo_dir, "rev-parse", "--git-dir").returncode != 0:
    raise ValueError(f"config.suite.args.repo_dir = {repo_dir!r} is not a git repository; "
                     "clone the instances' repository there.")
  os.makedirs(out_root, exist_ok=True)
  with open(jsonl_path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  for number, record in enumerate(records, 1):
    dest = os.path.join(out_root, record["instance_id"])
    if os.path.isdir(dest):
      continue
    commit = record.get("base_commit")
    if not commit:
      raise ValueError(f"{jsonl_path}:{number} has no base_commit; repo_dir needs one.")
    archive = _git(repo_dir, "archive", "--format=tar", commit)
    if archive.returncode != 0:
      raise ValueError(f"{jsonl_path}:{number}: base_commit {commit} is not in {repo_dir} "
                       f"({archive.stderr.decode()[-300:].strip()}); fetch it first.")
    staging = tempfile.mkdtemp(prefix=".export-", dir=out_root)
    with tempfile.TemporaryFile() as blob:
      blob.write(archive.stdout)
      blob.seek(0)
      with tarfile.open(fileobj=blob) as tar:
        tar.extractall(staging, filter="data")
    os.rename(staging, dest)  # whole snapshots only: a killed export is redone
  for leftover in os.listdir(out_root):
    if leftover.startswith(".export-"):
      shutil.rmtree(os.path.join(out_root, leftover), ignore_errors=True)
  return out_root
