"""Agent tools over a sandbox: registry, per-environment configuration, execution.

`Toolbox(sandbox, ToolsetConfig(...)).run_turn(text)` parses a model turn in the
tool-call protocol (c2jax.toolcalls.protocol), runs each call and returns one Observation
per call. Nothing a model writes can make it raise: every problem becomes an error
observation that says what was wrong. Only a failure of the sandbox itself
(sandbox.SandboxError) propagates: that is infrastructure, not the model's doing.
"""

import dataclasses

from c2jax.toolcalls import protocol
from c2jax.env import sandbox as sandbox_lib
from c2jax.env.tools import files, schema, semantic, shell, todo  # pylint: disable=unused-import  (registration)
from c2jax.env.tools.registry import (Context, Tool, ToolError, ToolsetConfig,
                                      get_tool, register_tool, registered,
                                      truncate_middle)

__all__ = ['Observation', 'Tool', 'ToolError', 'Toolbox', 'ToolsetConfig', 'register_tool',
           'tool_names']


def tool_names() -> list[str]:
  return sorted(registered())


@dataclasses.dataclass(frozen=True)
class Observation:
  index: int
  name: str
  ok: bool
  output: str

  def render(self) -> str:
    return protocol.render_result(self.name, self.ok, self.output)


class Toolbox:
  """The tools one environment offers, bound to its sandbox."""

  def __init__(self, sandbox: sandbox_lib.Sandbox, config: ToolsetConfig = ToolsetConfig()):
    unknown = sorted(set(config.tools) - set(registered()))
    if unknown:
      raise ValueError(f'ToolsetConfig.tools names unknown tool(s) {unknown}; '
                       f'registered tools are {tool_names()}.')
    self.config = config
    self.context = Context(sandbox=sandbox, config=config)
    self.tools = {name: get_tool(name) for name in config.tools}

  @property
  def finished(self) -> bool:
    return self.context.finished

  @property
  def open_todos(self) -> int:
    """To-do items (todo tool) not marked done."""
    return todo.open_items(self.context)

  def specs(self) -> list[dict]:
    return [tool.spec() for tool in self.tools.values()]

  def call(self, call) -> Observation:
    """Runs one ToolCall (or reports a CallError); raises only SandboxError."""
    if isinstance(call, protocol.CallError):
      return Observation(call.index, call.name, False, call.message)
    tool = self.tools.get(call.name)
    if tool is None:
      return Observation(call.index, call.name, False,
                         f'Unknown tool {call.name!r}; available tools: '
                         f'{", ".join(self.tools)}.')
    try:
      arguments = schema.validate(call.name, call.arguments, tool.parameters,
                                  self.config.strict)
      output, ok = tool.run(self.context, **arguments), True
    except (schema.ArgumentError, ToolError, sandbox_lib.PathOutsideWorkspaceError,
            FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
      output, ok = str(e), False
    except sandbox_lib.SandboxError:
      raise  # infrastructure failed: the rollout is retried, the model is not blamed
    except Exception as e:  # pylint: disable=broad-except
      # A tool bug must not end the rollout; the model sees it as an error.
      output, ok = f'{call.name} failed unexpectedly: {type(e).__name__}: {e}', False
    return Observation(call.index, call.name, ok,
                       truncate_middle(output, self.config.max_output_chars))

  def run_turn(self, text, parse=protocol.parse_turn) -> tuple[protocol.Turn, list[Observation]]:
    """Parses a model turn (with `parse`, a tool-call format's parser; c2jax's protocol
    by default) and runs its calls in order, stopping after `finish`."""
    turn = parse(text)
    observations = []
    for call in turn.calls:
      if self.finished:
        observations.append(Observation(call.index, getattr(call, 'name', 'invalid'),
                                        False, 'Not run: finish was already called.'))
        continue
      observations.append(self.call(call))
    return turn, observations
