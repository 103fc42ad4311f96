"""`c2jax data ...` end to end in a subprocess (flags are process-global in absl)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(*args):
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  return subprocess.run([sys.executable, "-m", "c2jax.cli", "data", *args],
                        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_build_then_tokenizer(tree, tmp_path):
  out = tmp_path / "corpus"
  result = _run("build", f"--out={out}", f"--sources={tree}/*",
                "--heldout-repositories=gamma", "--heldout-fraction=0",
                "--max-file-bytes=1000", "--noprogress")
  assert result.returncode == 0, result.stderr
  assert "heldout: 1 repositories, 3 documents" in result.stdout
  summary = json.loads((out / "summary.json").read_text())
  assert summary["splits"]["train"]["documents"] == 6
  result = _run("tokenizer", f"--corpus={out}", f"--out={tmp_path / 'tok.json'}",
                "--vocab-size=280")
  assert result.returncode == 0, result.stderr
  assert "tokenizer with 280 tokens" in result.stdout


def test_missing_flag_is_explained():
  result = _run("build")
  assert result.returncode != 0
  assert "c2jax data build: --out is required" in result.stderr


def test_unknown_sub_verb_lists_the_sub_verbs():
  from c2jax.commands import data as command  # no flags are read before the sub-verb check
  with pytest.raises(SystemExit, match="expected one sub-verb, got frobnicate") as e:
    command.main(["c2jax data", "frobnicate"])
  assert "tokenizer" in str(e.value)


def test_template_shows_the_trained_spans(tmp_path):
  fixtures = ROOT / "tests" / "fixtures" / "templates"
  case = next(c for c in json.loads((fixtures / "cases.json").read_text())["cases"]
              if c["name"] == "kimi/plain_chat")
  path = tmp_path / "sft.jsonl"
  path.write_text(json.dumps({"messages": case["messages"]}) + "\n")
  result = _run("template", f"--tokenizer-dir={fixtures / 'kimi'}", f"--messages={path}")
  assert result.returncode == 0, result.stderr
  assert "<|im_middle|>\u27e6Four.<|im_end|>\u27e7" in result.stdout
  assert f"--- {len(case['input_ids'])} tokens, {sum(case['assistant_masks'])} trained" in (
      result.stdout)
  result = _run("template", f"--tokenizer-dir={fixtures / 'kimi'}", f"--messages={path}",
                "--line=3")
  assert "--line=3 but" in result.stderr
