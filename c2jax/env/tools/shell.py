"""run_shell and finish."""

from c2jax.env.tools.registry import register_tool, truncate_middle


@register_tool('run_shell', 'Run a shell command (sh -c) in the workspace. No network; '
               'processes do not outlive the command.', {
                   'command': {'type': 'string', 'description': 'The command line.'},
                   'timeout': {'type': 'number', 'minimum': 1,
                               'description': 'Seconds before it is killed.'}},
               required=('command',))
def run_shell(ctx, command, timeout=None):
  limit = ctx.config.shell_timeout_s
  result = ctx.sandbox.run_shell(command, timeout_s=min(timeout or limit, limit))
  status = f'exit code: {result.exit_code}'
  if result.timed_out:
    status += f' (killed: timed out after {min(timeout or limit, limit):g}s)'
  if result.truncated:
    status += ' (killed: too much output)'
  return status + '\n' + truncate_middle(result.text, ctx.config.max_output_chars)


@register_tool('finish', 'End the task; say briefly what was changed.', {
    'message': {'type': 'string', 'description': 'Summary for the user.', 'default': ''}})
def finish(ctx, message=''):
  ctx.finished = True
  ctx.final_message = message
  return 'Finished.'
