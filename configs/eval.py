"""`c2jax eval --config=configs/eval.py:<suite> --workdir=DIR`: score a policy on a suite.

Variants (the suite; its arguments are config.suite.args):
  procgen                procedural bug-fix repositories (c2jax/env/procgen.py)
  revert_restore         functions of PyPI packages reverted and restored (--config.suite.args.packages)
  swebench               SWE-bench-format JSONL: --config.suite.args.path=FILE and
                         --config.suite.args.repos_root=DIR (checkouts per instance_id)
                         or --config.suite.args.repo_dir=CLONE (base commits exported);
                         a suite built from packages needs neither (made from them)
  multilang              swebench over configs/suites/multilang.jsonl: Go, Rust, node
                         and Python tasks from released packages (docs/tasks.md); the
                         summary has accuracy per language
  terminal_bench         Harbor / Terminal-Bench task folders: --config.suite.args.path=DIR
  eager_editing          questions that must be answered without editing any file
  instruction_following  bug fixes under explicit, graded constraints
  codebase_ppl           base model: perplexity of a held-out repository
                         (--config.suite.args.repo=DIR; window, stride); engine policy only
  state_tracking         base model: rebuild a file from its diffs (LoCoDiff-style); cases
                         from --config.suite.args.repo=GIT_REPO, .cases_path=JSONL, or generated
Policies (config.policy.kind): oracle (default: checks the harness; 100% expected),
engine (--config.policy.run=RUN_DIR), openai (--config.policy.base_url=URL
--config.policy.model=NAME --config.policy.api_key_env=VAR).
Append ',tiny' for the CPU settings of configs/rl.py's tiny agent (short turns, the
three tools its SFT traces use), e.g. configs/eval.py:procgen,tiny; for the base-model
suites, short windows and cases.
Append ',run=RUN_DIR' to score a c2jax run or HF directory on the engine (the same as
--config.policy.kind=engine --config.policy.run=RUN_DIR).
The base-model suites default to policy.kind='engine' and one greedy sample per case:
  c2jax eval --config=configs/eval.py:codebase_ppl --workdir=DIR \
      --config.policy.run=RUN --config.suite.args.repo=HELD_OUT_REPO
"""

import os

import ml_collections

from c2jax.agent import config as agent_config
from c2jax.eval import policies, runner, suites

TEST_ARGS = ("procgen", "eager_editing", "instruction_following", "procgen,tiny",
             "state_tracking,run=runs/tiny/pretrain", "state_tracking,tiny,run=runs/x",
             "multilang", "multilang,tiny")
# Variants that are a suite with set arguments: name -> (suite, its arguments).
PRESETS = {"multilang": ("swebench", {"path": os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "suites", "multilang.jsonl")})}


def get_config(arg: str = "procgen"):
  parts = [p for p in (arg or "procgen").split(",") if p]
  suite, options = parts[0], set(p for p in parts[1:] if not p.startswith("run="))
  runs = [p[len("run="):] for p in parts[1:] if p.startswith("run=")]
  suite, preset = PRESETS.get(suite, (suite, {}))
  if suite not in suites.suite_names():
    raise ValueError(f"configs/eval.py: unknown suite {suite!r}; choose one of "
                     f"{suites.suite_names() + sorted(PRESETS)}.")
  unknown = sorted(options - {"tiny"})
  if unknown:
    raise ValueError(f"configs/eval.py: unknown option(s) {unknown}; the options are 'tiny' "
                     "and 'run=RUN_DIR'.")
  c = ml_collections.ConfigDict()
  c.suite = ml_collections.ConfigDict({"name": suite, "args": suites.get_suite(suite).defaults()})
  c.suite.args.update(preset)
  c.policy = policies.default_config()
  c.agent = agent_config.default_config()
  c.eval = runner.default_config()
  c.eval.samples = 4
  c.eval.ks = (1, 2, 4)
  c.agent.temperature = 1.0
  if suites.get_suite(suite).kind == "scored":
    c.policy.kind = "engine"
    c.eval.samples, c.eval.ks = 1, (1,)  # greedy: one sample per case says it all
  if "tiny" in options and suite == "codebase_ppl":
    c.suite.args.window, c.suite.args.stride, c.policy.max_length = 64, 32, 512
  elif "tiny" in options and suite == "state_tracking":
    c.suite.args.count, c.suite.args.max_new_tokens = 3, 48
    c.suite.args.procedural_diffs, c.suite.args.procedural_functions = (1, 2), (1, 2)
    c.policy.max_length = 1536
  elif "tiny" in options:
    # configs/rl.py:tiny's agent, so an RL or agent-SFT run of `tiny` is scored as trained.
    c.agent.tools = ("read_file", "edit_file", "finish")
    c.agent.max_turns = 4
    c.agent.max_turn_tokens = 96
    c.agent.max_total_tokens = 768
    c.policy.max_length = 512
    c.policy.slots = 16
    if suite == "procgen":
      c.suite.args.difficulties = (0,)
  if runs:
    c.policy.kind, c.policy.run = "engine", runs[-1]
  return c
