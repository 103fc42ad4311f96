"""`c2jax sweep` end to end on CPU: a 2x2 compute ladder of `tiny` pretraining is killed
mid-way (SIGKILL of the runner), resumes without rerunning finished points, and its table
has every point; the notebooks execute on it; a failing point is reported while the others
finish."""

import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from c2jax import sweep

pytestmark = pytest.mark.slow
REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "experiments" / "notebooks"
SWEEP = "experiments/sweeps/scaling_tiny.py:test"


def tiny_settings(data_cache):
  """One small corpus and tokenizer shared by every point; short, small batches."""
  return [f"--set=data.cache_dir={data_cache}", "--set=data.vocab_size=1024",
          "--set=model.vocab_size=1024", "--set=data.max_total_bytes=4000000",
          "--set=data.tokenizer_train_bytes=300000", "--set=train.seq_len=32",
          "--set=train.batch_size=4", "--set=train.log_every=1"]


def sweep_command(workdir, data_cache, parallel=2):
  return [sys.executable, "-m", "c2jax.cli", "sweep", SWEEP, f"--workdir={workdir}",
          f"--parallel={parallel}", *tiny_settings(data_cache)]


def run_dirs(workdir):
  return sorted(p for p in (workdir / "runs").iterdir() if p.is_dir())


def lock_is_free(run_dir):
  with open(run_dir / ".sweep.lock", "a+") as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      return True
    except BlockingIOError:
      return False


