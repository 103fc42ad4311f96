"""Sweep files: expansion, run-directory names, override checks, metrics and the table
(no point runs here; tests/sweep/test_sweep_runs.py runs them)."""

import json
import pathlib
import subprocess
import sys

import pytest

from c2jax import sweep
from c2jax.sweep import runner, spec, table

REPO = pathlib.Path(__file__).resolve().parents[2]
SMOKE_SWEEP = '''
from c2jax import sweep

def get_sweep(arg=None):
  return sweep.Sweep(verb="smoke", config="configs/smoke.py:tiny",
                     run_args=("--metrics={{run_dir}}/metrics.jsonl",),
                     {body},
                     metrics={{"loss": sweep.last("loss")}})
'''


def write_sweep(tmp_path, body, name="s.py"):
  path = tmp_path / name
  path.write_text(SMOKE_SWEEP.format(body=body))
  return path


def test_grid_expands_in_order_with_stable_names():
  plan = sweep.load(str(REPO / "experiments/sweeps/tiny_lr_width.py"))
  assert plan.axes == ("train.learning_rate", "model.hidden_size")
  assert [p.name for p in plan.points] == [
      "learning_rate=0.001,hidden_size=32", "learning_rate=0.001,hidden_size=64",
      "learning_rate=0.003,hidden_size=32", "learning_rate=0.003,hidden_size=64"]
  assert plan.points[1].config.model.hidden_size == 64
  assert plan.points[1].config.train.steps == 40  # fixed overrides reach every point
  again = sweep.load(str(REPO / "experiments/sweeps/tiny_lr_width.py"))
  assert [p.name for p in again.points] == [p.name for p in plan.points]
  command = plan.command(plan.points[0], pathlib.Path("/w/r"))
  assert command[2:5] == ["c2jax.cli", "pretrain", f"--config={REPO}/configs/pretrain.py:tiny"]
  assert "--config.train.learning_rate=0.001" in command and command[-1] == "--workdir=/w/r"


def test_points_list_axes_are_the_varying_keys():
  plan = sweep.load(str(REPO / "experiments/sweeps/scaling_tiny.py") + ":test")
  assert plan.axes == ("model.hidden_size", "model.intermediate_size", "train.steps")
  assert len(plan.points) == 4
  assert plan.points[3].name == "hidden_size=64,intermediate_size=192,steps=6"


def test_names_hash_unsafe_characters_and_disambiguate_keys():
  shown = spec._short_names(["model.intermediate_size", "model.moe.intermediate_size", "seed"])
  assert shown == {"model.intermediate_size": "model.intermediate_size",
                   "model.moe.intermediate_size": "moe.intermediate_size", "seed": "seed"}
  a = spec.point_name({"data.cache_dir": "cache/a b"}, {"data.cache_dir": "cache_dir"})
  b = spec.point_name({"data.cache_dir": "cache/a_b"}, {"data.cache_dir": "cache_dir"})
  assert a != b and "/" not in a and " " not in a


def test_unknown_key_names_point_and_key(tmp_path):
  path = write_sweep(tmp_path, 'grid={"steps": [2], "model.hiden_size": [16, 32]}')
  with pytest.raises(sweep.SweepError, match=r"point steps=2,hiden_size=16 .*config\.model\."
                     r"hiden_size is not a key"):
    sweep.load(str(path))


def test_wrong_type_and_bad_shapes_are_caught(tmp_path):
  with pytest.raises(sweep.SweepError, match=r"config\.steps = 'many'"):
    sweep.load(str(write_sweep(tmp_path, 'grid={"steps": ["many"]}')))
  with pytest.raises(sweep.SweepError, match="exactly one of grid"):
    sweep.load(str(write_sweep(tmp_path, 'grid={"steps": [2]}, points=[{"steps": 3}]')))
  with pytest.raises(sweep.SweepError, match="non-empty list"):
    sweep.load(str(write_sweep(tmp_path, 'grid={"steps": 2}')))
  with pytest.raises(sweep.SweepError, match="are the same point"):
    sweep.load(str(write_sweep(tmp_path, 'points=[{"steps": 2}, {"steps": 2}, {"steps": 3}]')))
  bad_verb = tmp_path / "v.py"
  bad_verb.write_text(write_sweep(tmp_path, 'grid={"steps": [2]}').read_text()
                      .replace('verb="smoke"', 'verb="pretrian"'))
  with pytest.raises(sweep.SweepError, match="'pretrian' is not a c2jax verb"):
    sweep.load(str(bad_verb))
  with pytest.raises(sweep.SweepError, match="no get_sweep"):
    (tmp_path / "empty.py").write_text("X = 1\n")
    sweep.load(str(tmp_path / "empty.py"))


