"""The suite registry: what `config.suite.name` can name, and each suite's arguments.

Two kinds of suite share the registry, the runner and the results format:
  agent   builds Tasks (c2jax.env.tasks.Task); the policy runs the agent on each task
          `config.eval.samples` times and the hidden tests (and transcript checks) grade.
  scored  a function that scores cases itself and yields one record per case with a
          `score` (e.g. base-model evals: perplexity, state tracking). It gets the policy
          (for a checkpoint: its model config, params and tokenizer) and the case ids
          already done, so it resumes like an agent suite.

    @register_suite('my_suite', defaults=lambda: ConfigDict(dict(count=8)), oracle=True)
    def build(args, out_dir) -> list[Task]: ...

    @register_suite('codebase_ppl', defaults=..., kind='scored')
    def score(args, policy, out_dir, done) -> Iterator[dict]:  # {'task_id', 'score', ...}

`defaults()` is the ConfigDict of the suite's arguments (config.suite.args): the config
is checked against it, so a mistyped argument is an error naming the key.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import ml_collections

from c2jax import config as configlib
from c2jax.env import packages
from c2jax.env import procgen
from c2jax.env import tasks as tasks_lib
from c2jax.env.packages import instances
from c2jax.eval import base_suites, targeted

KINDS = ("agent", "scored")


@dataclasses.dataclass(frozen=True)
class Suite:
  name: str
  kind: str
  fn: Callable
  defaults: Callable[[], ml_collections.ConfigDict]
  oracle: bool  # the scripted oracle policy can solve every task (it must score 100%)
  doc: str
  # scored suites: the policy kinds that can run it (None: all), and the suite's own
  # metrics from its result records (summary.json's `metrics`, the report's columns).
  policies: tuple[str, ...] | None = None
  metrics: Callable[[list[dict]], dict] | None = None
  columns: tuple[str, ...] = ()
  # check(cfg) raises ConfigError for bad suite.args, before anything is loaded.
  check: Callable | None = None


_SUITES: dict[str, Suite] = {}


def register_suite(name: str, *, defaults: Callable[[], ml_collections.ConfigDict],
                   oracle: bool = False, kind: str = "agent",
                   policies: tuple[str, ...] | None = None,
                   metrics: Callable[[list[dict]], dict] | None = None,
                   columns: tuple[str, ...] = (), check: Callable | None = None):
  if kind not in KINDS:
    raise ValueError(f"register_suite({name!r}): kind must be one of {KINDS}, got {kind!r}.")

  def wrap(fn):
    if name in _SUITES:
      raise ValueError(f"Suite {name!r} is registered twice.")
    _SUITES[name] = Suite(name, kind, fn, defaults, oracle, (fn.__doc__ or "").strip(),
                          policies, metrics, columns, check)
    return fn
  return wrap


def get_suite(name: str) -> Suite:
  if name not in _SUITES:
    raise KeyError(f"Unknown suite {name!r}; registered suites: {suite_names()}.")
  return _SUITES[name]


def suite_names() -> list[str]:
  return sorted(_SUITES)


def _args(**values) -> Callable[[], ml_collections.ConfigDict]:
  return lambda: ml_collections.ConfigDict(values)


@register_suite("procgen", defaults=_args(count=16, seed=100_000,
                                          difficulties=procgen.DEFAULT_DIFFICULTIES),
                oracle=True)
def _procgen(args, out_dir):
  """Procedural Python repositories with one planted bug family each (env/procgen.py)."""
  return procgen.generate_suite(out_dir, args.count, args.seed, tuple(args.difficulties))


@register_suite("revert_restore", defaults=_args(
    packages=("six==1.16.0",), tasks_per_package=3, max_candidates=20, seed=0,
    backend="bubblewrap", cache_dir=""), oracle=True)
def _revert_restore(args, out_dir):
  """Functions of installed/pinned PyPI packages reverted to `raise NotImplementedError`;
  their own tests grade (env/revert_restore.py). cache_dir '' = the default sdist cache."""
  from c2jax.env import revert_restore, sandbox  # pylint: disable=g-import-not-at-top

  make = lambda repo: sandbox.make_sandbox(args.backend, repo)
  cache = args.cache_dir or revert_restore.DEFAULT_CACHE
  tasks = []
  for requirement in args.packages:
    tasks += revert_restore.build(requirement, out_dir, make, max_tasks=args.tasks_per_package,
                                  max_candidates=args.max_candidates, seed=args.seed,
                                  cache_dir=cache)
  return tasks


@register_suite("swebench", defaults=_args(path="", repos_root="", repo_dir="",
                                           test_command=tasks_lib.PYTEST_COMMAND,
                                           packages_dir=packages.DEFAULT_CACHE,
                                           limit=0), oracle=True)
def _swebench(args, out_dir):
  """SWE-bench-format JSONL (instance_id, repo, base_commit, patch, test_patch,
  FAIL_TO_PASS, PASS_TO_PASS, version) over checkouts in repos_root/<instance_id>, or
  snapshots exported at each base_commit from one local clone, repo_dir, or, for a
  suite `c2jax tasks build` made from released packages (every `repo` an npm:, deb: or
  pypi: spec), neither: the checkouts are made from the packages, once, under
  packages_dir (c2jax/env/packages/instances.py)."""
  from c2jax.eval import swebench  # pylint: disable=g-import-not-at-top

  path = args.path
  if path and not args.repos_root and not args.repo_dir and instances.is_package_suite(path):
    path, root = instances.materialise(path, cache_dir=args.packages_dir)
  elif not path or bool(args.repos_root) == bool(args.repo_dir):
    raise ValueError("suite swebench needs config.suite.args.path (the JSONL) and exactly "
                     "one of suite.args.repos_root (checkouts per instance_id) or "
                     "suite.args.repo_dir (a git clone to export base commits from); "
                     "a suite built from packages (npm:, deb:, pypi: repos) needs neither.")
  else:
    root = args.repos_root or swebench.export_snapshots(path, args.repo_dir,
                                                        os.path.join(out_dir, "repos"))
  tasks = tasks_lib.load_swebench_jsonl(path, root, args.test_command)
  return tasks[:args.limit] if args.limit else tasks


def _check_terminal_bench(cfg) -> None:
  """build_images needs the docker backend; base_images entries are 'FROM=IMAGE'."""
  from c2jax.env import images  # pylint: disable=g-import-not-at-top  # the docker SDK

  args = cfg.suite.args
  if not args.path:
    raise configlib.ConfigError("suite.args.path", "is empty; set it to a Harbor / "
                                "Terminal-Bench task folder or a folder of them.")
  if problem := images.settings_problem(args.build_images, args.base_images,
                                        cfg.agent.backend):
    raise configlib.ConfigError(f"suite.args.{problem[0]}", problem[1])


@register_suite("terminal_bench", defaults=_args(path="", limit=0, build_images=False,
                                                 base_images=()),
                oracle=True, check=_check_terminal_bench)
def _terminal_bench(args, out_dir):
  """Harbor / Terminal-Bench task folders: `path` is one task folder or a folder of
  them. With build_images (agent.backend='docker'), each folder's Dockerfile is built and
  its tasks run in that image (c2jax/env/images.py; base_images: 'FROM=LOCAL_IMAGE'
  entries ahead of its base table). The oracle runs each task's reference solution
  (solution.sh / solution/solve.sh)."""
  from c2jax.env import images  # pylint: disable=g-import-not-at-top  # the docker SDK

  return tasks_lib.load_task_folders(args.path, build_images=args.build_images,
                                     base_images=images.parse_base_images(args.base_images),
                                     limit=args.limit)


@register_suite("eager_editing", defaults=_args(count=16, seed=0), oracle=True)
def _eager_editing(args, out_dir):
  """Questions to answer without changing any file (any edit fails)."""
  return targeted.eager_suite(out_dir, args.count, args.seed)


@register_suite("instruction_following", defaults=_args(count=16, seed=0), oracle=True)
def _instruction_following(args, out_dir):
  """Bug fixes under explicit constraints (edit only file X, no shell, word limits)."""
  return targeted.instruction_suite(out_dir, args.count, args.seed)


@register_suite("codebase_ppl", defaults=base_suites.codebase_ppl_defaults, kind="scored",
                policies=("engine",), metrics=base_suites.codebase_ppl_metrics,
                check=base_suites.check_codebase_ppl,
                columns=("files", "tokens", "perplexity", "bits_per_byte", "nll_per_token",
                         "window", "stride", "tokens_per_second"))
def _codebase_ppl(args, policy, out_dir, done):
  """Codebase perplexity (report App. B) of the repository suite.args.repo: its files in
  path order, NLL under a rolling window; per-file and pooled perplexity and bits/byte."""
  return base_suites.codebase_ppl(args, policy, out_dir, done)


@register_suite("state_tracking", defaults=base_suites.state_tracking_defaults,
                kind="scored", oracle=True, policies=("engine", "openai", "oracle"),
                metrics=base_suites.state_tracking_metrics,
                check=base_suites.check_state_tracking,
                columns=("cases", "mean_score", "stderr", "mean_normalised_distance",
                         "exact_match", "completion_tokens", "skipped"))
def _state_tracking(args, policy, out_dir, done):
  """State tracking (report App. B, LoCoDiff-style): rebuild a file from its first
  version and its diffs; cases from suite.args.repo's git history, suite.args.cases_path,
  or generated."""
  return base_suites.state_tracking(args, policy, out_dir, done)


def build_tasks(suite: Suite, args, out_dir: str) -> list[tasks_lib.Task]:
  """The suite's tasks, built once into out_dir (tasks.jsonl) and reloaded on resume."""
  listing = os.path.join(out_dir, "tasks.jsonl")
  if os.path.exists(listing):
    return tasks_lib.load_jsonl(listing)
  os.makedirs(out_dir, exist_ok=True)
  tasks = suite.fn(args, out_dir)
  if not tasks:
    raise ValueError(f"Suite {suite.name!r} built no tasks from config.suite.args = "
                     f"{args.to_dict()}; check its paths and counts.")
  ids = [t.id for t in tasks]
  if len(set(ids)) != len(ids):
    raise ValueError(f"Suite {suite.name!r} built duplicate task ids; ids must be unique.")
  tasks_lib.save_jsonl(tasks, listing + ".tmp")
  os.replace(listing + ".tmp", listing)
  return tasks
