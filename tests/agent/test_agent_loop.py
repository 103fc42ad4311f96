"""The agent loop against scripted and fake engines, in real bubblewrap sandboxes (context
management: test_agent_context)."""

import json

import numpy as np
import pytest

from c2jax.agent import config as agent_config
from c2jax.agent import loop
from c2jax.agent import prompt as prompt_lib
from c2jax.data import chat
from c2jax.env import sandbox as sandbox_lib
from c2jax.rollout import FakeEngine
from tests.agent.agent_testlib import (LAYERS, TOP_K, ScriptedEngine, agent_cfg,
                                       assistant_runs, fix_turn, small_task, turn)


def test_replaying_the_solver_reproduces_the_chat_template_and_solves(solved_task,
                                                                      tokenizer):
  task, messages = solved_task
  turns = assistant_runs(chat.render(tokenizer, messages))
  engine = ScriptedEngine([turns])
  [trajectory] = loop.run_episodes(engine, tokenizer, agent_cfg(), [task])

  assert trajectory.finish_reason == "finish"
  assert trajectory.solved and trajectory.stats.tests_passed == trajectory.stats.tests_total
  [segment] = trajectory.segments
  # Token in, token out: the segment is exactly what the chat template renders for the
  # same exchange (the SFT layout), minus the closing <|eos|>. The result of `finish`
  # is in the transcript but never fed: no turn follows it.
  assert trajectory.messages[-1]["role"] == "tool"
  rendered = chat.render(tokenizer, trajectory.messages[:-1])
  np.testing.assert_array_equal(segment.tokens, rendered.ids[:-1])
  np.testing.assert_array_equal(segment.loss_mask, rendered.loss_mask[:-1])
  # Every request the engine got was a prefix of the final segment.
  for context in engine.contexts:
    np.testing.assert_array_equal(segment.tokens[:len(context)], context)

  stats = trajectory.stats
  assert stats.turns == len(turns) == 5
  assert stats.tool_call_counts["finish"] == 1 and stats.tool_call_counts["grep"] == 1
  assert stats.tool_call_errors == 0
  sampled = int(segment.loss_mask.sum())
  assert stats.thinking_tokens + stats.tool_call_tokens + stats.final_message_tokens == sampled
  prompt = prompt_lib.prompt_ids(tokenizer, trajectory.messages[0]["content"], task.prompt)
  assert stats.tool_output_tokens == len(segment.tokens) - len(prompt) - sampled
  assert np.all(segment.sampler_logprobs[segment.loss_mask == 1] == -0.5)
  assert np.all(segment.sampler_logprobs[segment.loss_mask == 0] == 0.0)
  assert np.all(segment.versions[segment.loss_mask == 0] == -1)
  assert segment.router_indices.shape == (len(segment.tokens), LAYERS, TOP_K)


def test_stops_at_max_turns(tmp_path, tokenizer):
  task = small_task(tmp_path)
  look = turn(tokenizer, "", [("list_dir", {"path": "."})])
  engine = ScriptedEngine([[look] * 5])
  [trajectory] = loop.run_episodes(engine, tokenizer, agent_cfg(max_turns=2), [task])
  assert trajectory.finish_reason == "max_turns"
  assert trajectory.stats.turns == 2 and not trajectory.solved
  assert trajectory.stats.tests_total == 1 and trajectory.stats.tests_passed == 0


def test_no_episode_starts_once_should_start_says_no(tmp_path, tokenizer):
  """Evaluation asked to stop: the episodes started run to their end and are reported;
  the rest never start (None, not reported), for a rerun to run."""
  task = small_task(tmp_path)
  engine = FakeEngine(vocab_size=tokenizer.vocab_size, num_slots=1, max_length=1024,
                      num_moe_layers=LAYERS, experts_per_token=TOP_K)
  reported, started = [], []

  def should_start():
    started.append(1)
    return len(started) == 1  # the first episode may start, no other

  trajectories = loop.run_episodes(engine, tokenizer, agent_cfg(max_turns=1), [task] * 3,
                                   seeds=[1, 2, 3], should_start=should_start,
                                   on_result=lambda i, r: reported.append(i))
  assert reported == [0] and trajectories[0] is not None and trajectories[1:] == [None, None]


