"""The todo tool: the agent's own to-do list, whose open items the RL reward penalises."""

from c2jax.toolcalls import protocol
from c2jax.env import tools as tools_lib


def _call(toolbox, **arguments):
  _, [observation] = toolbox.run_turn(protocol.render_call("todo", arguments))
  return observation


def test_add_done_and_list_track_open_items(box):
  toolbox = tools_lib.Toolbox(box)
  assert toolbox.open_todos == 0
  assert _call(toolbox, action="add", item="fix parser").output == "1. [ ] fix parser"
  _call(toolbox, action="add", item="add tests")
  assert toolbox.open_todos == 2
  done = _call(toolbox, action="done", item="1")
  assert done.ok and done.output == "1. [x] fix parser\n2. [ ] add tests"
  assert toolbox.open_todos == 1
  assert _call(toolbox, action="list").output.endswith("2. [ ] add tests")


def test_bad_todo_calls_are_error_observations(box):
  toolbox = tools_lib.Toolbox(box)
  for arguments, message in ((dict(action="remove"), "Unknown action"),
                             (dict(action="add"), "needs the item text"),
                             (dict(action="done", item="two"), "item number"),
                             (dict(action="done", item="3"), "no item 3")):
    observation = _call(toolbox, **arguments)
    assert not observation.ok and message in observation.output
  assert toolbox.open_todos == 0
