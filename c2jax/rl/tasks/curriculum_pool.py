"""The curriculum in `c2jax rl`: probe rollouts, and the running curriculum's pool feed.

`probe` rolls out every training prompt with the starting policy before the first step
(once per run; the results are kept in <workdir>/curriculum.json). The 'order'
curriculum reorders the pool by them; the 'running' one starts its statistics from them.

`PoolFeed` ('running' sampling): the training prompts live in tasks/train.jsonl, not in
the pool. The learner keeps `lookahead` draws pending or leased in the pool; a draw is a
pool task `<prompt>.draw<n>` (n counts every draw of the run, so a draw is never added
twice, even by a learner restarted from an older checkpoint) that actors lease, roll out
and complete exactly like a single-epoch prompt. Each group the learner trains is folded
into the statistics (`observe`), whose state is saved in the learner's checkpoint: after a
restart they hold exactly the groups its parameters were trained on, and the groups
trained after that checkpoint, which the queue hands out again, are observed again.
"""

from __future__ import annotations

import json
import time

import numpy as np

from c2jax.env import tasks as tasks_lib
from c2jax.rl.tasks import curriculum as curriculum_lib
from c2jax.rl.actors import rollouts


def order(task_ids, observations, curriculum_cfg, seed: int) -> list[str]:
  """Every prompt, hard ones (more turns / thinking tokens in `observations`, tuples of
  (task_id, turns, thinking_tokens)) drawn earlier as config.rl.curriculum says."""
  sampler = curriculum_lib.CurriculumSampler(
      task_ids, curriculum_cfg.strength, curriculum_cfg.turns_weight,
      curriculum_cfg.thinking_weight, seed)
  for task_id, turns, thinking in observations:
    sampler.observe(task_id, turns, thinking)
  return sampler.draw(len(task_ids))


def _probe_rollouts(cfg, run, engine, tasks) -> list:
  from c2jax.agent import loop as agent_loop  # pylint: disable=g-import-not-at-top

  samples = cfg.rl.curriculum.probe_samples
  jobs = [task for task in tasks for _ in range(samples)]
  seeds = [s for task in tasks for s in rollouts.rollout_seeds("probe:" + task.id, samples)]
  return agent_loop.run_episodes(engine, run.tokenizer, cfg.agent, jobs, seeds=seeds)


def probe(cfg, run, engine) -> None:
  """Probe rollouts of every training prompt with the starting policy, once per run
  (see the module docstring); nothing when the curriculum does not use them."""
  marker = run.dirs.root / "curriculum.json"
  curriculum = cfg.rl.curriculum
  running = curriculum.sampling == "running"
  if marker.exists() or (curriculum.probe_samples == 0 if running
                         else curriculum.strength <= 0):
    return
  started = time.monotonic()
  if running:
    tasks = tasks_lib.load_jsonl(str(run.dirs.train))
  else:
    pending = run.pool.pending_tasks()
    tasks = [tasks_lib.Task.from_json(payload["task"]) for _, payload in pending]
  trajectories = _probe_rollouts(cfg, run, engine, tasks)
  observations = [(t.task_id, bool(t.solved), t.stats.turns, t.stats.thinking_tokens)
                  for t in trajectories]
  record = {"observations": observations}
  if not running:
    record["order"] = order([task.id for task in tasks], [
        (task_id, turns, thinking) for task_id, _, turns, thinking in observations],
        curriculum, cfg.learner.seed)
    run.pool.reorder(record["order"])
  record["seconds"] = time.monotonic() - started
  marker.write_text(json.dumps(record))
  print(f"rl: curriculum over {len(tasks)} prompts from {len(trajectories)} probe rollouts "
        f"({record['seconds']:.0f}s)", flush=True)


class PoolFeed:
  """Draws prompts into the pool from a RunningCurriculum (module docstring)."""

  def __init__(self, cfg, dirs: rollouts.RunDirs, pool):
    self.pool, self.dirs = pool, dirs
    self.lookahead = cfg.rl.curriculum.lookahead
    if not dirs.train.exists():
      raise FileNotFoundError(
          f"{dirs.train} is missing: this run directory was started with "
          "config.rl.curriculum.sampling = 'order' (its prompts are all in the pool); "
          "continue it with that setting or start a new --workdir for 'running'.")
    self.tasks = {t.id: t for t in tasks_lib.load_jsonl(str(dirs.train))}
    c = cfg.rl.curriculum
    self.curriculum = curriculum_lib.RunningCurriculum(
        list(self.tasks), cfg.rl.group_size, ema=c.ema, prior_pass=c.prior_pass,
        min_weight=c.min_weight, strength=c.strength, turns_weight=c.turns_weight,
        thinking_weight=c.thinking_weight, seed=cfg.learner.seed)

  def start(self, data_state: dict | None) -> str:
    """Statistics from the checkpoint's data state (a resumed learner), else from the
    probe rollouts if any; opens the pool for draws. Returns where they came from."""
    if data_state and "curriculum" in data_state:
      self.curriculum.load_state(data_state["curriculum"])
      source = "the checkpoint"
    else:
      source = "the prior"
      marker = self.dirs.root / "curriculum.json"
      if marker.exists():
        self._observe_probe(json.loads(marker.read_text())["observations"])
        source = "probe rollouts"
    self.pool.keep_open(True)
    return source

  def _observe_probe(self, observations) -> None:
    by_prompt: dict[str, list] = {}
    for task_id, solved, turns, thinking in observations:
      by_prompt.setdefault(task_id, []).append((solved, turns, thinking))
    for task_id, rows in by_prompt.items():
      solved, turns, thinking = zip(*rows)
      self.curriculum.observe_group(task_id, solved, turns, thinking)

  def top_up(self) -> int:
    """Draws prompts until `lookahead` are pending or leased; returns how many."""
    counts = self.pool.counts()
    missing = self.lookahead - counts["pending"] - counts["leased"]
    if missing <= 0:
      return 0
    first = counts["pending"] + counts["leased"] + counts["done"]
    drawn = self.curriculum.draw(missing, first)
    return self.pool.add(
        (curriculum_lib.draw_id(prompt_id, first + i),
         {"task": self.tasks[prompt_id].to_json(), "prompt": prompt_id})
        for i, prompt_id in enumerate(drawn))

  def observe(self, groups) -> dict[str, float]:
    """Folds trained groups into the statistics; returns the step's curriculum metrics
    (the pass rate the curriculum expected of these groups' prompts when they were
    trained, then the distribution of the next draws)."""
    prompts = [curriculum_lib.prompt_of(g.group_id) for g in groups]
    expected = float(np.mean([self.curriculum.pass_rate(p) for p in prompts]))
    for prompt_id, group in zip(prompts, groups):
      self.curriculum.observe_group(prompt_id, group.info["solved"], group.info["turns"],
                                    group.info["thinking_tokens"])
    return {"curriculum/trained_expected_pass_rate": expected, **self.curriculum.metrics()}

  def state(self) -> dict:
    return self.curriculum.state()

  def close(self) -> None:
    self.pool.keep_open(False)