def launches(workdir):
  return [json.loads(l)["point"] for l in (workdir / "launches.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, data_cache):
  # The suite's data cache: the job tests' corpus and tokenizer (the same settings) are
  # built once for all of them.
  workdir = tmp_path_factory.mktemp("sweep") / "sweep"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  runner = subprocess.Popen(sweep_command(workdir, data_cache), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 900
  while time.time() < deadline and runner.poll() is None:
    dirs = run_dirs(workdir) if (workdir / "runs").exists() else []
    done = [d for d in dirs if (d / "sweep_done.json").exists()]
    # A running point has saved a checkpoint: killing now leaves one to resume from.
    resumable = [d for d in dirs if d not in done and (d / "checkpoints" / "2").is_dir()]
    if done and resumable:
      break
    time.sleep(0.1)
  runner.send_signal(signal.SIGKILL)
  first_output = runner.communicate()[0]
  done_before = {d.name: (d / "sweep_done.json").stat().st_mtime_ns for d in run_dirs(workdir)
                 if (d / "sweep_done.json").exists()}
  unfinished = [d for d in run_dirs(workdir) if d.name not in done_before]
  checkpointed = [d for d in unfinished if (d / "checkpoints" / "2").is_dir()]
  assert done_before and unfinished, f"the sweep was not killed mid-way:\n{first_output}"
  # The points the runner had started died with it (their lock is released).
  for directory in unfinished:
    until = time.time() + 30
    while not lock_is_free(directory) and time.time() < until:
      time.sleep(0.2)
    assert lock_is_free(directory), f"{directory.name} outlived the killed runner"
  launched_before = launches(workdir)
  resumed = subprocess.run(sweep_command(workdir, data_cache), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=900)
  return dict(workdir=workdir, done_before=done_before, unfinished=unfinished,
              checkpointed=checkpointed,
              launched_before=launched_before, resumed=resumed, first_output=first_output)


def test_resume_skips_finished_points_and_tables_every_point(killed_and_resumed):
  k = killed_and_resumed
  workdir, resumed = k["workdir"], k["resumed"]
  assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
  assert f"{len(k['done_before'])} already done" in resumed.stdout
  relaunched = launches(workdir)[len(k["launched_before"]):]
  assert not set(relaunched) & set(k["done_before"])  # finished points never rerun
  all_points = {p.name for p in sweep.load(str(REPO / SWEEP)).points}
  assert sorted(relaunched) == sorted(all_points - set(k["done_before"]))  # each once
  for name, mtime in k["done_before"].items():
    assert (workdir / "runs" / name / "sweep_done.json").stat().st_mtime_ns == mtime
  # A point killed after its step-2 checkpoint resumed from it instead of starting over.
  assert k["checkpointed"]
  assert all("resume: step" in (d / "sweep.log").read_text() for d in k["checkpointed"])
  rows = sweep.read(workdir)
  assert len(rows) == 4 and all(r["status"] == "done" for r in rows)
  assert sorted((r["model.hidden_size"], r["train.steps"]) for r in rows) == [
      (32, 3), (32, 6), (64, 3), (64, 6)]
  assert all(0 < r["eval_loss"] < 8 and r["train_flops"] > 0 for r in rows)
  longer = {r["model.hidden_size"]: r["tokens"] for r in rows if r["train.steps"] == 6}
  assert longer == {32: 6 * 4 * 32, 64: 6 * 4 * 32}
  csv_lines = (workdir / "results.csv").read_text().splitlines()
  assert len(csv_lines) == 5 and csv_lines[0].startswith("point,status,model.hidden_size")
  assert (workdir / "plots" / "eval_loss.png").stat().st_size > 5000
  assert "4/4 done" in resumed.stdout and "ETA" in resumed.stdout


def execute(notebook, **env):
  import nbclient
  import nbformat

  book = nbformat.read(notebook, as_version=4)
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update({k: str(v) for k, v in env.items()})  # the kernel inherits them
  try:
    nbclient.NotebookClient(book, timeout=300, kernel_name="python3").execute()
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
  return "".join(o.get("text", "") for c in book.cells if c.cell_type == "code"
                 for o in c.outputs)


def test_scaling_notebook_fits_the_sweep(killed_and_resumed, tmp_path):
  out = execute(NOTEBOOKS / "scaling_laws.ipynb", SWEEP_DIR=killed_and_resumed["workdir"],
                OUT_DIR=tmp_path, BOOTSTRAP=50)
  fit = json.loads((tmp_path / "scaling_fit.json").read_text())
  assert fit["points"] == 4 and fit["compute_column"] == "train_flops"
  assert "over 4 points" in out
  assert set(fit["params"]) == {"E", "A0", "alpha", "A"}
  assert (tmp_path / "scaling_law.png").stat().st_size > 5000


def test_scaling_notebook_recovers_a_known_law(tmp_path):
  # A table on an exact law L = 1.5 + 40 * C^-0.3 (what the fit must give back).
  compute = [1e6 * 2.0 ** i for i in range(8)]
  rows = [{"point": f"p{i}", "status": "done", "eval_loss": 1.5 + 40 * c ** -0.3,
           "compute_6nd": c} for i, c in enumerate(compute)]
  (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  # The README's command as a user types it: nbclient's `jupyter execute` from the venv.
  jupyter = pathlib.Path(sys.executable).parent / "jupyter"
  env = dict(os.environ, SWEEP_DIR=str(tmp_path), COMPUTE_COLUMN="compute_6nd", BOOTSTRAP="20")
  done = subprocess.run([str(jupyter), "execute", "experiments/notebooks/scaling_laws.ipynb"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  fit = json.loads((tmp_path / "scaling_fit.json").read_text())["params"]
  assert fit["E"]["value"] == pytest.approx(1.5, rel=1e-3)
  assert fit["alpha"]["value"] == pytest.approx(0.3, rel=1e-3)
  assert fit["A"]["value"] == pytest.approx(40, rel=1e-2)


def test_cpt_to_rl_notebook_fits_reward_against_loss(killed_and_resumed, tmp_path):
  # Known answer: reward = 0.9 - 0.3 * cpt_loss exactly, sft_loss = cpt_loss + a wobble.
  rows = [{"status": "done", "cpt_loss": c, "sft_loss": c + 0.1 * (i % 2),
           "rl_reward": 0.9 - 0.3 * c} for i, c in enumerate([1.5, 1.7, 1.9, 2.1, 2.3])]
  (tmp_path / "findings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  out = execute(NOTEBOOKS / "cpt_to_rl.ipynb", SWEEP_DIR=tmp_path / "findings.jsonl")
  fits = json.loads((tmp_path / "cpt_to_rl_fit.json").read_text())["fits"]
  assert fits["cpt_loss"]["slope"] == pytest.approx(-0.3)
  assert fits["cpt_loss"]["points"] == 5 and fits["sft_loss"]["slope"] < 0
  assert "over 5 points" in out and "as in the report" in out
  # On the sweep's own table (train loss -> held-out loss stands in for the columns).
  out_dir = tmp_path / "sweep_fit"
  execute(NOTEBOOKS / "cpt_to_rl.ipynb", SWEEP_DIR=killed_and_resumed["workdir"],
          X_COLUMNS="loss", Y_COLUMN="eval_loss", OUT_DIR=out_dir)
  assert json.loads((out_dir / "cpt_to_rl_fit.json").read_text())["fits"]["loss"]["points"] == 4


SMOKE_SWEEP = '''
from c2jax import sweep

def get_sweep(arg=None):
  return sweep.Sweep(verb="smoke", config="{repo}/configs/smoke.py:tiny",
                     run_args=("--metrics={{run_dir}}/metrics.jsonl",),
                     fixed={{"steps": 2, "batch_size": 2, "seq_len": 16, "log_every": 1}},
                     points=[{{"learning_rate": 0.001}},
                             {{"learning_rate": 0.002, "model.attention": "bogus"}},
                             {{"learning_rate": 0.003}}],
                     metrics={{"loss": sweep.last("loss"), "first": sweep.at_step("loss", 1)}})
'''


def test_failing_point_is_reported_and_the_others_finish(tmp_path):
  path = tmp_path / "smoke_sweep.py"
  path.write_text(SMOKE_SWEEP.format(repo=REPO))
  said = []
  plan = sweep.load(str(path))
  summary = sweep.run(plan, tmp_path / "out", parallel=2, say=said.append)
  bad = "learning_rate=0.002,attention=bogus"
  assert summary["failed"] == [bad] and summary["done"] == 2
  log = tmp_path / "out" / "runs" / bad / "sweep.log"
  report = "\n".join(said)
  assert f"FAILED {bad} (exit 2); log {log}" in report
  assert "config.model.attention" in report  # the log's tail shows why
  rows = {r["point"]: r for r in sweep.read(tmp_path / "out")}
  assert rows[bad]["status"] == "failed" and rows[bad]["loss"] is None
  good = [r for name, r in rows.items() if name != bad]
  assert all(r["status"] == "done" and r["loss"] > 0 and r["first"] > 0 for r in good)
  # The command exits non-zero while a point is failed, and retries only that point.
  result = subprocess.run([sys.executable, "-m", "c2jax.cli", "sweep", str(path),
                           f"--workdir={tmp_path / 'out'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 1
  assert launches(tmp_path / "out").count(bad) == 2 and len(launches(tmp_path / "out")) == 4
