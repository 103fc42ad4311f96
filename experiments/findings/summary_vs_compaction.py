"""Self-summarisation vs prompt-based compaction at the same token budget (report §4.1).

The report: when a rollout reaches a token trigger, asking the policy to summarise its
own work (self-summarisation, trained with the chain's reward) beats prompt-based
compaction, and with fewer tokens. This command runs the same held-out procedural tasks
with the same sampling seeds under each agent.context_management (c2jax.agent.config):
  none          no management: a rollout stops when the engine's context is full
  self_summary  the policy summarises in its own sequence; the next segment starts from it
  compaction    a separate call of the model (compaction prompt + the history as text)
                writes the summary; its tokens are in no segment, so RL never trains them
at one token budget (agent.max_total_tokens) and one engine context (--max-length), and
reports per mode: pass rate, tokens used (what the budget counts: sampled and fed,
summaries included), the extra prefill of compaction calls (their prompts re-read the
history; not budgeted), summaries per rollout,
with per-seed values and their spread.

What it measures, honestly: it *evaluates* one checkpoint (--init-from, e.g. the tiny
SFT run); it does not train. So it isolates the inference-time mechanism (who writes the
summary, and what the next segment starts from). The report's gain is credited largely to
RL training the summaries, which takes more RL than a tiny CPU run can show; run RL with
configs/rl.py:summary against --config.agent.context_management=compaction for that.

  python -m experiments.findings.summary_vs_compaction \
      --init-from runs/tiny/sft --seeds 2 --tasks 16 --out docs/figures
  python -m experiments.findings.summary_vs_compaction --smoke --out runs/findings_smoke

The defaults fit the tiny tokenizer with the full tool list (a ~470-token prompt): a
rollout summarises after its first turn or two, and without management a five-turn
solution (find, read, edit, check, finish) runs out of the 704-token context.

Writes OUT/summary_vs_compaction.png and OUT/summary_vs_compaction.json. --smoke replaces
the model by a policy that calls read_file every turn (no checkpoint; checks that every
mode runs and summarises; shows no finding).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

REPO = pathlib.Path(__file__).resolve().parents[2]

# pylint: disable=wrong-import-position
from c2jax import config as configlib
from c2jax.agent import config as agent_config
from c2jax.agent import loop as agent_loop
from c2jax.env import procgen
from c2jax.rollout.engine import DecodeBatch, Engine, SlotOutput
# pylint: enable=wrong-import-position

NAME = "summary_vs_compaction"
MODES = agent_config.CONTEXT_MANAGEMENT
_TASK_SEED_BASE = 3_000_000  # held out: traces and RL prompts use small seeds
METRICS = ("pass_rate", "tokens", "sampled_tokens", "compaction_tokens", "summaries")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--smoke", action="store_true",
                 help="no model: a policy that calls read_file every turn, 2 tasks, 1 seed")
  p.add_argument("--out", type=pathlib.Path, default=REPO / "runs" / "findings",
                 help=f"where {NAME}.png and {NAME}.json go")
  p.add_argument("--seeds", type=int, default=2, help="sampling seeds 0..N-1 (>= 1)")
  p.add_argument("--init-from", default="",
                 help="the checkpoint to evaluate: a c2jax run stage dir (e.g. runs/tiny/sft)")
  p.add_argument("--tasks", type=int, default=16, help="held-out procedural tasks")
  p.add_argument("--difficulty", type=int, default=1,
                 help="procgen difficulty (1: find, read, edit, check, finish)")
  p.add_argument("--budget", type=int, default=1024, help="agent.max_total_tokens")
  p.add_argument("--max-length", type=int, default=704, help="the engine's context")
  p.add_argument("--trigger", type=int, default=512, help="agent.summary_trigger_tokens")
  p.add_argument("--summary-tokens", type=int, default=64, help="agent.summary_tokens")
  p.add_argument("--max-turns", type=int, default=10, help="agent.max_turns")
  p.add_argument("--slots", type=int, default=16, help="engine slots (episodes at a time)")
  p.add_argument("--tools", default="",
                 help="comma-separated agent tools (default: the agent's full list); a "
                      "policy SFT-trained on configs/rl.py:tiny traces saw read_file,"
                      "edit_file,finish in its system message")
  args = p.parse_args(argv)
  if args.seeds < 1 or args.tasks < 1:
    p.error(f"--seeds and --tasks must be >= 1 (got {args.seeds}, {args.tasks}).")
  if args.trigger + args.summary_tokens >= args.max_length:
    p.error(f"--trigger {args.trigger} + --summary-tokens {args.summary_tokens} must stay "
            f"below --max-length {args.max_length}: a self-summary needs room in its sequence.")
  args.tools = tuple(t.strip() for t in args.tools.split(",") if t.strip())
  if args.smoke:
    args.seeds, args.tasks = 1, 2
  elif not args.init_from:
    p.error("--init-from names the checkpoint to evaluate (or pass --smoke).")
  return args


def agent_section(args, mode: str):
  """The agent config of one mode: configs/rl.py:summary's, at this run's budget."""
  rl_cfg = configlib.load_config_file(REPO / "configs" / "rl.py", "summary")
  cfg = agent_config.default_config()
  cfg.update({key: rl_cfg.agent[key] for key in ("summary_prompt", "compaction_prompt",
                                                   "summary_header", "max_summaries")})
  cfg.temperature = 1.0
  cfg.max_turns = args.max_turns
  cfg.max_turn_tokens = min(96, args.trigger - 1)
  cfg.max_total_tokens = args.budget
  cfg.summary_tokens = args.summary_tokens
  cfg.context_management = mode
  if args.tools:
    cfg.tools = args.tools
  cfg.summary_trigger_tokens = 0 if mode == "none" else args.trigger
  agent_config.validate(cfg)
  return cfg


class _ReadFileEngine(Engine):
  """--smoke's policy: answers every request with one fixed turn (a read_file call), so
  rollouts grow turn by turn and pass the trigger. No model; log-probs are 0."""

  def __init__(self, turn: list[int], num_slots: int, max_length: int):
    super().__init__(num_slots, max_length)
    self.turn, self._pos = turn, {}

  def _next(self, slot: int) -> int:
    pos = self._pos[slot]
    self._pos[slot] = pos + 1
    return self.turn[min(pos, len(self.turn) - 1)]

  def _append(self, slot, context, start, sampling, seed):
    self._pos[slot] = 0
    return self._next(slot), 0.0, np.zeros((len(context) - start, 1, 1), np.int32)

  def _decode(self, batch: DecodeBatch):
    return {int(s): SlotOutput(np.int32([self._next(int(s))]), np.float32([0.0]),
                               np.zeros((1, 1, 1), np.int32))
            for s in np.flatnonzero(batch.active)}

  def _set_params(self, params):
    del params  # no weights

  def logprobs(self, sequences):
    return [np.zeros(len(s) - 1, np.float32) for s in sequences]


def _smoke_policy(args, tasks):
  """(engine, tokenizer, description) without a checkpoint; sizes the context, trigger and
  budget from the prompt length under the smoke's small tokenizer."""
  from c2jax.agent import prompt as prompt_lib  # pylint: disable=import-outside-toplevel
  from c2jax.data import chat  # pylint: disable=import-outside-toplevel
  from c2jax.data import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  from c2jax.env import tools as tools_lib  # pylint: disable=import-outside-toplevel
  call = {"id": "c0", "type": "function", "function": {
      "name": "read_file", "arguments": json.dumps({"path": "README.md"})}}
  turn_message = {"role": "assistant", "content": "Reading.", "tool_calls": [call]}
  cfg = agent_section(args, "none")
  system = prompt_lib.system_message(
      cfg.system_prompt, tools_lib.Toolbox(None, agent_config.toolset(cfg)).specs())
  texts = [t.prompt for t in tasks] + [cfg.summary_prompt, cfg.compaction_prompt, system]
  tokenizer = tokenizer_lib.train_bpe(texts * 4, 400)
  rendered = chat.render(tokenizer, [{"role": "user", "content": "x"}, turn_message])
  turn = rendered.ids[rendered.loss_mask.astype(bool)].tolist()
  prompt = max(len(prompt_lib.prompt_ids(tokenizer, system, t.prompt)) for t in tasks)
  args.trigger = prompt + 100
  args.max_length = prompt + 400  # room for the summary request after the trigger
  args.budget = 3 * prompt
  return (_ReadFileEngine(turn, args.slots, args.max_length), tokenizer,
          "smoke: a fixed read_file turn, no model")


