"""The tool registry and what a tool runs with."""

import dataclasses
from typing import Callable


class ToolError(Exception):
  """A tool could not do what was asked; the message is shown to the model."""


@dataclasses.dataclass(frozen=True)
class ToolsetConfig:
  """Which tools an environment offers and how strictly arguments are checked.

  tools: names from the registry (`tool_names()`), in the order shown to the model.
  strict: reject unknown / wrong-typed arguments (else drop and convert).
  max_output_chars: observations longer than this keep their head and tail.
  shell_timeout_s: default and maximum timeout of run_shell.
  read_lines: default number of lines read_file returns.
  max_matches: most grep / glob / semantic_search results returned.
  """
  tools: tuple[str, ...] = ('read_file', 'edit_file', 'write_file', 'run_shell', 'grep',
                            'list_dir', 'glob', 'semantic_search', 'todo', 'finish')
  strict: bool = True
  max_output_chars: int = 16000
  shell_timeout_s: float = 30.0
  read_lines: int = 400
  max_matches: int = 100


@dataclasses.dataclass
class Context:
  """What tools see: the sandbox, the config, and state kept across calls."""
  sandbox: object
  config: ToolsetConfig
  finished: bool = False
  final_message: str = ''
  cache: dict = dataclasses.field(default_factory=dict)
  todos: list = dataclasses.field(default_factory=list)  # [text, done] (the todo tool)


@dataclasses.dataclass(frozen=True)
class Tool:
  name: str
  description: str
  parameters: dict  # JSON schema of the arguments object
  run: Callable[..., str]  # run(context, **arguments) -> observation text

  def spec(self) -> dict:
    """OpenAI-style function spec, for prompts and chat templates."""
    return {'type': 'function', 'function': {
        'name': self.name, 'description': self.description,
        'parameters': self.parameters}}


_TOOLS: dict[str, Tool] = {}


def register_tool(name: str, description: str, properties: dict,
                  required: tuple[str, ...] = ()):
  """Registers `fn(context, **arguments) -> str` under `name` with its JSON schema."""
  def wrap(fn):
    _TOOLS[name] = Tool(name, description, {
        'type': 'object', 'properties': properties, 'required': list(required)}, fn)
    return fn
  return wrap


def get_tool(name: str) -> Tool:
  return _TOOLS[name]


def registered() -> dict[str, Tool]:
  return dict(_TOOLS)


def truncate_middle(text: str, max_chars: int) -> str:
  """Keeps the head and tail of `text`, with a marker saying how much was cut."""
  if len(text) <= max_chars:
    return text
  half = max_chars // 2
  cut = len(text) - 2 * half
  return f'{text[:half]}\n[... {cut} characters truncated ...]\n{text[-half:]}'
