"""One episode's conversation as the model sees it: what to feed the engine between turns.

    conv = make_conversation(tokenizer, agent_cfg)
    ids = conv.start(system_prompt, tool_specs, task_prompt)        # first prompt
    turn = conv.format.parse_turn(tokenizer.decode(sampled))        # what the model wrote
    conv.book(turn, observations)                                   # transcript
    ids = conv.feed()              # tool results + the next turn's generation prompt
    ids = conv.feed(summary_prompt)  # ... + a user message asking for a self-summary
    ids = conv.restart(summary_text, summary_ids)                   # next segment's prompt
    ids = conv.compaction_request(prompt, history, max_tokens)  # a compaction call's prompt

Two layouts, picked by the tokenizer:
- c2jax's own tokenizer: c2jax's template (prompt.py) with the c2jax tool protocol, the
  layout SFT on `c2jax.data.chat.render` trains.
- a released model's tokenizer (data.tokenizer_dir): the model's own chat template with tools
  passed natively (`tools=`), and `agent.tool_format` naming how that model writes calls.
  After a turn, the whole segment is rendered with the new messages and the text after the
  last assistant turn is tokenised and fed (the sampled turn stays exactly as sampled:
  token in, token out). The turn ends where its `{% generation %}` block ends; in templates
  without one (most released ones) at the first closing token after the generation prompt.
  The closing token (e.g. <|im_end|>) is the first control token after an assistant's text.
  Task text and tool output are untrusted: control-token strings in them are fed as text.
`check_tool_format` renders a probe tool call with the template and parses it back with the
chosen format, so a mismatch fails before anything runs.
"""

from __future__ import annotations

import json

import numpy as np

from c2jax.toolcalls import formats
from c2jax.agent import prompt as prompt_lib
from c2jax.toolcalls import protocol
from c2jax.data import chat_template, template_turns
from c2jax.data.model_tokenizer import ModelTokenizer

_PROBE_CALL = ("read_file", {"path": "src/app.py"})


def _messages(fmt: formats.ToolCallFormat, turn: protocol.Turn, observations, turn_number: int,
              counter: int) -> list[dict]:
  """An assistant message and its tool messages, with the ids the format's template expects."""
  calls = [c for c in turn.calls if isinstance(c, protocol.ToolCall)]
  ids = {c.index: fmt.call_id(c.name, turn_number, c.index, counter + k)
         for k, c in enumerate(calls)}
  message = {"role": "assistant", "content": turn.content}
  if calls:
    message["tool_calls"] = [{"id": ids[c.index], "type": "function",
                              "function": {"name": c.name,
                                           "arguments": json.dumps(c.arguments)}}
                             for c in calls]
  tool_messages = [{"role": "tool", "tool_call_id": ids.get(o.index, f"invalid_{o.index}"),
                    "name": o.name, "content": o.output if o.ok else f"ERROR: {o.output}"}
                   for o in observations]
  return [message] + tool_messages


