"""Runs a suite with a policy into a run directory; resumable; retries infra failures.

    summary = run(cfg, workdir)                       # `c2jax eval`
    summary = evaluate_tasks(policy, tasks, workdir)  # any caller with tasks in hand
                                                      # (the RL trainer's held-out eval)

Jobs are (task, sample) pairs; each sample has its own sampling seed, a function of
(eval.seed, task id, sample), so a resumed or widened run draws the same samples. Done
pairs in DIR/results.jsonl are skipped. A job whose episode hits an infrastructure
failure is retried up to policy.retries times (with backoff), then recorded with
`infra_error`; such records are excluded from accuracy and retried by the next rerun.

SIGTERM or SIGINT to `c2jax eval` (c2jax.preemption) stops it cleanly: no new episode
starts, the ones in flight (at most policy.concurrency, or policy.slots for an engine)
finish and are recorded, the summary of what is done is written with `preempted: true`,
and the command exits 0; rerunning it runs only what is missing. For that the jobs go
to the policy in waves of that many episodes, checked between waves.

Score of an episode: the task's reward over its hidden tests (eval.reward: 'binary' =
all pass, 'fraction'), times 1 if every transcript check passed, else 0.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
import time
import zlib

import ml_collections

from c2jax import config as configlib
from c2jax import preemption
from c2jax.env import reward as reward_lib
from c2jax.eval import checks as checks_lib
from c2jax.eval import episode as episode_lib
from c2jax.eval import metrics, policies, results, suites

TRANSCRIPTS = "transcripts.jsonl"


def default_config() -> ml_collections.ConfigDict:
  """The `eval` section: how many samples, which k, the reward, the seed."""
  return ml_collections.ConfigDict(dict(samples=1, ks=(1,), seed=0, reward="binary",
                                        progress=True))


def validate(cfg) -> None:
  """Suite, policy, agent and eval sections; errors name the key. Runs before any
  model, sandbox or endpoint is touched."""
  from c2jax.agent import config as agent_config  # pylint: disable=g-import-not-at-top

  configlib.check_choice(cfg, "suite.name", suites.suite_names())
  suite = suites.get_suite(cfg.suite.name)
  configlib.check_keys(cfg.suite.args, suite.defaults(), "suite.args.")
  if suite.check is not None:
    suite.check(cfg)
  configlib.check_keys(cfg.policy, policies.default_config(), "policy.")
  configlib.check_keys(cfg.eval, default_config(), "eval.")
  agent_config.validate(cfg.agent)
  policies.validate(cfg)
  configlib.check_positive(cfg, "eval.samples")
  configlib.check_choice(cfg, "eval.reward", reward_lib.REWARDS)
  ks = list(cfg.eval.ks)
  if not ks or any(not isinstance(k, int) or k < 1 or k > cfg.eval.samples for k in ks):
    raise configlib.ConfigError("eval.ks", f"= {ks} must be integers in [1, eval.samples = "
                                f"{cfg.eval.samples}]; raise eval.samples for larger k.")
  if suite.policies is not None and cfg.policy.kind not in suite.policies:
    raise configlib.ConfigError("policy.kind", f"is {cfg.policy.kind!r} but suite "
                                f"{suite.name!r} runs only with {list(suite.policies)}"
                                + (" (it needs the model's logits: an engine policy with "
                                   "policy.run = a c2jax run or HF directory)"
                                   if suite.policies == ("engine",) else "") + ".")
  if cfg.policy.kind == "oracle" and not suite.oracle:
    raise configlib.ConfigError("policy.kind", f"is 'oracle' but suite {suite.name!r} has "
                                "no oracle; pick an engine or openai policy.")


def sample_seed(salt: int, task_id: str, sample: int) -> int:
  return zlib.crc32(f"{salt}:{task_id}:{sample}".encode()) % (2**31)


def score(task, outcome: episode_lib.Outcome, reward: str) -> tuple[float, dict]:
  passed = dict(outcome.passed)
  task_passed = {t: bool(passed.get(t, False)) for t in task.fail_to_pass + task.pass_to_pass}
  value = reward_lib.REWARDS[reward](task, task_passed) if task_passed else 0.0
  checked = checks_lib.apply_checks(task, outcome)
  passed.update(checked)
  if not all(checked.values()):
    value = 0.0
  return float(value), passed


def _record(job, outcome, policy_label, suite_name, reward, attempts) -> dict:
  task = job.task
  base = {"task_id": task.id, "sample": job.sample, "seed": job.seed, "suite": suite_name,
          "policy": policy_label, "category": task.metadata.get("category"),
          "language": task.language or None,
          "attempts": attempts, "finished_at": round(time.time(), 3)}
  if isinstance(outcome, BaseException):
    return dict(base, infra_error=f"{type(outcome).__name__}: {outcome}"[:2000],
                score=None, solved=None)
  value, passed = score(task, outcome, reward)
  return dict(base, infra_error=None, score=value, solved=value >= metrics.SOLVED_AT,
              passed=passed, finish_reason=outcome.finish_reason,
              completion_tokens=outcome.completion_tokens,
              prompt_tokens=outcome.prompt_tokens, turns=outcome.turns,
              tool_calls=outcome.tool_calls, wall_s=round(outcome.wall_s, 4),
              cost=outcome.cost,
              final_answer=episode_lib.final_answer(outcome.messages)[:500],
              **({"extra": outcome.extra} if outcome.extra else {}))


def _progress(total: int, initial: int, enabled: bool, label: str):
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top

  return tqdm(total=total, initial=initial, disable=not enabled, unit="ep",
              desc=f"eval {label}", dynamic_ncols=True, smoothing=0.1)


def evaluate_tasks(policy, tasks, workdir, *, samples: int = 1, ks=(1,), seed: int = 0,
                   reward: str = "binary", retries: int = 2, retry_backoff_s: float = 1.0,
                   suite_name: str = "tasks", progress: bool = True,
                   stop: preemption.StopRequest | None = None) -> dict:
  """Runs `samples` episodes per task (skipping those done in workdir), writes
  results.jsonl, transcripts.jsonl and summary.json; returns the summary. With `stop`,
  no episode starts once a stop is requested (those running finish and are recorded; the
  summary then says `preempted`)."""
  workdir = pathlib.Path(workdir)
  with results.ResultsStore(workdir) as store:
    done = store.done()
    jobs = [episode_lib.Job(t, s, sample_seed(seed, t.id, s)) for t in tasks
            for s in range(samples) if (t.id, s) not in done]
    total = len(tasks) * samples
    bar = _progress(total, total - len(jobs), progress, policy.label)
    lock = threading.Lock()
    transcripts = open(workdir / TRANSCRIPTS, "a", encoding="utf-8")
    attempts: dict[tuple[str, int], int] = {}
    retry: list[episode_lib.Job] = []
    solved = [0, 0, 0]  # solved, scored, infra errors

    def on_done(job, outcome):
      with lock:
        attempts[job.key] = attempts.get(job.key, 0) + 1
        if isinstance(outcome, BaseException) and attempts[job.key] <= retries:
          retry.append(job)
          return
        record = _record(job, outcome, policy.label, suite_name, reward, attempts[job.key])
        store.append(record)
        if not isinstance(outcome, BaseException):
          transcripts.write(json.dumps({"task_id": job.task.id, "sample": job.sample,
                                        "messages": outcome.messages}) + "\n")
          transcripts.flush()
          solved[0] += bool(record["solved"])
          solved[1] += 1
        else:
          solved[2] += 1
        bar.update(1)
        bar.set_postfix(acc=f"{solved[0] / max(solved[1], 1):.3f}", infra=solved[2],
                        refresh=False)

    stopped = lambda: stop is not None and stop.requested
    try:
      pending, round_number = jobs, 0
      while pending and not stopped():
        if round_number:
          time.sleep(retry_backoff_s * round_number)
        retry.clear()
        # Unstarted and retried jobs left by a stop are run by the next rerun.
        policy.run(pending, on_done, should_start=lambda: not stopped())
        pending, round_number = list(retry), round_number + 1
    finally:
      bar.close()
      transcripts.close()
    records = store.records()
  summary = metrics.summarize(records, ks)
  summary["policy"], summary["suite"] = policy.label, suite_name
  summary["torn_lines_redone"] = store.torn_lines
  summary["preempted"] = stopped()
  results.write_summary(workdir, summary)
  return summary


def _pinned(cfg) -> dict:
  """What a resumed run must share with the first one (retries, timeouts, concurrency
  and samples may change: more samples extend the run)."""
  policy = {k: cfg.policy[k] for k in ("kind", "run", "base_url", "model", "tool_calls")}
  return {"suite": cfg.suite.to_dict(), "policy": policy, "agent": cfg.agent.to_dict(),
          "seed": cfg.eval.seed, "reward": cfg.eval.reward}


def _jsonify(value):
  return json.loads(json.dumps(value, default=list))


def run(cfg, workdir: str) -> dict:
  """`c2jax eval`: validate, build the suite's tasks, run the policy, summarise."""
  validate(cfg)
  workdir = pathlib.Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  results.pin_config(workdir, _jsonify(_pinned(cfg)))
  suite = suites.get_suite(cfg.suite.name)
  policy = policies.build(cfg)
  preemption.clear(workdir)
  stop = preemption.StopRequest().install()
  try:
    if suite.kind == "scored":
      summary = run_scored(cfg, suite, policy, workdir, stop)
    else:
      tasks = suites.build_tasks(suite, cfg.suite.args, str(workdir / "tasks"))
      for task in tasks:
        checks_lib.validate_checks(task.id, task.metadata.get("checks", []))
      summary = evaluate_tasks(
          policy, tasks, workdir, samples=cfg.eval.samples, ks=tuple(cfg.eval.ks),
          seed=cfg.eval.seed, reward=cfg.eval.reward, retries=cfg.policy.retries,
          retry_backoff_s=cfg.policy.retry_backoff_s, suite_name=suite.name,
          progress=cfg.eval.progress, stop=stop)
  finally:
    stop.uninstall()
    policy.close()
  if summary["preempted"]:
    preemption.mark(workdir)
  return summary


def run_scored(cfg, suite, policy, workdir, stop=None) -> dict:
  """A scored suite yields its own records; they are stored like agent episodes. With
  `stop`, no record is asked for once a stop is requested."""
  with results.ResultsStore(workdir) as store:
    done = {task_id for task_id, _ in store.done()}
    bar = _progress(None, len(done), cfg.eval.progress, policy.label)
    out_dir = str(workdir / "tasks")
    os.makedirs(out_dir, exist_ok=True)
    for record in suite.fn(cfg.suite.args, policy, out_dir, done):
      if "task_id" not in record or "score" not in record:
        raise ValueError(f"Suite {suite.name!r} yielded {sorted(record)}; a scored suite's "
                         "records need 'task_id' and 'score'.")
      store.append(dict({"sample": 0, "suite": suite.name, "policy": policy.label,
                         "infra_error": None}, **record))
      bar.update(1)
      if stop is not None and stop.requested:
        break
    bar.close()
    records = store.records()
  summary = metrics.summarize(records, (1,))
  summary["preempted"] = stop is not None and stop.requested
  summary["policy"], summary["suite"] = policy.label, suite.name
  if suite.metrics is not None:
    summary["metrics"] = suite.metrics(records)
  results.write_summary(workdir, summary)
  return summary
