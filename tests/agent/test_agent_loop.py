"""The agent loop against scripted and fake engines, in real bubblewrap sandboxes."""

import json

import numpy as np
import pytest

from c2jax.agent import config as agent_config
from c2jax.agent import loop
from c2jax.agent import prompt as prompt_lib
from c2jax.data import chat
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.agent import solver
from c2jax.env import procgen
from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tasks as tasks_lib
from c2jax.rollout import FakeEngine
from c2jax.rollout.engine import Engine, SlotOutput

LAYERS, TOP_K = 1, 2


class ScriptedEngine(Engine):
  """Samples scripted turns: the i-th request on the n-th new sequence emits
  script[n][i] token by token (logprob -0.5 each), whatever the context."""

  def __init__(self, script, max_length=2048):
    super().__init__(num_slots=2, max_length=max_length)
    self.script, self.sequences = script, 0
    self.contexts = []  # the context of every request, as the engine saw it
    self._slot = {}

  def _next(self, slot):
    sequence, turn, pos = self._slot[slot]
    tokens = self.script[sequence][turn]
    self._slot[slot] = (sequence, turn, pos + 1)
    return int(tokens[min(pos, len(tokens) - 1)])

  def _append(self, slot, context, start, sampling, seed):
    if start == 0:
      self._slot[slot], self.sequences = (self.sequences, -1, 0), self.sequences + 1
    sequence, turn, _ = self._slot[slot]
    self._slot[slot] = (sequence, turn + 1, 0)
    self.contexts.append(list(context))
    routing = np.zeros((len(context) - start, LAYERS, TOP_K), np.int32)
    return self._next(slot), -0.5, routing

  def _decode(self, batch):
    return {int(s): SlotOutput(np.int32([self._next(int(s))]), np.float32([-0.5]),
                               np.ones((1, LAYERS, TOP_K), np.int32))
            for s in np.flatnonzero(batch.active)}

  def _set_params(self, params):
    pass

  def logprobs(self, sequences):
    raise NotImplementedError


@pytest.fixture(scope="module")
def solved_task(tmp_path_factory):
  """A procgen task and the scripted solver's transcript of fixing it."""
  task = procgen.generate(str(tmp_path_factory.mktemp("repos")), seed=3, difficulty=1)
  [trace] = solver.solve_suite([task])
  return task, trace["messages"]


@pytest.fixture(scope="module")
def tokenizer(solved_task):
  _, messages = solved_task
  texts = [m.get("content") or "" for m in messages] * 4
  texts += [prompt_lib.system_message(agent_config.SYSTEM_PROMPT, [])] * 4
  return tokenizer_lib.train_bpe(texts, 400)


def _assistant_runs(rendered):
  """The token runs the model produced in a rendered conversation (one per turn)."""
  runs, current = [], []
  for token, trained in zip(rendered.ids.tolist(), rendered.loss_mask.tolist()):
    if trained:
      current.append(token)
    elif current:
      runs.append(current)
      current = []
  return runs + ([current] if current else [])


def _config(**overrides):
  cfg = agent_config.default_config()
  cfg.temperature = 0.0
  cfg.update(overrides)
  agent_config.validate(cfg)
  return cfg


def test_replaying_the_solver_reproduces_the_chat_template_and_solves(solved_task,
                                                                      tokenizer):
  task, messages = solved_task
  turns = _assistant_runs(chat.render(tokenizer, messages))
  engine = ScriptedEngine([turns])
  [trajectory] = loop.run_episodes(engine, tokenizer, _config(), [task])

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


def _small_task(tmp_path):
  repo = tmp_path / "repo"
  (repo / "pkg").mkdir(parents=True)
  (repo / "pkg" / "flag.py").write_text("DONE = False\n")
  return tasks_lib.Task(id="flag", repo=str(repo), prompt="Set DONE to True in pkg/flag.py.",
                        test_command="grep -q 'DONE = True' pkg/flag.py",
                        fail_to_pass=["flag"])