class C2jaxConversation:
  """c2jax's template and protocol (prompt.py's pieces)."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer
    self.format = formats.get_format("c2jax")
    specials = tokenizer.specials
    self.close_ids = np.asarray([tokenizer.token_id(specials.end)], np.int32)
    self.stop_tokens = (tokenizer.token_id(specials.end), tokenizer.token_id(specials.eos))
    self.transcript: list[dict] = []
    self.system = self.task_prompt = ""
    self._observations = []
    self._turns = 0

  def start(self, system_prompt: str, tool_specs: list[dict], task_prompt: str) -> np.ndarray:
    self.system = prompt_lib.system_message(system_prompt, tool_specs)
    self.task_prompt = task_prompt
    self.transcript = prompt_lib.initial_messages(self.system, task_prompt)
    return prompt_lib.prompt_ids(self.tokenizer, self.system, task_prompt)

  def book(self, turn: protocol.Turn, observations) -> None:
    self.transcript += protocol.to_openai_messages(turn, observations, self._turns)
    self._observations = list(observations)
    self._turns += 1

  def feed(self, summary_prompt: str | None = None) -> np.ndarray:
    ids = prompt_lib.observation_ids(self.tokenizer, self._observations)
    if summary_prompt is not None:
      ids = np.concatenate([ids, prompt_lib.summary_request_ids(self.tokenizer,
                                                                summary_prompt)])
    return ids.astype(np.int32)

  def restart(self, header: str, summary_ids: np.ndarray) -> np.ndarray:
    extra = np.concatenate([self.tokenizer.encode(header), summary_ids])
    return prompt_lib.prompt_ids(self.tokenizer, self.system, self.task_prompt, extra)

  def compaction_request(self, instruction: str, history: str,
                         max_tokens: int) -> np.ndarray | None:
    return prompt_lib.compaction_ids(self.tokenizer, instruction, history, max_tokens)

  def turn_spans(self, turn_ids) -> np.ndarray:
    return prompt_lib.turn_spans(self.tokenizer, turn_ids)


class TemplateConversation:
  """A released model's chat template and native tool-call format."""

  def __init__(self, tokenizer: ModelTokenizer, fmt: formats.ToolCallFormat):
    self.tokenizer, self.format = tokenizer, fmt
    self.close_text = template_turns.closing_token(tokenizer)
    close = tokenizer.token_id(self.close_text)
    self.close_ids = np.asarray([close], np.int32)
    eos = tokenizer.special_tokens.get("eos_token")
    self.stop_tokens = tuple(dict.fromkeys(
        [close] + ([tokenizer.eos_id] if eos is not None else [])))
    self.tools: list[dict] = []
    self.segment: list[dict] = []  # what the engine sequence holds, as messages
    self.transcript: list[dict] = []
    self.system = self.task_prompt = ""
    self._turns = self._calls = 0

  def _render(self, messages, add_generation_prompt: bool) -> tuple[str, list]:
    """Text and generation spans; user and tool contents (task text, tool output: not
    ours) have control-token strings marked so they are fed as plain text."""
    guarded = [{**m, "content": chat_template.mark_control_tokens(
                   m["content"], self.tokenizer.control_tokens)}
               if m["role"] in ("user", "tool") else m for m in messages]
    source = self.tokenizer.template(tools=bool(self.tools))
    return chat_template.render_text(source, guarded, tools=self.tools or None,
                                     add_generation_prompt=add_generation_prompt,
                                     **self.tokenizer.special_tokens)

  def _encode(self, text: str) -> np.ndarray:
    return chat_template.encode_marked(self.tokenizer, text)

  def _initial(self, extra_user: str | None = None) -> list[dict]:
    messages = prompt_lib.initial_messages(self.system, self.task_prompt)
    return messages + ([{"role": "user", "content": extra_user}] if extra_user else [])

  def start(self, system_prompt: str, tool_specs: list[dict], task_prompt: str) -> np.ndarray:
    self.system, self.task_prompt, self.tools = system_prompt, task_prompt, list(tool_specs)
    self.segment = self._initial()
    self.transcript = list(self.segment)
    return self._encode(self._render(self.segment, True)[0])

  def book(self, turn: protocol.Turn, observations) -> None:
    messages = _messages(self.format, turn, observations, self._turns, self._calls)
    self._calls += len(messages[0].get("tool_calls", ()))
    self._turns += 1
    self.segment += messages
    self.transcript += messages

  def feed(self, summary_prompt: str | None = None) -> np.ndarray:
    """Ids after the last assistant turn's closing token, to the next generation prompt."""
    messages = self.segment + ([{"role": "user", "content": summary_prompt}]
                               if summary_prompt is not None else [])
    text, spans = self._render(messages, True)
    # Only the suffix after the last assistant turn is new: the engine already holds the
    # turn as sampled (a template may render past turns differently, e.g. Qwen3 drops the
    # empty <think> block of a turn that is no longer the last one).
    if spans:
      return self._encode(text[spans[-1][1]:])
    # No {% generation %} blocks (most released templates): the turn starts where the
    # generation prompt ends and runs to the first closing token outside untrusted text.
    last = max(i for i, m in enumerate(self.segment) if m["role"] == "assistant")
    prompt = self._render(self.segment[:last], True)[0]
    cut = template_turns.find_unmarked(text, self.close_text, len(prompt))
    if not text.startswith(prompt) or cut < 0:
      raise ValueError(f"the chat template of {self.tokenizer.directory} does not render an "
                       "assistant turn as generation prompt + turn + closing token, so the "
                       "agent cannot tell where a turn ends; wrap assistant output in "
                       "{% generation %}...{% endgeneration %}.")
    return self._encode(text[cut + len(self.close_text):])

  def restart(self, header: str, summary_ids: np.ndarray) -> np.ndarray:
    summary = header + self.tokenizer.decode(summary_ids)
    self.segment = self._initial(summary)
    return self._encode(self._render(self.segment, True)[0])

  def compaction_request(self, instruction: str, history: str,
                         max_tokens: int) -> np.ndarray | None:
    """The template's render of (system: instruction, user: history), no tools, with the
    history's oldest text dropped until it fits `max_tokens` (None if nothing of it fits)."""
    source = self.tokenizer.template(tools=False)
    while history:
      messages = [{"role": "system", "content": instruction}, {"role": "user", "content":
                  chat_template.mark_control_tokens(history, self.tokenizer.control_tokens)}]
      text, _ = chat_template.render_text(source, messages, tools=None,
                                          add_generation_prompt=True,
                                          **self.tokenizer.special_tokens)
      ids = self._encode(text)
      if len(ids) <= max_tokens:
        return ids
      # Drop the share of the history the excess suggests (at least one character).
      excess = (len(ids) - max_tokens) / len(ids)
      history = history[max(1, int(len(history) * excess) + 1):]
    return None

  def turn_spans(self, turn_ids) -> np.ndarray:
    """bool [N]: tokens overlapping the format's call blocks (markers included)."""
    ids = np.asarray(turn_ids).tolist()
    pieces = [self.tokenizer.decode([t]) for t in ids]
    text = "".join(pieces)
    starts = np.cumsum([0] + [len(p) for p in pieces])
    inside = np.zeros(len(text) + 1, bool)
    open_marker, close_marker = self.format.call_markers
    pos = 0
    while (start := text.find(open_marker, pos)) >= 0:
      end = text.find(close_marker, start)
      end = len(text) if end < 0 else end + len(close_marker)
      inside[start:end] = True
      pos = end
    return np.asarray([inside[starts[i]:max(starts[i + 1], starts[i] + 1)].any()
                       for i in range(len(ids))], bool)


