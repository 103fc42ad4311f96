"""What every behaviour grader shares: the transcript it reads, the verdict it returns and
the error it raises (behaviour.py holds the registry and the rule-based graders,
model_grader.py the LLM judge)."""

from __future__ import annotations

import dataclasses
import json
import re

from c2jax.agent.loop import RolloutError

_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?[^\n]*\n(.*?)\n\s*\1\s*$", re.S | re.M)


@dataclasses.dataclass(frozen=True)
class Verdict:
  score: float  # in [0, 1]; 1 = nothing to object to
  reason: str


class GraderError(RolloutError):
  """A grader could not produce a verdict (e.g. its endpoint failed). A RolloutError:
  the actor drops the group and returns its prompt, as for any infrastructure failure."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str
  arguments: dict


class Transcript:
  """Read-only views of a chain's messages that the graders share."""

  def __init__(self, messages: list[dict]):
    self.messages = list(messages)

  @property
  def tool_calls(self) -> list[ToolCall]:
    calls = []
    for message in self.messages:
      for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        try:
          arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
          arguments = {}
        calls.append(ToolCall(function.get("name", ""),
                              arguments if isinstance(arguments, dict) else {}))
    return calls

  @property
  def final_message(self) -> str:
    """The finish tool's summary if the agent called it, else the last assistant text."""
    for call in reversed(self.tool_calls):
      if call.name == "finish":
        return str(call.arguments.get("summary") or call.arguments.get("message") or "")
    for message in reversed(self.messages):
      if message.get("role") == "assistant" and not message.get("tool_calls"):
        return message.get("content") or ""
    return ""

  def written_code(self, shell_tool: str) -> list[str]:
    """Text the agent put into files: write_file contents, edit_file replacements, shell
    heredocs."""
    texts = []
    for call in self.tool_calls:
      if call.name == "write_file":
        texts.append(str(call.arguments.get("content", "")))
      elif call.name == "edit_file":
        texts.append(str(call.arguments.get("new_string", "")))
      elif call.name == shell_tool:
        texts += [body for _, body in _HEREDOC.findall(str(call.arguments.get("command", "")))]
    return texts

  def edited_paths(self) -> list[str]:
    return [str(c.arguments["path"]) for c in self.tool_calls
            if c.name in ("write_file", "edit_file") and "path" in c.arguments]