def test_fake_engine_records_match_its_logprobs_and_weights_change_in_flight(tmp_path,
                                                                             tokenizer):
  """Sampled tokens with the engine's log-probs and versions; a weight swap from on_step
  lands mid-episode, and later tokens carry the new version."""
  task = small_task(tmp_path)
  engine = FakeEngine(vocab_size=tokenizer.vocab_size, num_slots=3, max_length=1024,
                      num_moe_layers=LAYERS, experts_per_token=TOP_K)
  steps = []

  def on_step():
    steps.append(1)
    if len(steps) == 5:
      engine.update_params(7, version=1)

  cfg = agent_cfg(temperature=1.0, max_turn_tokens=40, max_turns=3)
  trajectories = loop.run_episodes(engine, tokenizer, cfg, [task] * 3, seeds=[1, 2, 3],
                                   on_step=on_step)
  assert len(trajectories) == 3
  before_swap = FakeEngine(vocab_size=tokenizer.vocab_size, num_moe_layers=LAYERS,
                           experts_per_token=TOP_K, params=0)
  versions = set()
  for trajectory in trajectories:
    assert trajectory.finish_reason in loop.FINISH_REASONS
    for segment in trajectory.segments:
      mask = segment.loss_mask.astype(bool)
      logprobs = np.concatenate([[0.0], before_swap.logprobs([segment.tokens])[0]])
      # Version-0 tokens were sampled from params 0, whose log-probs `logprobs` gives.
      old = mask & (segment.versions == 0)
      np.testing.assert_allclose(segment.sampler_logprobs[old], logprobs[old], atol=1e-5)
      versions |= set(segment.versions[mask].tolist())
  assert versions == {0, 1}
  # Different seeds give different rollouts of the same prompt.
  assert len({tuple(t.segments[0].tokens.tolist()) for t in trajectories}) == 3


def test_open_todo_items_at_the_end_are_counted(tmp_path, tokenizer):
  task = small_task(tmp_path)
  plan = turn(tokenizer, "", [("todo", {"action": "add", "item": "set DONE"}),
                               ("todo", {"action": "add", "item": "run the tests"}),
                               ("todo", {"action": "done", "item": "1"}),
                               ("finish", {"message": "done"})])
  [trajectory] = loop.run_episodes(ScriptedEngine([[plan]]), tokenizer, agent_cfg(), [task])
  assert trajectory.finish_reason == "finish"
  assert trajectory.stats.unfinished_todos == 1


class _CrashingSandbox:
  """A real sandbox whose `crash_on` method raises SandboxError, as a dying sandbox
  does (anything else passes through)."""

  def __init__(self, inner, crash_on):
    self._inner, self._crash_on = inner, crash_on

  def __getattr__(self, name):
    if name == self._crash_on:
      def crash(*args, **kwargs):
        raise sandbox_lib.SandboxError(f"the sandbox died during {name}")
      return crash
    return getattr(self._inner, name)


def _flaky_factory(crashes):
  """Sandbox factory: the i-th sandbox crashes as crashes[i] says ('start': cannot be
  created; a method name: that call raises), later ones work. Records every call."""
  calls = []

  def factory(task):
    calls.append(task.id)
    how = crashes[len(calls) - 1] if len(calls) <= len(crashes) else None
    if how == "start":
      raise sandbox_lib.SandboxError("the sandbox could not start")
    sandbox = sandbox_lib.make_sandbox("bubblewrap", task.repo)
    return _CrashingSandbox(sandbox, how) if how else sandbox

  return factory, calls


def test_sandbox_crashes_are_retried_on_a_fresh_sandbox_not_scored(tmp_path, tokenizer):
  task = small_task(tmp_path)
  fix = fix_turn(tokenizer)
  # Attempt 1 cannot start; attempt 2 crashes inside the model's edit (after its turn was
  # sampled); attempt 3 works. The crash is not an observation the model is blamed for.
  factory, calls = _flaky_factory(["start", "write_file"])
  engine = ScriptedEngine([[fix], [fix]])
  [trajectory] = loop.run_episodes(engine, tokenizer, agent_cfg(), [task],
                                   sandbox_factory=factory, infra_retries=2)
  assert len(calls) == 3 and trajectory.infra_retries == 2
  assert trajectory.solved and trajectory.finish_reason == "finish"
  assert trajectory.stats.tool_call_errors == 0 and trajectory.stats.turns == 1
  # Only the successful attempt's tokens are in the trajectory.
  [segment] = trajectory.segments
  assert int(segment.loss_mask.sum()) == len(fix)