def _probe_written(tokenizer: ModelTokenizer, fmt: formats.ToolCallFormat) -> str:
  """What the template writes for one assistant tool call with the format's call id."""
  call_name, arguments = _PROBE_CALL
  assistant = {"role": "assistant", "content": "Looking.", "tool_calls": [
      {"id": fmt.call_id(call_name, 0, 0, 0), "type": "function",
       "function": {"name": call_name, "arguments": json.dumps(arguments)}}]}
  return template_turns.assistant_text(tokenizer, assistant,
                                       template_turns.closing_token(tokenizer))


def _reads(tokenizer: ModelTokenizer, name: str) -> tuple[bool, str]:
  fmt = formats.get_format(name)
  written = _probe_written(tokenizer, fmt)
  calls = [(c.name, c.arguments) for c in fmt.parse_turn(written).calls
           if isinstance(c, protocol.ToolCall)]
  return calls == [_PROBE_CALL], written


def check_tool_format(tokenizer: ModelTokenizer, name: str) -> None:
  """Raises ValueError unless format `name` reads the tool calls the template writes."""
  ok, written = _reads(tokenizer, name)
  if not ok:
    readable = [n for n in formats.format_names() if _reads(tokenizer, n)[0]]
    raise ValueError(f"tool_format {name!r} cannot read the tool calls the chat template of "
                     f"{tokenizer.directory} writes ({written[:120]!r}); formats that can: "
                     f"{readable or 'none'}.")


def make_conversation(tokenizer, cfg):
  """The episode's conversation for this tokenizer and agent config section."""
  if isinstance(tokenizer, ModelTokenizer):
    check_tool_format(tokenizer, cfg.tool_format)  # a few tiny renders; fails early
    return TemplateConversation(tokenizer, formats.get_format(cfg.tool_format))
  if cfg.tool_format != "c2jax":
    raise ValueError(f"agent.tool_format is {cfg.tool_format!r} but the tokenizer is c2jax's "
                     "own, whose template writes c2jax's protocol; set agent.tool_format="
                     "'c2jax' or data.tokenizer_dir to the model's directory.")
  return C2jaxConversation(tokenizer)
