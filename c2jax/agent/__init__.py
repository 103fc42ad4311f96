"""The agent harness: the tool-call text protocol (`protocol`), tool-call formats, the loop.

Tools themselves live in c2jax.env.tools; `protocol` is the format models read/write.
"""

from c2jax.agent.protocol import (CallError, ToolCall, Turn, parse_turn, render_call,
                                  render_result, render_turn, to_openai_messages)

__all__ = ['CallError', 'ToolCall', 'Turn', 'parse_turn', 'render_call', 'render_result',
           'render_turn', 'to_openai_messages']