def test_set_overrides_are_typed_and_checked(tmp_path):
  path = write_sweep(tmp_path, 'grid={"steps": [2, 3]}')
  plan = sweep.load(str(path), ["learning_rate=0.5", "model.name=x", "seq_len=16"])
  assert plan.points[0].config.learning_rate == 0.5
  assert plan.points[0].config.seq_len == 16 and plan.points[0].config.model.name == "x"
  assert "--config.seq_len=16" in plan.command(plan.points[0], tmp_path)
  with pytest.raises(sweep.SweepError, match="config.nope is not a key"):
    sweep.load(str(path), ["nope=1"])
  with pytest.raises(sweep.SweepError, match="expected KEY=VALUE"):
    sweep.load(str(path), ["steps"])


def test_metrics_read_a_run_dir(tmp_path):
  rows = [{"step": 0, "eval_loss": 9.0}, {"step": 1, "loss": 5.0}, {"step": 2, "loss": 3.0},
          {"step": 3, "loss": "nan"}, {"step": 3, "eval_loss": 4.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"ste')
  (tmp_path / "summary.json").write_text(json.dumps({"overall": {"accuracy": 0.25}}))
  plan = sweep.load(str(REPO / "experiments/sweeps/tiny_lr_width.py"))
  config = plan.points[0].config
  assert sweep.last("eval_loss").collect(tmp_path, config) == 4.0
  assert sweep.minimum("loss").collect(tmp_path, config) == 3.0
  assert sweep.maximum("loss").collect(tmp_path, config) == 5.0
  assert sweep.at_step("loss", 1).collect(tmp_path, config) == 5.0
  assert sweep.from_json("summary.json", "overall.accuracy").collect(tmp_path, config) == 0.25
  assert sweep.config_value("train.learning_rate").collect(tmp_path, config) == 0.001
  assert sweep.tokens().collect(tmp_path, config) == 40 * 8 * 128
  n_active = sweep.active_params().collect(tmp_path, config)
  assert sweep.compute_6nd().collect(tmp_path, config) == 6 * n_active * 40 * 8 * 128
  assert sweep.train_flops().collect(tmp_path, config) > 0
  with pytest.raises(sweep.MetricMissing, match=r"'acc'.*it has \['eval_loss', 'loss'\]"):
    sweep.last("acc").collect(tmp_path, config)
  with pytest.raises(sweep.MetricMissing, match="not logged at step 7"):
    sweep.at_step("loss", 7).collect(tmp_path, config)


def test_table_keeps_every_point_and_plots(tmp_path):
  plan = sweep.load(str(REPO / "experiments/sweeps/tiny_lr_width.py"))
  statuses = {}
  for i, point in enumerate(plan.points):
    directory = runner.run_dir(tmp_path, point)
    directory.mkdir(parents=True)
    if i == 3:
      statuses[point.name] = "failed"
      continue
    statuses[point.name] = "done"
    (directory / runner.DONE_FILE).write_text(json.dumps({"seconds": 1.5}))
    (directory / "metrics.jsonl").write_text(
        json.dumps({"step": 40, "loss": 1.0 + i, "eval_loss": 2.0 + i}) + "\n")
  said = []
  out = table.write(plan, tmp_path, statuses, run_dir=lambda p: runner.run_dir(tmp_path, p),
                    say=said.append)
  rows = sweep.read(tmp_path)
  assert [r["status"] for r in rows] == ["done", "done", "done", "failed"]
  assert [r["eval_loss"] for r in rows] == [2.0, 3.0, 4.0, None]
  assert rows[1]["model.hidden_size"] == 64 and rows[2]["train.learning_rate"] == 0.003
  assert rows[0]["train_flops"] > 0 and rows[0]["seconds"] == 1.5
  header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
  assert header[:4] == ["point", "status", "train.learning_rate", "model.hidden_size"]
  assert sorted(pathlib.Path(p).name for p in out["plots"]) == [
      "eval_loss.png", "loss.png", "min_loss.png", "train_flops.png"]
  assert all(pathlib.Path(p).stat().st_size > 5000 for p in out["plots"])


def test_cli_dry_run_lists_points_and_rejects_bad_files(tmp_path):
  env_cmd = [sys.executable, "-m", "c2jax.cli", "sweep"]
  result = subprocess.run(env_cmd + ["experiments/sweeps/tiny_lr_width.py",
                                     f"--workdir={tmp_path}", "--dry_run"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.count("pending ") == 4
  assert "--config.train.learning_rate=0.003" not in result.stdout  # only the first command
  assert f"--workdir={tmp_path}/runs/learning_rate=0.001,hidden_size=32" in result.stdout
  assert not (tmp_path / "runs").exists()
  bad = write_sweep(tmp_path, 'grid={"model.hiden_size": [16]}')
  result = subprocess.run(env_cmd + [str(bad), f"--workdir={tmp_path}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert "config.model.hiden_size is not a key" in result.stderr
  assert "Traceback" not in result.stderr


def test_set_may_not_touch_an_axis_and_metrics_may_not_shadow_columns(tmp_path):
  path = write_sweep(tmp_path, 'grid={"steps": [2, 3]}, fixed={"seq_len": 8}')
  with pytest.raises(sweep.SweepError, match="sweeps config.steps"):
    sweep.load(str(path), ["steps=4"])
  plan = sweep.load(str(path), ["seq_len=16"])  # the command line wins over fixed=
  assert plan.points[1].config.seq_len == 16 and plan.points[1].config.steps == 3
  shadow = tmp_path / "shadow.py"
  shadow.write_text(path.read_text().replace('"loss": sweep', '"status": sweep'))
  with pytest.raises(sweep.SweepError, match="its own column"):
    sweep.load(str(shadow))


def test_errors_inside_the_sweep_file_are_reported_as_its_own():
  with pytest.raises(sweep.SweepError, match=r"get_sweep\('huge'\) raised ValueError: "
                     r"scaling_tiny.py:huge: expected one of \['default', 'test'\]"):
    sweep.load(str(REPO / "experiments/sweeps/scaling_tiny.py") + ":huge")


def _jsonl(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_pipeline_sweep_reads_each_stage_of_a_chain(tmp_path):
  """experiments/sweeps/fig2_chain.py: CPT -> SFT -> RL per point; one row has every
  stage's number."""
  plan = sweep.load(str(REPO / "experiments/sweeps/fig2_chain.py:test"))
  assert plan.sweep.verb == "pipeline" and plan.axes == ("pretrain.train.steps",)
  assert [p.config.pretrain.train.steps for p in plan.points] == [1, 2, 4]
  assert tuple(plan.points[0].config.stages) == ("pretrain", "traces", "sft", "rl")
  point = plan.points[2]
  root = runner.run_dir(tmp_path, point)
  _jsonl(root / "pretrain" / "metrics.jsonl", [{"step": 4, "loss": 6.0},
                                               {"step": 4, "eval_loss": 6.5}])
  _jsonl(root / "sft" / "metrics.jsonl", [{"step": 2, "eval_loss": 3.25}])
  # RL: rewards of four steps (the last quarter is step 4), the held-out eval at the end.
  _jsonl(root / "rl" / "metrics.jsonl", [{"step": s, "reward": 0.1 * s} for s in (1, 2, 3, 4)]
         + [{"step": 4, "eval/pass_rate": 0.5}])
  (root / "summary.json").write_text(json.dumps({"rl": {"eval": {"pass_rate": 0.5}}}))
  said = []
  rows = table.collect(plan, {p.name: "done" if p is point else "failed" for p in plan.points},
                       lambda p: runner.run_dir(tmp_path, p), said.append)
  row = rows[2]
  assert row["cpt_loss"] == 6.5 and row["sft_loss"] == 3.25
  assert row["rl_reward"] == pytest.approx(0.4) and row["heldout_pass_rate"] == 0.5
  # Compute from the pretrain section: 6 x active parameters x its own 4 steps of tokens.
  cpt = point.config.pretrain
  tokens = 4 * cpt.train.batch_size * cpt.train.seq_len
  assert row["cpt_compute"] == 6 * sweep.active_params().collect(root, cpt) * tokens
  assert rows[0]["cpt_loss"] is None and not said
  with pytest.raises(sweep.MetricMissing, match=r"rl/metrics.jsonl has 'loss'|no row"):
    sweep.last("loss", stage="rl").collect(root, point.config)
  assert sweep.mean_tail("reward", 0.5, stage="rl").collect(root, point.config) == (
      pytest.approx(0.35))


def test_stage_metrics_need_a_pipeline_that_runs_the_stage(tmp_path):
  path = tmp_path / "chain.py"
  path.write_text('''
from c2jax import sweep

def get_sweep(arg=None):
  return sweep.Sweep(verb=arg or "pipeline", config="configs/agent_sft.py:tiny",
                     points=[{"sft.train.steps": 2}],
                     metrics={"reward": sweep.last("reward", stage="rl")})
''')
  with pytest.raises(sweep.SweepError, match=r"stage 'rl'.*point base does not run.*"
                                             r"\('traces', 'sft'\)"):
    sweep.load(str(path))
  assert sweep.load(str(path), ["stages=('traces', 'sft', 'rl')"]).points[0].name == "base"
  with pytest.raises(sweep.SweepError, match="run `c2jax rl`, not a pipeline"):
    sweep.load(f"{path}:rl")
  with pytest.raises(ValueError, match="name one pipeline stage"):
    sweep.last("loss", stage="")