def test_a_rollout_failing_beyond_its_retries_raises(tmp_path, tokenizer):
  task = small_task(tmp_path)
  factory, calls = _flaky_factory(["start"] * 5)
  with pytest.raises(loop.RolloutError, match="could not start.*after 1 retries") as info:
    loop.run_episodes(ScriptedEngine([[fix_turn(tokenizer)]]), tokenizer, agent_cfg(),
                      [task], sandbox_factory=factory, infra_retries=1)
  assert len(calls) == 2 and info.value.retries == 1


def test_a_model_command_that_times_out_is_the_models_doing(tmp_path, tokenizer):
  task = small_task(tmp_path)
  slow = turn(tokenizer, "", [("run_shell", {"command": "sleep 5", "timeout": 1})])
  factory, calls = _flaky_factory([])
  [trajectory] = loop.run_episodes(ScriptedEngine([[slow]]), tokenizer,
                                   agent_cfg(max_turns=1), [task], sandbox_factory=factory,
                                   infra_retries=2)
  assert len(calls) == 1 and trajectory.infra_retries == 0
  assert trajectory.finish_reason == "max_turns" and not trajectory.solved
  assert "timed out" in trajectory.messages[-1]["content"]


class _BrokenEngine(ScriptedEngine):
  def _decode(self, batch):
    raise RuntimeError("device lost")


def test_an_engine_failure_is_an_engine_error(tmp_path, tokenizer):
  task = small_task(tmp_path)
  factory, _ = _flaky_factory([])
  with pytest.raises(loop.EngineError, match="device lost"):
    loop.run_episodes(_BrokenEngine([[fix_turn(tokenizer)]]), tokenizer, agent_cfg(),
                      [task], sandbox_factory=factory, infra_retries=2)


@pytest.mark.parametrize("directory,tool_format", [("qwen3", "qwen3"), ("kimi", "kimi_k2")])
def test_released_model_template_and_native_tool_calls_solve(solved_task, directory,
                                                              tool_format):
  """The same replay with a released model's tokenizer, chat template and native tool-call
  format: the segment is exactly the template's render of the transcript."""
  import pathlib
  from c2jax.toolcalls import formats
  from c2jax.data import chat_template, model_tokenizer
  from c2jax.env import tools as tools_lib
  fixtures = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "templates"
  tok = model_tokenizer.load_model_tokenizer(fixtures / directory)
  fmt = formats.get_format(tool_format)
  close = tok.token_id("<|im_end|>")
  task, messages = solved_task
  turns, turns_calls = [], []
  for message in messages:
    if message["role"] == "assistant":
      calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
               for c in message.get("tool_calls", [])]
      text = fmt.render_turn(message["content"], calls, first_call=sum(map(len, turns_calls)))
      turns_calls.append(calls)
      turns.append(tok.encode_chat(text)[0].tolist() + [close])
  engine = ScriptedEngine([turns], max_length=16384)  # a tiny vocabulary: long prompts
  cfg = agent_cfg(tool_format=tool_format, max_turn_tokens=2048, max_total_tokens=65536)
  [trajectory] = loop.run_episodes(engine, tok, cfg, [task])

  assert trajectory.finish_reason == "finish" and trajectory.solved
  [segment] = trajectory.segments
  specs = tools_lib.Toolbox(None, agent_config.toolset(cfg)).specs()
  rendered = chat_template.apply(tok, trajectory.messages, tools=specs)
  end = int(np.flatnonzero(rendered.loss_mask)[-1]) + 1  # the finish result is not fed
  np.testing.assert_array_equal(segment.tokens, rendered.ids[:end])
  np.testing.assert_array_equal(segment.loss_mask, rendered.loss_mask[:end])
  assert trajectory.stats.turns == len(turns) and trajectory.stats.tool_call_errors == 0
  assert trajectory.stats.tool_call_tokens > 0