def _checkpoint_policy(args):
  from c2jax.eval import engine_policy  # pylint: disable=import-outside-toplevel
  from c2jax.rollout import JaxEngine  # pylint: disable=import-outside-toplevel
  model_cfg, params, tokenizer = engine_policy.load_run(args.init_from)
  engine = JaxEngine(model_cfg, params, num_slots=args.slots, max_length=args.max_length)
  return engine, tokenizer, f"checkpoint {args.init_from}"


def episode_record(trajectory) -> dict:
  return {"task": trajectory.task_id, "solved": bool(trajectory.solved),
          "tokens": trajectory.total_tokens,
          "sampled_tokens": int(sum(s.loss_mask.sum() for s in trajectory.segments)),
          "compaction_tokens": trajectory.compaction_tokens,
          "summaries": len(trajectory.segments) - 1,
          "finish_reason": trajectory.finish_reason}


def seed_metrics(records: list[dict]) -> dict:
  """One mode at one seed: means over its episodes, finish reasons counted."""
  out = {"pass_rate": float(np.mean([r["solved"] for r in records]))}
  for key in METRICS[1:]:
    out[key] = float(np.mean([r[key] for r in records]))
  reasons: dict[str, int] = {}
  for r in records:
    reasons[r["finish_reason"]] = reasons.get(r["finish_reason"], 0) + 1
  out["finish_reasons"] = reasons
  return out


