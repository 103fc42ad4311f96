"""Context management in the agent loop (c2jax.agent.context): self-summaries and
compaction against a scripted engine, in real bubblewrap sandboxes."""

import numpy as np
import pytest

from c2jax.agent import config as agent_config
from c2jax.agent import loop
from c2jax.agent import prompt as prompt_lib
from tests.agent.agent_testlib import ScriptedEngine, agent_cfg, fix_turn, small_task, turn


def test_self_summary_starts_a_new_segment_from_system_task_and_summary(tmp_path, tokenizer):
  task = small_task(tmp_path)
  look = turn(tokenizer, "Looking.", [("read_file", {"path": "pkg/flag.py"})])
  summary = turn(tokenizer, "I read pkg/flag.py; DONE must become True.", [])
  fix = turn(tokenizer, "", [("edit_file", {"path": "pkg/flag.py",
                                             "old_string": "DONE = False",
                                             "new_string": "DONE = True"}),
                              ("finish", {"message": "done"})])
  engine = ScriptedEngine([[look, summary], [fix]])
  cfg = agent_cfg(context_management="self_summary", summary_trigger_tokens=301,
                max_turn_tokens=300)
  [trajectory] = loop.run_episodes(engine, tokenizer, cfg, [task])

  assert trajectory.finish_reason == "finish" and trajectory.solved
  first, second = trajectory.segments
  # Segment 1 ends with the sampled summary; segment 2's prompt carries it as context.
  np.testing.assert_array_equal(first.tokens[-len(summary):], summary)
  assert first.loss_mask[-len(summary):].all()
  extra = np.concatenate([tokenizer.encode(cfg.summary_header), summary[:-1]])
  system = trajectory.messages[0]["content"]
  expected_prompt = prompt_lib.prompt_ids(tokenizer, system, task.prompt, extra)
  np.testing.assert_array_equal(second.tokens[:len(expected_prompt)], expected_prompt)
  assert not second.loss_mask[:len(expected_prompt)].any()
  np.testing.assert_array_equal(second.tokens[len(expected_prompt):][:len(fix)], fix)
  # Counts add up over the chain.
  assert trajectory.stats.turns == 2
  assert trajectory.stats.tool_calls == 3


def test_compaction_summarises_in_a_separate_untrained_call(tmp_path, tokenizer):
  """context_management='compaction': the segment ends at the model's turn; a separate
  sequence (compaction prompt + history as text) writes the summary, which starts the
  next segment like a self-summary but lies in no segment (never trained)."""
  task = small_task(tmp_path)
  look = turn(tokenizer, "Looking.", [("read_file", {"path": "pkg/flag.py"})])
  summary = turn(tokenizer, "I read pkg/flag.py; DONE must become True.", [])
  engine = ScriptedEngine([[look], [summary], [fix_turn(tokenizer)]])
  cfg = agent_cfg(context_management="compaction", summary_trigger_tokens=301,
                max_turn_tokens=300)
  [trajectory] = loop.run_episodes(engine, tokenizer, cfg, [task])

  assert trajectory.finish_reason == "finish" and trajectory.solved
  first, second = trajectory.segments
  system = trajectory.messages[0]["content"]
  prompt = prompt_lib.prompt_ids(tokenizer, system, task.prompt)
  np.testing.assert_array_equal(first.tokens, np.concatenate([prompt, look]))
  assert int(first.loss_mask.sum()) == len(look)  # the summary is not in it
  # The compaction call saw the instruction, the task and the tool result as text.
  compactor = tokenizer.decode(engine.contexts[1])
  assert cfg.compaction_prompt in compactor and task.prompt in compactor
  assert "DONE = False" in compactor and "read_file" in compactor
  extra = np.concatenate([tokenizer.encode(cfg.summary_header), summary[:-1]])
  expected = prompt_lib.prompt_ids(tokenizer, system, task.prompt, extra)
  np.testing.assert_array_equal(second.tokens[:len(expected)], expected)
  assert not second.loss_mask[:len(expected)].any()
  assert trajectory.compaction_tokens == len(engine.contexts[1])
  sampled = sum(int(s.loss_mask.sum()) for s in trajectory.segments)
  assert trajectory.total_tokens == (sampled + len(summary)
                                     + trajectory.stats.tool_output_tokens)


