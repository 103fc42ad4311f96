"""The agent harness: the loop RL and evaluation share (`loop`, driving one `episode` per
task; `context`: when and how a segment is summarised), prompts and conversations, the
scripted solver, external harnesses, and what a chain did (`stats`).

Tool calls as text live in c2jax.toolcalls (re-exported here), the tools themselves in
c2jax.env.tools.
"""

from c2jax.toolcalls.protocol import (CallError, ToolCall, Turn, parse_turn, render_call,
                                      render_result, render_turn, to_openai_messages)

__all__ = ['CallError', 'ToolCall', 'Turn', 'parse_turn', 'render_call', 'render_result',
           'render_turn', 'to_openai_messages']
