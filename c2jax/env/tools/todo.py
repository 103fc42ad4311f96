"""A to-do list the agent keeps for itself; items still open at the end are penalised by
the RL reward term `unfinished_todos` (the report's penalty for leaving to-dos undone)."""

from c2jax.env.tools.registry import ToolError, register_tool

ACTIONS = ('add', 'done', 'list')


def _render(todos) -> str:
  if not todos:
    return 'The to-do list is empty.'
  return '\n'.join(f'{i}. [{"x" if done else " "}] {text}'
                   for i, (text, done) in enumerate(todos, start=1))


def open_items(ctx) -> int:
  return sum(1 for _, done in ctx.todos if not done)


@register_tool('todo', 'Keep a to-do list: add an item, mark item N done, or list them.', {
    'action': {'type': 'string', 'description': 'add | done | list'},
    'item': {'type': 'string', 'description': 'The text to add, or the number to mark done.',
             'default': ''}}, required=('action',))
def todo(ctx, action, item=''):
  if action not in ACTIONS:
    raise ToolError(f'Unknown action {action!r}; use one of {", ".join(ACTIONS)}.')
  if action == 'add':
    if not item.strip():
      raise ToolError('add needs the item text in "item".')
    ctx.todos.append([item.strip(), False])
  elif action == 'done':
    try:
      index = int(item) - 1
    except ValueError:
      raise ToolError(f'done needs an item number in "item", got {item!r}.') from None
    if not 0 <= index < len(ctx.todos):
      raise ToolError(f'There is no item {item}; the list has {len(ctx.todos)} item(s).')
    ctx.todos[index][1] = True
  return _render(ctx.todos)