def spread(values) -> dict:
  values = np.asarray(values, np.float64)
  return {"mean": float(values.mean()), "std": float(values.std()),
          "min": float(values.min()), "max": float(values.max())}


def summarise(per_seed: dict[str, list[dict]]) -> dict:
  """Per mode: each metric's mean / std / min / max over seeds; plus the paired per-seed
  differences self_summary - compaction."""
  modes = {mode: {"per_seed": runs,
                  **{key: spread([r[key] for r in runs]) for key in METRICS}}
           for mode, runs in per_seed.items()}
  pairs = zip(per_seed["self_summary"], per_seed["compaction"])
  diffs = [{key: a[key] - b[key] for key in METRICS} for a, b in pairs]
  return {"modes": modes, "self_summary_minus_compaction": {
      key: spread([d[key] for d in diffs]) for key in METRICS}}


def _direction(diff: dict, better: str, worse: str) -> str:
  """`better` / `worse` when every seed's difference has that sign, else 'unclear'."""
  if diff["min"] > 0:
    return better
  if diff["max"] < 0:
    return worse
  return "unclear"


def verdict(summary: dict) -> dict:
  """Does the run agree with the report (self-summary: higher pass rate, fewer tokens
  than compaction)? A direction counts only when every seed shows it; with no summary
  written in either mode the run says nothing about the question."""
  modes, diff = summary["modes"], summary["self_summary_minus_compaction"]
  summarised = all(modes[m]["summaries"]["mean"] > 0 for m in ("self_summary", "compaction"))
  prefill = [a["tokens"] - b["tokens"] - b["compaction_tokens"] for a, b in
             zip(modes["self_summary"]["per_seed"], modes["compaction"]["per_seed"])]
  out = {"summarised": summarised,
         "pass_rate": _direction(diff["pass_rate"], "higher", "lower"),
         "tokens": _direction(diff["tokens"], "more", "fewer"),
         "tokens_with_compaction_prefill": _direction(spread(prefill), "more", "fewer")}
  if not summarised:
    out["agrees_with_report"] = None
    out["text"] = ("inconclusive: no rollout reached the summary trigger in both modes, so "
                   "the modes did not differ in what they ran")
  else:
    agrees = out["pass_rate"] != "lower" and out["tokens"] == "fewer"
    out["agrees_with_report"] = agrees if out["pass_rate"] == "higher" else None
    out["text"] = (f"self_summary vs compaction: pass rate {out['pass_rate']}, budgeted "
                   f"tokens {out['tokens']}, with compaction prefill "
                   f"{out['tokens_with_compaction_prefill']} (every seed must agree)")
  return out


