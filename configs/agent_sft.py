"""RL warm start: SFT of a CPU model, from scratch, on difficulty-0 procedural traces.

Difficulty-0 ('constant') tasks state their own fix ("In pkg/ledger.py, MAX_LEVEL is 7 but
it should be 2. Fix it."); the scripted solver answers with one edit_file call and a
finish call, in the agent loop's layout (system message listing configs/rl.py's tools).
The aim is a model that gets the whole edit right on part (15-60%) of held-out tasks,
leaving RL room to raise the pass rate; experiments/findings/eval_agent_sft.py measures it
(one turn), and `c2jax rl` measures it for real at its step 0 (sandboxes and hidden tests).
Measured for `tiny` (2-core CPU, 2026-11-22; docs/benchmarks.md, "Reinforcement
learning"): 600 steps on 320 traces copy the path but rarely the digits (greedy 6%,
sampled 0%); 300 more steps on 1,520 traces reach greedy 38%, sampled 27%, best-of-4 63%.
Copying the values needs many distinct traces, hence the sizes below (1,520 training
traces, 900 steps), which follow that measured run. Re-run in one piece on 2026-11-25
(6 min, ~8k tokens/s): held-out loss 0.046, but the digits were not learnt yet (greedy 0%,
sampled 2%); 75 / 100 more steps on 6,000 fresh traces (--config.traces.count=6016
--config.traces.seed=1 --config.sft.init_from=<that run>/sft --config.sft.train.steps=200
--config.sft.train.learning_rate=0.002) reach 22% / 55% sampled, 53% / 94% best-of-4: the
copying appears suddenly after ~950 steps (docs/findings.md, "The starting policy").

  c2jax pipeline --config=configs/agent_sft.py:tiny --workdir=runs/tiny_agent
The checkpoint lands in WORKDIR/sft/checkpoints. Chains:
  tiny_rl      traces -> SFT -> RL: configs/rl.py:tiny from WORKDIR/sft, in WORKDIR/rl
  tiny_cpt_rl  pretrain (configs/pretrain.py:tiny) -> traces -> SFT -> RL, the chain of the
               report's Fig. 2 (experiments/sweeps/fig2_chain.py sweeps its pretraining steps)
`tiny` itself also carries the rl section: --config.stages="('traces','sft','rl')" adds RL. There is no pretraining stage: copying
from the prompt is learnt from the traces alone, faster than a short pretraining helps.
The tokenizer is the pipeline's shared code-corpus BPE (the `data` section of
configs/pretrain.py for the variant), so the RL stage and the pretraining chain read
the same ids.
"""

import pathlib

import ml_collections

from c2jax import config as configlib

TEST_ARGS = ("tiny", "tiny_rl", "tiny_cpt_rl")
# variant -> (recipe size, stages)
CHAINS = {"tiny": ("tiny", ("traces", "sft")),
          "tiny_rl": ("tiny", ("traces", "sft", "rl")),
          "tiny_cpt_rl": ("tiny", ("pretrain", "traces", "sft", "rl"))}
HERE = pathlib.Path(__file__).parent

# Per-variant recipe sizes (2-core CPU).
RUNS = {
    # A trace is ~380 tokens (~200 of them the system message with the tool list).
    "tiny": dict(traces=1520, heldout=16, steps=900, batch_size=8, seq_len=384,
                 learning_rate=3e-3, warmup_steps=20),
}


def get_config(variant: str = "tiny"):
  variant = variant or "tiny"
  if variant not in CHAINS:
    raise ValueError(f"configs/agent_sft.py has no recipe for {variant!r}; variants: "
                     f"{sorted(CHAINS)}.")
  variant, stages = CHAINS[variant]
  run = RUNS[variant]
  c = ml_collections.ConfigDict()
  c.stages = stages
  # The pretraining job config supplies the plain model (no YaRN: the traces are short)
  # and the shared data section; it becomes an SFT job from scratch.
  c.sft = configlib.load_config_file(HERE / "pretrain.py", variant)
  c.sft.task = "sft"
  c.sft.init_from = ""
  for key in ("steps", "batch_size", "seq_len", "learning_rate", "warmup_steps"):
    c.sft.train[key] = run[key]
  c.sft.train.eval_every = run["steps"] // 4
  c.sft.train.eval_batches = 2
  c.sft.train.checkpoint_every = run["steps"] // 4
  c.sft.train.log_every = 25
  c.sft.sft.train_path = f"runs/{variant}_agent/traces/train.jsonl"
  c.sft.sft.heldout_path = f"runs/{variant}_agent/traces/heldout.jsonl"
  c.data = c.sft.data.copy_and_resolve_references()
  rl_agent = configlib.load_config_file(HERE / "rl.py", variant).agent
  c.traces = ml_collections.ConfigDict(
      {"count": run["traces"] + run["heldout"], "heldout": run["heldout"], "seed": 0,
       "backend": "bubblewrap", "difficulties": (0,),
       # The RL agent's tools: the traces show the system message RL rollouts start from.
       "tools": rl_agent.tools})
  c.sft.sft.tool_format = rl_agent.tool_format  # trace call ids as the agent parses them
  # RL from the SFT checkpoint (when "rl" is in stages): the pipeline sets its init_from to
  # WORKDIR/sft and its data section to `c.data`, so the policy reads the SFT ids.
  c.rl = configlib.load_config_file(HERE / "rl.py", variant)
  if "pretrain" in stages:
    # Continued pretraining on the shared corpus first; SFT then starts from WORKDIR/pretrain.
    c.pretrain = configlib.load_config_file(HERE / "pretrain.py", variant)
  return c
