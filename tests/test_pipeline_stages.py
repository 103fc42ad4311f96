"""c2jax.pipeline.prepare: a config's stages are checked as a chain and pointed at each
other before any stage runs (the stages themselves run in tests/train/test_pipeline_command.py)."""

import pathlib

import pytest

from c2jax import config as configlib
from c2jax import pipeline

REPO = pathlib.Path(__file__).resolve().parents[1]


def tiny(name="pipeline.py", variant="tiny"):
  return configlib.load_config_file(REPO / "configs" / name, variant)


def test_eval_scores_the_last_trained_stage(tmp_path):
  cfg = tiny()
  pipeline.prepare(cfg, tmp_path)
  assert cfg.stages[-1] == "eval" and cfg.eval.policy.kind == "engine"
  assert cfg.eval.policy.run == str(tmp_path / "sft")
  assert cfg.sft.init_from == str(tmp_path / "longctx")
  rl = tiny("agent_sft.py", "tiny_rl")
  rl.eval = tiny().eval
  rl.eval.agent.tools = tuple(rl.traces.tools)
  rl.stages = tuple(rl.stages) + ("eval",)
  pipeline.prepare(rl, tmp_path)
  assert rl.eval.policy.run == str(tmp_path / "rl")  # after RL, the RL run is scored


@pytest.mark.parametrize("change, key, message", [
    (lambda c: setattr(c, "stages", ("pretrain", "eval", "sft")), "stages",
     "rl and eval must come last"),
    (lambda c: setattr(c.eval.policy, "kind", "oracle"), "eval.policy.kind",
     "set it to 'engine'"),
    (lambda c: setattr(c.eval.agent, "tools", ("read_file", "finish")), "eval.agent.tools",
     "differs from config.traces.tools"),
    (lambda c: setattr(c.eval.suite, "name", "nope"), "eval.suite.name", "nope"),
    (lambda c: setattr(c, "eval", tiny().pretrain), "eval", "is not an eval job config"),
])
def test_a_bad_chain_is_refused_naming_the_key(tmp_path, change, key, message):
  cfg = tiny()
  change(cfg)
  with pytest.raises(configlib.ConfigError, match=message) as err:
    pipeline.prepare(cfg, tmp_path)
  assert err.value.key == key


def test_a_preempted_stage_is_not_recorded_and_stops_the_pipeline(tmp_path, monkeypatch):
  """A stage stopped by SIGTERM (its job returns `preempted`) gets no result record, the
  stages after it do not start, ROOT is marked preempted (what a sweep reads), and the
  rerun resumes that stage, then goes on."""
  from c2jax import preemption  # pylint: disable=g-import-not-at-top

  ran = []

  def stage_job(cfg, stage, workdir):
    ran.append(stage)
    if stage == "longctx" and ran.count("longctx") == 1:
      return {"steps": 3, "preempted": 3}
    return {"steps": 5, "preempted": None}

  monkeypatch.setattr(pipeline, "_run_stage", stage_job)
  cfg = tiny()
  cfg.stages = ("pretrain", "longctx", "sft")
  monkeypatch.setattr(pipeline, "prepare", lambda cfg, root: None)
  summary = pipeline.run(cfg, tmp_path)
  assert summary["preempted"] == "longctx" and ran == ["pretrain", "longctx"]
  assert (tmp_path / "pretrain" / pipeline.RESULT).exists()
  assert not (tmp_path / "longctx" / pipeline.RESULT).exists()
  assert preemption.was_preempted(tmp_path)
  summary = pipeline.run(cfg, tmp_path)
  assert ran == ["pretrain", "longctx", "longctx", "sft"]  # pretrain from its record
  assert "preempted" not in summary and not preemption.was_preempted(tmp_path)