def plot(summary: dict, path: pathlib.Path, title: str) -> None:
  modes = list(summary["modes"])
  fig, (ax_pass, ax_tokens) = plt.subplots(1, 2, figsize=(10, 4))
  x = np.arange(len(modes))
  for ax, key, label in ((ax_pass, "pass_rate", "held-out pass rate"),
                         (ax_tokens, "tokens", "tokens per rollout (budgeted)")):
    means = [summary["modes"][m][key]["mean"] for m in modes]
    ax.bar(x, means, color=["#999999", "#1f77b4", "#ff7f0e"][:len(modes)], alpha=0.7)
    for i, m in enumerate(modes):
      points = [r[key] for r in summary["modes"][m]["per_seed"]]
      ax.scatter(np.full(len(points), i), points, color="black", s=14, zorder=3)
    ax.set_xticks(x, modes)
    ax.set_ylabel(label)
  ax_pass.set_ylim(0, 1)
  prefill = [summary["modes"][m]["compaction_tokens"]["mean"] for m in modes]
  tokens = [summary["modes"][m]["tokens"]["mean"] for m in modes]
  ax_tokens.bar(x, prefill, bottom=tokens, fill=False, hatch="//",
                label="+ compaction calls' prompts (prefill, not budgeted)")
  ax_tokens.legend(fontsize=8)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def run(args) -> dict:
  args.out.mkdir(parents=True, exist_ok=True)
  repos = pathlib.Path(tempfile.mkdtemp(prefix=f"{NAME}_repos_"))
  tasks = [procgen.generate(str(repos), _TASK_SEED_BASE + i, args.difficulty)
           for i in range(args.tasks)]
  started = time.monotonic()
  engine, tokenizer, policy = (_smoke_policy(args, tasks) if args.smoke
                               else _checkpoint_policy(args))
  per_seed = {mode: [] for mode in MODES}
  episodes = []
  for seed in range(args.seeds):
    sampling_seeds = [seed * 100_000 + i for i in range(len(tasks))]
    for mode in MODES:  # interleaved: every mode sees the machine in the same state
      trajectories = agent_loop.run_episodes(engine, tokenizer, agent_section(args, mode),
                                             tasks, seeds=sampling_seeds)
      records = [episode_record(t) for t in trajectories]
      per_seed[mode].append(seed_metrics(records))
      episodes += [dict(r, mode=mode, seed=seed) for r in records]
      print(f"{NAME}: seed {seed} {mode}: " + ", ".join(
          f"{k} {per_seed[mode][-1][k]:.3f}" for k in METRICS), flush=True)
  summary = summarise(per_seed)
  result = {
      "finding": "report §4.1: self-summarisation vs prompt-based compaction",
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "command": " ".join([pathlib.Path(sys.argv[0]).name] + sys.argv[1:]),
      "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
      "load_average": os.getloadavg(), "seconds": time.monotonic() - started,
      "policy": policy, "smoke": args.smoke, "seeds": args.seeds,
      "settings": {"tasks": args.tasks, "difficulty": args.difficulty,
                   "tools": list(args.tools) or "the agent default",
                   "max_total_tokens": args.budget, "engine_max_length": args.max_length,
                   "summary_trigger_tokens": args.trigger,
                   "summary_tokens": args.summary_tokens, "max_turns": args.max_turns,
                   "temperature": 1.0},
      **summary, "verdict": verdict(summary), "episodes": episodes}
  (args.out / f"{NAME}.json").write_text(json.dumps(result, indent=1))
  title = (f"{policy}; {args.tasks} tasks x {args.seeds} seeds, budget {args.budget} "
           f"tokens, context {args.max_length}, trigger {args.trigger}")
  plot(summary, args.out / f"{NAME}.png", title)
  return result


def main(argv=None) -> None:
  result = run(parse_args(argv))
  for mode, m in result["modes"].items():
    print(f"{mode:>13}: pass rate {m['pass_rate']['mean']:.3f} "
          f"(seeds {m['pass_rate']['min']:.3f}-{m['pass_rate']['max']:.3f}), tokens "
          f"{m['tokens']['mean']:.0f}, compaction calls {m['compaction_tokens']['mean']:.0f}, "
          f"summaries {m['summaries']['mean']:.2f}")
  print(f"verdict: {result['verdict']['text']}")


if __name__ == "__main__":
  main()
