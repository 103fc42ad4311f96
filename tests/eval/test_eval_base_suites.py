"""The base-model suites (codebase_ppl, state_tracking) through `c2jax eval`: a random
`tiny` model saved as an HF directory, a little repository, results, resume, report."""

import json
import math
import os
import subprocess
import sys

import jax
import pytest

from c2jax import config as configlib
from c2jax import model
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.eval import report, runner
from c2jax.eval.base import perplexity
from c2jax.hf import convert
from c2jax.model import variants

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "base"))
from evalbase_testlib import REPO, write_repo  # pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "configs"))
import eval as eval_config  # pylint: disable=wrong-import-position,redefined-builtin


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("hf")
  cfg = variants.get("tiny")
  convert.save(cfg, model.init(cfg, jax.random.key(0)), directory)
  texts = [v for v in REPO.values() if isinstance(v, str)] * 10
  tokenizer_lib.train_bpe(texts + ["def f(a, b):\n  x = a + b\n  return x\n"] * 10,
                          320).save(directory / "tokenizer.json")
  return directory


def _cli(config_arg, workdir, *overrides):
  proc = subprocess.run(
      [sys.executable, "-c", "from c2jax.cli import run; run()", "eval",
       f"--config={ROOT}/configs/eval.py:{config_arg}", f"--workdir={workdir}",
       "--config.eval.progress=false", *overrides],
      env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _config(config_arg, **overrides):
  cfg = eval_config.get_config(config_arg)
  for key, value in overrides.items():
    node, *path = key.split(".")
    target = cfg[node]
    for part in path[:-1]:
      target = target[part]
    target[path[-1]] = value
  return cfg


def _records(workdir):
  return [json.loads(l) for l in (workdir / "results.jsonl").read_text().splitlines()]


def test_codebase_ppl_matches_the_base_eval_and_resumes(tmp_path, hf_dir):
  repo = write_repo(tmp_path / "repo")
  workdir = tmp_path / "ppl"
  printed = _cli("codebase_ppl,tiny", workdir, f"--config.policy.run={hf_dir}",
                 f"--config.suite.args.repo={repo}", "--config.suite.args.window=16",
                 "--config.suite.args.stride=8", "--config.suite.args.batch_size=4")
  records = _records(workdir)
  assert sorted(r["task_id"] for r in records) == ["README.md", "a/main.py", "b/util.py"]
  # The same numbers as the plain function of c2jax/eval/base on the same model.
  from c2jax.eval.engine_policy import load_run  # pylint: disable=g-import-not-at-top
  model_cfg, params, tok = load_run(str(hf_dir))
  direct = perplexity.codebase_perplexity(model_cfg, params, tok, repo, window=16, stride=8,
                                          batch_size=4)
  metrics = json.loads((workdir / "summary.json").read_text())["metrics"]
  assert metrics["tokens"] == direct.tokens and metrics["files"] == 3
  assert metrics["perplexity"] == pytest.approx(direct.perplexity, rel=1e-5)
  assert metrics["bits_per_byte"] == pytest.approx(direct.bits_per_byte, rel=1e-5)
  assert printed["perplexity"] == pytest.approx(direct.perplexity, rel=1e-5)
  for f in direct.files:
    assert metrics["per_file"][f.path]["nll"] == pytest.approx(f.nll, rel=1e-4, abs=1e-4)
  assert metrics["perplexity"] == pytest.approx(
      math.exp(sum(r["nll"] for r in records) / sum(r["tokens"] for r in records)))

  # Resume: a lost line is scored again and only it is appended; a full file is left alone.
  lines = (workdir / "results.jsonl").read_text().splitlines(True)
  (workdir / "results.jsonl").write_text("".join(lines[:-1]))
  cfg = _config("codebase_ppl,tiny", **{
      "policy.run": str(hf_dir), "suite.args.repo": str(repo), "suite.args.window": 16,
      "suite.args.stride": 8, "suite.args.batch_size": 4, "eval.progress": False})
  runner.run(cfg, str(workdir))
  again = _records(workdir)
  assert [r["task_id"] for r in again] == [json.loads(l)["task_id"] for l in lines]
  assert again[-1]["nll"] == pytest.approx(json.loads(lines[-1])["nll"], rel=1e-5)
  runner.run(cfg, str(workdir))
  assert len(_records(workdir)) == 3

  out = report.write_report([str(workdir)], str(tmp_path / "report"))
  table = out["markdown"].read_text()
  assert "codebase_ppl" in table and "perplexity" in table and "bits_per_byte" in table


@pytest.mark.slow
def test_state_tracking_on_the_engine_resumes(tmp_path, hf_dir):
  workdir = tmp_path / "st"
  _cli("state_tracking,tiny", workdir, f"--config.policy.run={hf_dir}")
  records = _records(workdir)
  assert len(records) == 3 and all(r["infra_error"] is None for r in records)
  for r in records:
    assert 0.0 <= r["score"] <= 1.0 and r["exact"] == (r["score"] == 1.0)
    assert 1 <= r["completion_tokens"] <= 48 and r["prompt_tokens"] > 50
  metrics = json.loads((workdir / "summary.json").read_text())["metrics"]
  assert metrics["cases"] == 3
  assert metrics["mean_score"] == pytest.approx(sum(r["score"] for r in records) / 3)
  assert metrics["mean_normalised_distance"] == pytest.approx(1 - metrics["mean_score"])
  cases = (workdir / "tasks" / "cases.jsonl").read_text()
  runner.run(_config("state_tracking,tiny", **{"policy.run": str(hf_dir),
                                                "eval.progress": False}), str(workdir))
  assert len(_records(workdir)) == 3
  assert (workdir / "tasks" / "cases.jsonl").read_text() == cases


def _git_repo(root):
  def git(*args):
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)
  root.mkdir()
  git("init", "-q")
  body = ["def f{0}(x):\n  return x + {0}\n\n".format(i) for i in range(6)]
  for version in range(4):
    (root / "mod.py").write_text("".join(body[:3 + version]))
    git("add", ".")
    git("commit", "-qm", f"v{version}")
  return root