def test_compaction_prompt_keeps_the_newest_history_within_its_limit(tokenizer):
  history = prompt_lib.history_text("Fix it.", [
      {"role": "assistant", "content": "first", "tool_calls": [
          {"function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
      {"role": "tool", "name": "read_file", "content": "old " * 50 + "newest"}])
  assert "call read_file" in history and history.startswith("Task: Fix it.")
  full = prompt_lib.compaction_ids(tokenizer, "Summarise.", history, 10_000)
  cut = prompt_lib.compaction_ids(tokenizer, "Summarise.", history, len(full) - 20)
  assert len(cut) == len(full) - 20
  np.testing.assert_array_equal(cut[-30:], full[-30:])  # the oldest tokens went
  assert prompt_lib.compaction_ids(tokenizer, "Summarise.", history, 5) is None


@pytest.mark.parametrize("overrides,message", [
    (dict(context_management="rolling"), "expected one of"),
    (dict(summary_trigger_tokens=500), "nothing would be summarised"),
    (dict(context_management="compaction"), "needs a trigger"),
    (dict(context_management="self_summary", summary_trigger_tokens=500,
          external=dict(enabled=True)), "external harness")])
def test_context_management_config_errors_name_the_key(overrides, message):
  from c2jax import config as configlib
  cfg = agent_config.default_config()
  cfg.update(overrides)
  with pytest.raises(configlib.ConfigError, match=message):
    agent_config.validate(cfg)


def test_compaction_prompt_in_a_released_models_template_fits_its_limit():
  import pathlib
  from c2jax.agent import conversation
  from c2jax.data import model_tokenizer
  fixtures = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "templates"
  tok = model_tokenizer.load_model_tokenizer(fixtures / "qwen3")
  conv = conversation.make_conversation(tok, agent_cfg(tool_format="qwen3"))
  history = prompt_lib.history_text("Fix it.", [
      {"role": "tool", "name": "read_file", "content": "old " * 200 + "newest"}])
  full = conv.compaction_request("Summarise.", history, 100_000)
  cut = conv.compaction_request("Summarise.", history, len(full) // 2)
  assert len(cut) <= len(full) // 2
  assert "newest" in tok.decode(cut) and "Summarise." in tok.decode(cut)
  assert "Task: Fix it." not in tok.decode(cut)  # the oldest text went
  assert conv.compaction_request("Summarise.", history, 3) is None


@pytest.mark.parametrize("mode", ["self_summary", "compaction"])
def test_every_segment_of_a_summarised_chain_reaches_the_learner_batch(tmp_path, tokenizer,
                                                                       mode):
  """RL trains every segment of a chain with the chain's advantage; a compaction call's
  summary is in no segment, so it is in no batch row."""
  from c2jax.rl import job
  from c2jax.rl.learner import runtime as learner_runtime
  from c2jax.rl.actors import rollouts
  look = turn(tokenizer, "Looking.", [("read_file", {"path": "pkg/flag.py"})])
  summary = turn(tokenizer, "DONE must become True.", [])
  fix = fix_turn(tokenizer)
  cfg = job.job_defaults("tiny")
  cfg.agent = agent_cfg(context_management=mode, summary_trigger_tokens=301,
                      max_turn_tokens=300, max_turns=2)
  cfg.rl.group_size, cfg.learner.groups_per_step = 2, 1
  # Both chains look and summarise; then chain 0 fixes (solved), chain 1 looks again.
  scripts = {"self_summary": [[[look, summary], [fix]], [[look, summary], [look]]],
             "compaction": [[[look], [summary], [fix]], [[look], [summary], [look]]]}[mode]
  chains = [loop.run_episodes(ScriptedEngine(script), tokenizer, cfg.agent,
                              [small_task(tmp_path / str(i))])[0]
            for i, script in enumerate(scripts)]
  assert chains[0].solved and not chains[1].solved
  group, _ = rollouts.make_group(cfg.rl, "flag", chains)
  batch, info = learner_runtime.build_batch(cfg, [group])
  segments = [s for chain in chains for s in chain.segments]
  assert len(chains[0].segments) == 2 and info["segments"] == len(segments)
  # The batch rows are exactly the segments, each with its chain's advantage.
  rows = []
  for row in range(len(batch["tokens"])):
    n = int(batch["valid"][row].sum())
    if n:
      rows.append((tuple(batch["tokens"][row, :n].tolist()),
                   tuple(batch["loss_mask"][row, :n].tolist()), float(batch["advantages"][row])))
  expected = [(tuple(segment.tokens.tolist()), tuple(segment.loss_mask.tolist()),
               float(group.advantages_G[chain_index]))
              for chain_index, chain in enumerate(chains) for segment in chain.segments]
  assert sorted(rows) == sorted(expected)
  assert group.advantages_G[0] > 0 > group.advantages_G[1]
  sampled = int(batch["loss_mask"].sum())
  assert sampled == sum(int(s.loss_mask.sum()) for s in segments)
  if mode == "compaction":  # the summary tokens are trained nowhere
    assert sampled == 3 * len(look) + len(fix)


@pytest.mark.parametrize("mode", ["self_summary", "compaction"])
def test_a_chain_that_spent_its_token_budget_is_not_summarised(tmp_path, tokenizer, mode):
  """The turn's tool results use up agent.max_total_tokens: the chain ends ('budget')
  instead of summarising past its budget."""
  look = turn(tokenizer, "Looking.", [("read_file", {"path": "pkg/flag.py"})])
  summary = turn(tokenizer, "DONE must become True.", [])
  engine = ScriptedEngine([[look, summary], [summary], [look]])
  cfg = agent_cfg(context_management=mode, summary_trigger_tokens=301, max_turn_tokens=300,
                max_total_tokens=len(look) + 3)
  [trajectory] = loop.run_episodes(engine, tokenizer, cfg, [small_task(tmp_path)])
  assert trajectory.finish_reason == "budget"
  assert len(trajectory.segments) == 1 and trajectory.compaction_tokens == 0
  assert len(engine.contexts) == 1  # no summary request of either kind
