"""Quick proxy eval of an SFT checkpoint on held-out difficulty-0 ('constant') tasks.

For each task it renders the prompt exactly as the agent loop does (the system message
listing the RL config's tools, the task, then <|assistant|>), generates one assistant
turn with JaxEngine (stop token <|end|>), parses it with the agent protocol and counts it
correct when its first call is edit_file with exactly the gold path, old_string and
new_string. No sandbox runs: a correct first call is what solves these tasks, so this
tracks the pass rate RL starts from at a fraction of a rollout's cost.

  python -m experiments.findings.eval_agent_sft --workdir runs/tiny_agent/sft --count 64 \
      --samples 4

Prints one JSON line: greedy accuracy, and at --temperature over --samples draws the
mean accuracy and best-of-k (a task counts when any draw is correct), plus how often
each field of the call was right (to see what the model has not learnt yet).
"""

import argparse
import json
import pathlib
import sys
import tempfile

import numpy as np

from c2jax import config as configlib
from c2jax.agent import config as agent_config
from c2jax.agent import prompt as prompt_lib
from c2jax.toolcalls import protocol
from c2jax.env import procgen
from c2jax.env.tools import registry
from c2jax.rollout import JaxEngine, Request, SamplingParams
from c2jax.train import run_loading

# Far from the recipe's training seeds (0 .. a few hundred), so no task is seen in SFT.
HELDOUT_SEED = 100_000
FIELDS = ('path', 'old_string', 'new_string')


def prompt_ids(tokenizer, task, tools) -> np.ndarray:
  """The agent loop's first prompt (system message listing `tools`, then the task)."""
  specs = [registry.get_tool(name).spec() for name in tools]
  system = prompt_lib.system_message(agent_config.SYSTEM_PROMPT, specs)
  return prompt_lib.prompt_ids(tokenizer, system, task.prompt)


def score_turn(text: str, gold: tuple[str, str, str]) -> dict[str, bool]:
  """Which parts of the first call match the gold edit; 'correct' when all do."""
  calls = protocol.parse_turn(text).calls
  first = calls[0] if calls else None
  is_edit = isinstance(first, protocol.ToolCall) and first.name == 'edit_file'
  args = first.arguments if is_edit else {}
  fields = {f: args.get(f) == g for f, g in zip(FIELDS, gold)}
  return {'edit_call': is_edit, **fields, 'correct': is_edit and all(fields.values())}


def generate_turns(engine, tokenizer, prompts, sampling) -> list[str]:
  generations = engine.generate([Request(p, sampling) for p in prompts])
  end_id = tokenizer.token_id(tokenizer.specials.end)
  return [tokenizer.decode([t for t in g.tokens if t != end_id]) for g in generations]


def evaluate(model_cfg, params, tokenizer, tasks, *, tools, samples: int,
             temperature: float, max_tokens: int, num_slots: int) -> dict:
  prompts = [prompt_ids(tokenizer, t, tools) for t in tasks]
  golds = [tuple(t.metadata['solution'][0]) for t in tasks]
  engine = JaxEngine(model_cfg, params, num_slots=num_slots,
                     max_length=max(len(p) for p in prompts) + max_tokens + 1,
                     detokenize=tokenizer.decode)
  end_id = tokenizer.token_id(tokenizer.specials.end)
  greedy = generate_turns(engine, tokenizer, prompts, SamplingParams(
      temperature=0.0, max_tokens=max_tokens, stop_tokens=(end_id,)))
  greedy_scores = [score_turn(text, gold) for text, gold in zip(greedy, golds)]
  correct_TxS = np.zeros((len(tasks), samples), bool)
  for s in range(samples):
    texts = generate_turns(engine, tokenizer, prompts, SamplingParams(
        temperature=temperature, max_tokens=max_tokens, stop_tokens=(end_id,),
        seed=1000 + s))
    correct_TxS[:, s] = [score_turn(t, g)['correct'] for t, g in zip(texts, golds)]
  mean = lambda key: float(np.mean([score[key] for score in greedy_scores]))
  return {
      'tasks': len(tasks), 'greedy_accuracy': mean('correct'),
      'greedy_fields': {key: mean(key) for key in ('edit_call', *FIELDS)},
      f'sampled_mean_accuracy_t{temperature:g}': float(correct_TxS.mean()),
      f'best_of_{samples}_t{temperature:g}': float(correct_TxS.any(axis=1).mean()),
      'greedy_example': greedy[0],
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', required=True, help='SFT stage folder (has config.json '
                      'and checkpoints/).')
  parser.add_argument('--count', type=int, default=64, help='Held-out tasks.')
  parser.add_argument('--seed', type=int, default=HELDOUT_SEED, help='First task seed.')
  parser.add_argument('--samples', type=int, default=4, help='Draws per task (best-of-k).')
  parser.add_argument('--temperature', type=float, default=1.0)
  # The gold turn is ~70 tokens with the pipeline's tokenizer.
  parser.add_argument('--max_tokens', type=int, default=96)
  parser.add_argument('--num_slots', type=int, default=64,
                      help='Sequences decoded together (at most --count are used).')
  parser.add_argument('--rl_config', default='configs/rl.py:tiny',
                      help='The RL config whose agent.tools the prompt lists.')
  args = parser.parse_args(argv)
  path, _, arg = args.rl_config.partition(':')
  tools = tuple(configlib.load_config_file(path, arg or None).agent.tools)
  run = run_loading.load_run(pathlib.Path(args.workdir).expanduser(), keep_mtp=True,
                             flag='--workdir')
  model_cfg, params, tokenizer = run.cfg, run.params, run.tokenizer
  with tempfile.TemporaryDirectory(prefix='c2jax-eval-d0-') as repos:
    tasks = procgen.generate_suite(repos, args.count, args.seed, difficulties=(0,))
  result = evaluate(model_cfg, params, tokenizer, tasks, tools=tools, samples=args.samples,
                    temperature=args.temperature, max_tokens=args.max_tokens,
                    num_slots=min(args.num_slots, args.count))
  print(json.dumps(result))
  return 0


if __name__ == '__main__':
  sys.exit(main())