def _turn(tokenizer, content, calls):
  """Token ids of an assistant turn as the chat template renders it (with <|end|>)."""
  message = {"role": "assistant", "content": content, "tool_calls": [
      {"id": f"c{i}", "type": "function",
       "function": {"name": n, "arguments": json.dumps(a)}}
      for i, (n, a) in enumerate(calls)]}
  rendered = chat.render(tokenizer, [{"role": "user", "content": "x"}, message])
  return _assistant_runs(rendered)[0]


def test_self_summary_starts_a_new_segment_from_system_task_and_summary(tmp_path, tokenizer):
  task = _small_task(tmp_path)
  look = _turn(tokenizer, "Looking.", [("read_file", {"path": "pkg/flag.py"})])
  summary = _turn(tokenizer, "I read pkg/flag.py; DONE must become True.", [])
  fix = _turn(tokenizer, "", [("edit_file", {"path": "pkg/flag.py",
                                             "old_string": "DONE = False",
                                             "new_string": "DONE = True"}),
                              ("finish", {"message": "done"})])
  engine = ScriptedEngine([[look, summary], [fix]])
  cfg = _config(context_management="self_summary", summary_trigger_tokens=301,
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


def test_stops_at_max_turns(tmp_path, tokenizer):
  task = _small_task(tmp_path)
  look = _turn(tokenizer, "", [("list_dir", {"path": "."})])
  engine = ScriptedEngine([[look] * 5])
  [trajectory] = loop.run_episodes(engine, tokenizer, _config(max_turns=2), [task])
  assert trajectory.finish_reason == "max_turns"
  assert trajectory.stats.turns == 2 and not trajectory.solved
  assert trajectory.stats.tests_total == 1 and trajectory.stats.tests_passed == 0


def test_fake_engine_records_match_its_logprobs_and_weights_change_in_flight(tmp_path,
                                                                             tokenizer):
  """Sampled tokens with the engine's log-probs and versions; a weight swap from on_step
  lands mid-episode, and later tokens carry the new version."""
  task = _small_task(tmp_path)
  engine = FakeEngine(vocab_size=tokenizer.vocab_size, num_slots=3, max_length=1024,
                      num_moe_layers=LAYERS, experts_per_token=TOP_K)
  steps = []

  def on_step():
    steps.append(1)
    if len(steps) == 5:
      engine.update_params(7, version=1)

  cfg = _config(temperature=1.0, max_turn_tokens=40, max_turns=3)
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
  task = _small_task(tmp_path)
  plan = _turn(tokenizer, "", [("todo", {"action": "add", "item": "set DONE"}),
                               ("todo", {"action": "add", "item": "run the tests"}),
                               ("todo", {"action": "done", "item": "1"}),
                               ("finish", {"message": "done"})])
  [trajectory] = loop.run_episodes(ScriptedEngine([[plan]]), tokenizer, _config(), [task])
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


def _fix_turn(tokenizer):
  return _turn(tokenizer, "", [("edit_file", {"path": "pkg/flag.py",
                                              "old_string": "DONE = False",
                                              "new_string": "DONE = True"}),
                               ("finish", {"message": "done"})])


def test_sandbox_crashes_are_retried_on_a_fresh_sandbox_not_scored(tmp_path, tokenizer):
  task = _small_task(tmp_path)
  fix = _fix_turn(tokenizer)
  # Attempt 1 cannot start; attempt 2 crashes inside the model's edit (after its turn was
  # sampled); attempt 3 works. The crash is not an observation the model is blamed for.
  factory, calls = _flaky_factory(["start", "write_file"])
  engine = ScriptedEngine([[fix], [fix]])
  [trajectory] = loop.run_episodes(engine, tokenizer, _config(), [task],
                                   sandbox_factory=factory, infra_retries=2)
  assert len(calls) == 3 and trajectory.infra_retries == 2
  assert trajectory.solved and trajectory.finish_reason == "finish"
  assert trajectory.stats.tool_call_errors == 0 and trajectory.stats.turns == 1
  # Only the successful attempt's tokens are in the trajectory.
  [segment] = trajectory.segments
  assert int(segment.loss_mask.sum()) == len(fix)


def test_a_rollout_failing_beyond_its_retries_raises(tmp_path, tokenizer):
  task = _small_task(tmp_path)
  factory, calls = _flaky_factory(["start"] * 5)
  with pytest.raises(loop.RolloutError, match="could not start.*after 1 retries") as info:
    loop.run_episodes(ScriptedEngine([[_fix_turn(tokenizer)]]), tokenizer, _config(),
                      [task], sandbox_factory=factory, infra_retries=1)
  assert len(calls) == 2 and info.value.retries == 1


def test_a_model_command_that_times_out_is_the_models_doing(tmp_path, tokenizer):
  task = _small_task(tmp_path)
  slow = _turn(tokenizer, "", [("run_shell", {"command": "sleep 5", "timeout": 1})])
  factory, calls = _flaky_factory([])
  [trajectory] = loop.run_episodes(ScriptedEngine([[slow]]), tokenizer,
                                   _config(max_turns=1), [task], sandbox_factory=factory,
                                   infra_retries=2)
  assert len(calls) == 1 and trajectory.infra_retries == 0
  assert trajectory.finish_reason == "max_turns" and not trajectory.solved
  assert "timed out" in trajectory.messages[-1]["content"]


class _BrokenEngine(ScriptedEngine):
  def _decode(self, batch):
    raise RuntimeError("device lost")


def test_an_engine_failure_is_an_engine_error(tmp_path, tokenizer):
  task = _small_task(tmp_path)
  factory, _ = _flaky_factory([])
  with pytest.raises(loop.EngineError, match="device lost"):
    loop.run_episodes(_BrokenEngine([[_fix_turn(tokenizer)]]), tokenizer, _config(),
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
  cfg = _config(tool_format=tool_format, max_turn_tokens=2048, max_total_tokens=65536)
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


def test_compaction_summarises_in_a_separate_untrained_call(tmp_path, tokenizer):
  """context_management='compaction': the segment ends at the model's turn; a separate
  sequence (compaction prompt + history as text) writes the summary, which starts the
  next segment like a self-summary but lies in no segment (never trained)."""
  task = _small_task(tmp_path)
  look = _turn(tokenizer, "Looking.", [("read_file", {"path": "pkg/flag.py"})])
  summary = _turn(tokenizer, "I read pkg/flag.py; DONE must become True.", [])
  engine = ScriptedEngine([[look], [summary], [_fix_turn(tokenizer)]])
  cfg = _config(context_management="compaction", summary_trigger_tokens=301,
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
  conv = conversation.make_conversation(tok, _config(tool_format="qwen3"))
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
  look = _turn(tokenizer, "Looking.", [("read_file", {"path": "pkg/flag.py"})])
  summary = _turn(tokenizer, "DONE must become True.", [])
  fix = _fix_turn(tokenizer)
  cfg = job.job_defaults("tiny")
  cfg.agent = _config(context_management=mode, summary_trigger_tokens=301,
                      max_turn_tokens=300, max_turns=2)
  cfg.rl.group_size, cfg.learner.groups_per_step = 2, 1
  # Both chains look and summarise; then chain 0 fixes (solved), chain 1 looks again.
  scripts = {"self_summary": [[[look, summary], [fix]], [[look, summary], [look]]],
             "compaction": [[[look], [summary], [fix]], [[look], [summary], [look]]]}[mode]
  chains = [loop.run_episodes(ScriptedEngine(script), tokenizer, cfg.agent,
                              [_small_task(tmp_path / str(i))])[0]
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
  look = _turn(tokenizer, "Looking.", [("read_file", {"path": "pkg/flag.py"})])
  summary = _turn(tokenizer, "DONE must become True.", [])
  engine = ScriptedEngine([[look, summary], [summary], [look]])
  cfg = _config(context_management=mode, summary_trigger_tokens=301, max_turn_tokens=300,
                max_total_tokens=len(look) + 3)
  [trajectory] = loop.run_episodes(engine, tokenizer, cfg, [_small_task(tmp_path)])
  assert trajectory.finish_reason == "budget"
  assert len(trajectory.segments) == 1 and trajectory.compaction_tokens == 0
  assert len(engine.contexts) == 1  # no summary request of either kind
