"""File tools: read_file, edit_file, write_file, list_dir, glob, grep."""

import fnmatch
import posixpath
import re

from c2jax.env import sandbox as sandbox_lib
from c2jax.env.tools.registry import ToolError, register_tool

_PATH = {'type': 'string', 'description': 'Path relative to the workspace root.'}
MAX_FILE_BYTES = 4 << 20


def _text(ctx, path: str) -> str:
  data = ctx.sandbox.read_file(path)
  if len(data) > MAX_FILE_BYTES:
    raise ToolError(f'{path} is {len(data)} bytes; only files under {MAX_FILE_BYTES} '
                    'bytes can be opened. Use grep or run_shell (head/sed) instead.')
  if b'\0' in data[:8192]:
    raise ToolError(f'{path} looks binary; inspect it with run_shell (e.g. xxd | head).')
  return data.decode('utf-8', errors='replace')


@register_tool('read_file', 'Read a text file; lines come numbered from 1.', {
    'path': _PATH,
    'offset': {'type': 'integer', 'description': 'First line to show (1-based).',
               'default': 1, 'minimum': 1},
    'limit': {'type': 'integer', 'description': 'Number of lines (default: config).',
              'minimum': 1}}, required=('path',))
def read_file(ctx, path, offset=1, limit=None):
  lines = _text(ctx, path).splitlines()
  limit = limit or ctx.config.read_lines
  shown = lines[offset - 1:offset - 1 + limit]
  if not shown and lines:
    raise ToolError(f'{path} has {len(lines)} lines; offset {offset} is past the end.')
  out = '\n'.join(f'{offset + i:6d}\t{line}' for i, line in enumerate(shown))
  rest = len(lines) - (offset - 1 + len(shown))
  if rest > 0:
    out += f'\n[... {rest} more lines; continue with offset={offset + len(shown)}]'
  return out or f'{path} is empty.'


@register_tool('edit_file', 'Replace one exact, unique occurrence of old_string with '
               'new_string. With old_string "" it creates a new file.', {
                   'path': _PATH,
                   'old_string': {'type': 'string', 'description': 'Exact text to replace '
                                  '(whitespace included); "" to create a file.'},
                   'new_string': {'type': 'string', 'description': 'Replacement text.'}},
               required=('path', 'old_string', 'new_string'))
def edit_file(ctx, path, old_string, new_string):
  try:
    text = _text(ctx, path)
  except FileNotFoundError:
    if old_string:
      raise
    ctx.sandbox.write_file(path, new_string.encode())
    return f'Created {path} ({len(new_string.splitlines())} lines).'
  if not old_string:
    raise ToolError(f'{path} already exists; give old_string to edit it, or use '
                    'write_file to replace it whole.')
  count = text.count(old_string)
  if count == 0:
    raise ToolError(f'old_string was not found in {path}; it must match exactly, '
                    'whitespace included. Read the file again and copy the text.')
  if count > 1:
    raise ToolError(f'old_string occurs {count} times in {path}; include more '
                    'surrounding lines so it is unique.')
  ctx.sandbox.write_file(path, text.replace(old_string, new_string, 1).encode())
  line = text[:text.index(old_string)].count('\n') + 1
  return f'Edited {path} at line {line}.'


@register_tool('write_file', 'Create or overwrite a file with the given content.', {
    'path': _PATH, 'content': {'type': 'string', 'description': 'Full file content.'}},
    required=('path', 'content'))
def write_file(ctx, path, content):
  ctx.sandbox.write_file(path, content.encode())
  return f'Wrote {path} ({len(content.encode())} bytes).'


def _under(ctx, path: str) -> tuple[str, list[str]]:
  prefix = sandbox_lib.normalize_relpath(path)
  files = ctx.sandbox.list_files()
  if prefix == '.':
    return prefix, files
  inside = [f for f in files if f.startswith(prefix + '/') or f == prefix]
  if not inside:
    raise FileNotFoundError(f'No such file or folder in the workspace: {prefix}')
  return prefix, inside


@register_tool('list_dir', 'List the files and folders directly inside a folder.', {
    'path': dict(_PATH, default='.')})
def list_dir(ctx, path='.'):
  prefix, files = _under(ctx, path)
  entries = set()
  for f in files:
    rest = f if prefix == '.' else f[len(prefix) + 1:]
    if not rest:
      raise ToolError(f'{prefix} is a file, not a folder; use read_file.')
    head, sep, _ = rest.partition('/')
    entries.add(head + ('/' if sep else ''))
  return '\n'.join(sorted(entries)) or f'{prefix} is empty.'


@register_tool('glob', 'Find files whose workspace path matches a shell pattern '
               "(fnmatch: '*' also matches '/', e.g. 'src/*.py' or '*test*').", {
                   'pattern': {'type': 'string', 'description': 'Pattern, e.g. *.py'}},
               required=('pattern',))
def glob(ctx, pattern):
  hits = [f for f in ctx.sandbox.list_files() if fnmatch.fnmatchcase(f, pattern)]
  more = len(hits) - ctx.config.max_matches
  out = '\n'.join(hits[:ctx.config.max_matches])
  return (out + (f'\n[... {more} more]' if more > 0 else '')) or 'No files match.'


@register_tool('grep', 'Search file contents with a Python regular expression.', {
    'pattern': {'type': 'string', 'description': 'Regular expression.'},
    'path': dict(_PATH, default='.', description='File or folder to search.'),
    'glob': {'type': 'string', 'description': 'Only files matching this pattern.'},
    'ignore_case': {'type': 'boolean', 'default': False,
                    'description': 'Case-insensitive match.'}}, required=('pattern',))
def grep(ctx, pattern, path='.', glob=None, ignore_case=False):  # pylint: disable=redefined-outer-name
  try:
    regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
  except re.error as e:
    raise ToolError(f'Invalid regular expression {pattern!r}: {e}.') from None
  _, files = _under(ctx, path)
  hits = []
  for f in files:
    if glob and not (fnmatch.fnmatchcase(f, glob) or
                     fnmatch.fnmatchcase(posixpath.basename(f), glob)):
      continue
    try:
      text = _text(ctx, f)
    except (ToolError, OSError, sandbox_lib.PathOutsideWorkspaceError):
      continue  # binary, huge or unreadable files are not searched
    for number, line in enumerate(text.splitlines(), 1):
      if regex.search(line):
        hits.append(f'{f}:{number}: {line[:300]}')
        if len(hits) > ctx.config.max_matches:
          return '\n'.join(hits[:-1]) + f'\n[... stopped after {ctx.config.max_matches} ' \
              'matches; narrow the pattern or path]'
  return '\n'.join(hits) or 'No matches.'