def test_state_tracking_oracle_scores_one_on_git_and_generated_cases(tmp_path):
  repo = _git_repo(tmp_path / "git")
  cfg = _config("state_tracking", **{"policy.kind": "oracle", "suite.args.repo": str(repo),
                                     "eval.progress": False})
  summary = runner.run(cfg, str(tmp_path / "run"))
  assert summary["metrics"]["cases"] == 1 and summary["metrics"]["mean_score"] == 1.0
  (record,) = _records(tmp_path / "run")
  assert record["source"] == "git" and record["diffs"] == 3
  generated = runner.run(_config("state_tracking", **{"policy.kind": "oracle",
                                                       "eval.progress": False}),
                         str(tmp_path / "generated"))
  assert generated["metrics"]["cases"] == 16 and generated["metrics"]["exact_match"] == 1.0


def test_bad_settings_are_config_errors_before_any_model_loads(tmp_path):
  cfg = _config("codebase_ppl", **{"policy.kind": "openai", "policy.base_url": "http://x",
                                   "policy.model": "m", "suite.args.repo": str(tmp_path)})
  with pytest.raises(configlib.ConfigError, match="logits.*engine"):
    runner.validate(cfg)
  cfg = _config("codebase_ppl,run=/nowhere")
  assert cfg.policy.kind == "engine" and cfg.policy.run == "/nowhere"
  with pytest.raises(configlib.ConfigError, match="suite.args.repo: is empty"):
    runner.validate(cfg)
  cfg.suite.args.repo, cfg.suite.args.stride = str(tmp_path), cfg.suite.args.window
  with pytest.raises(configlib.ConfigError, match="suite.args.stride"):
    runner.validate(cfg)
  cfg = _config("state_tracking,run=/nowhere", **{"suite.args.repo": str(tmp_path),
                                                  "suite.args.cases_path": "x.jsonl"})
  with pytest.raises(configlib.ConfigError, match="both set"):
    runner.validate(cfg)
