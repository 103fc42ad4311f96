"""Proposers of install commands: what to run so a repository's own tests can run.

A proposer sees the repository (a host folder) and every earlier attempt (commands, their
errors, the test run's outcome) and returns the next `Plan` or None (out of ideas).

  heuristic  reads pyproject.toml / setup.cfg / setup.py / requirements*.txt / tox.ini /
             noxfile.py / Makefile; escalates from "editable install with test extras and
             every declared test dependency" to plainer plans, and after a failed test run
             adds the distributions behind `No module named 'x'` errors.
  model      any OpenAI-compatible endpoint (e.g. `c2jax serve` over a checkpoint) reads a
             digest of the repository and the previous attempt's errors and answers JSON.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import os
import re
import shlex
import tomllib
from collections.abc import Callable

PIP = 'python -m pip install'
TEST_EXTRAS = ('test', 'tests', 'testing', 'dev', 'develop', 'development')
# Import names whose distribution is called something else (the common cases).
_DISTRIBUTION_OF = {'yaml': 'pyyaml', 'PIL': 'pillow', 'cv2': 'opencv-python-headless',
                    'sklearn': 'scikit-learn', 'bs4': 'beautifulsoup4', 'dateutil':
                    'python-dateutil', 'attr': 'attrs', 'Crypto': 'pycryptodome',
                    'jwt': 'pyjwt', 'magic': 'python-magic', 'serial': 'pyserial',
                    'google.protobuf': 'protobuf', 'pkg_resources': 'setuptools',
                    'hypothesis': 'hypothesis', 'mock': 'mock', 'nose': 'nose'}
_OLD_PYTEST_HOOKS = 'declared in the hookimpl but can not be found in the hookspec'
_MISSING_MODULE = re.compile(r"No module named '([A-Za-z0-9_.]+)'")


@dataclasses.dataclass(frozen=True)
class Plan:
  """Commands run in order in one fresh environment, then the test command (pytest with
  `{tests}` where test ids go)."""
  commands: tuple[str, ...]
  test_command: str
  note: str = ''


@dataclasses.dataclass
class AttemptRecord:
  plan: Plan
  ok: bool
  failed_command: str = ''
  error: str = ''                # tail of the failing command's or the test run's output
  test_summary: dict = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    return {'commands': list(self.plan.commands), 'test_command': self.plan.test_command,
            'note': self.plan.note, 'ok': self.ok, 'failed_command': self.failed_command,
            'error': self.error, 'test_summary': self.test_summary}


Proposer = Callable[[str, list[AttemptRecord]], Plan | None]
_PROPOSERS: dict[str, Callable[..., Proposer]] = {}


def register_proposer(name: str):
  def wrap(factory):
    _PROPOSERS[name] = factory
    return factory
  return wrap


def proposer_names() -> list[str]:
  return sorted(_PROPOSERS)


def make_proposer(name: str, **options) -> Proposer:
  if name not in _PROPOSERS:
    raise ValueError(f'Unknown install proposer {name!r}; choose one of {proposer_names()}.')
  return _PROPOSERS[name](**options)


def pytest_command(repo: str) -> str:
  # The workspace's own sources come first on the path, whatever the install did: tasks
  # edit the workspace and its tests must see the edits.
  path = 'src:.' if os.path.isdir(os.path.join(repo, 'src')) else '.'
  # A test module that cannot be imported is recorded (an ERROR) and the rest still run.
  # --color=no overrides a project's `addopts = --color=yes` (graders parse the lines).
  return (f'PYTHONPATH={path} python -m pytest -rA -q -p no:cacheprovider --color=no '
          '--continue-on-collection-errors {tests}')


def _read(repo: str, name: str) -> str:
  try:
    with open(os.path.join(repo, name), encoding='utf-8', errors='replace') as f:
      return f.read()
  except (FileNotFoundError, IsADirectoryError):
    return ''


def _extras(repo: str) -> list[str]:
  """Test-ish extras the project declares (pyproject, setup.cfg, setup.py)."""
  names = set()
  try:
    project = tomllib.loads(_read(repo, 'pyproject.toml')).get('project', {})
    names |= set(project.get('optional-dependencies', {}))
  except tomllib.TOMLDecodeError:
    pass
  parser = configparser.ConfigParser()
  try:
    parser.read_string(_read(repo, 'setup.cfg'))
    if parser.has_section('options.extras_require'):
      names |= set(parser.options('options.extras_require'))
  except configparser.Error:
    pass
  setup_py = _read(repo, 'setup.py')
  names |= set(re.findall(r'["\'](\w+)["\']\s*:\s*\[', setup_py)) & set(TEST_EXTRAS)
  return sorted(n for n in names if n in TEST_EXTRAS)


def _dependency_groups(repo: str) -> list[str]:
  try:
    groups = tomllib.loads(_read(repo, 'pyproject.toml')).get('dependency-groups', {})
  except tomllib.TOMLDecodeError:
    return []
  return sorted(g for g in groups if g in TEST_EXTRAS)


def _requirement_files(repo: str, test_only: bool) -> list[str]:
  found = []
  for folder in ('.', 'requirements', 'tests', 'test', 'testing', 'ci'):
    path = os.path.join(repo, folder)
    if not os.path.isdir(path):
      continue
    for name in sorted(os.listdir(path)):
      if not (name.endswith('.txt') or name.endswith('.in')) or 'doc' in name.lower():
        continue
      if folder != 'requirements' and not ('requirements' in name or name.startswith('req')):
        continue
      testish = folder != '.' or any(word in name.lower() for word in ('test', 'dev', 'ci'))
      if not test_only or testish:
        found.append(os.path.normpath(os.path.join(folder, name)))
  return found


def _is_requirement(line: str) -> bool:
  return bool(line) and not line.startswith(('#', '{', '.', '-e', '/')) and (
      re.match(r'^[A-Za-z0-9][A-Za-z0-9._\-\[\],]*\s*([<>=!~;].*)?$', line) is not None)


def _tox_deps(repo: str) -> list[str]:
  parser = configparser.ConfigParser(interpolation=None, strict=False)
  try:
    parser.read_string(_read(repo, 'tox.ini'))
  except configparser.Error:
    return []
  deps = []
  if parser.has_option('testenv', 'deps'):
    for line in parser.get('testenv', 'deps').splitlines():
      line = line.split('#')[0].strip()
      if ':' in line.split(' ')[0] and not line.startswith('-r'):  # factor-conditional
        continue
      if _is_requirement(line):
        deps.append(line)
  return deps


def _literal_installs(text: str, pattern: str) -> list[str]:
  """Literal package names in install calls (`session.install("a", "b")`, `pip install a`)."""
  out = []
  for args in re.findall(pattern, text):
    for word in re.findall(r'["\']([^"\']+)["\']', args) or args.split():
      if _is_requirement(word.strip()):
        out.append(word.strip())
  return out


def analyse(repo: str) -> dict:
  """What the heuristic proposer reads from the repository."""
  has_project = any(os.path.isfile(os.path.join(repo, name))
                    for name in ('pyproject.toml', 'setup.py', 'setup.cfg'))
  if has_project and not os.path.isfile(os.path.join(repo, 'setup.py')):
    try:
      pyproject = tomllib.loads(_read(repo, 'pyproject.toml'))
      has_project = 'project' in pyproject or 'build-system' in pyproject or (
          os.path.isfile(os.path.join(repo, 'setup.cfg')))
    except tomllib.TOMLDecodeError:
      has_project = False
  return {
      'has_project': has_project,
      'extras': _extras(repo),
      'groups': _dependency_groups(repo),
      'test_requirements': _requirement_files(repo, test_only=True),
      'requirements': _requirement_files(repo, test_only=False),
      'tox_deps': _tox_deps(repo),
      'nox_deps': _literal_installs(_read(repo, 'noxfile.py'), r'session\.install\(([^)]*)\)'),
      'make_deps': _literal_installs(_read(repo, 'Makefile'),
                                     r'pip3? install ([^\n&;|]*)'),
  }


def _quote_all(items) -> str:
  return ' '.join(shlex.quote(i) for i in items)


def heuristic_plans(repo: str) -> list[Plan]:
  """Plans from the richest (test extras, every test requirement) to the plainest."""
  info = analyse(repo)
  test = pytest_command(repo)
  declared = sorted(set(info['tox_deps'] + info['nox_deps'] + info['make_deps']))
  extra_deps = [f'{PIP} {_quote_all(declared)}'] if declared else []
  plans = []
  if info['has_project']:
    target = '.' + (f'[{",".join(info["extras"])}]' if info['extras'] else '')
    rich = [f'{PIP} -e {shlex.quote(target)}']
    rich += [f'{PIP} -r {shlex.quote(r)}' for r in info['requirements']]
    if info['groups']:  # dependency groups (PEP 735) need pip >= 25.1
      rich += [f'{PIP} -U pip'] + [f'{PIP} --group {shlex.quote(g)}' for g in info['groups']]
    plans.append(Plan(tuple(rich + extra_deps + [f'{PIP} pytest']), test,
                      'editable install with test extras and declared test dependencies'))
    plain = [f'{PIP} -e .'] + [f'{PIP} -r {shlex.quote(r)}' for r in info['test_requirements']]
    plans.append(Plan(tuple(plain + [f'{PIP} pytest']), test, 'plain editable install'))
    plans.append(Plan((f'{PIP} .', f'{PIP} pytest'), test, 'non-editable install'))
  reqs = [f'{PIP} -r {shlex.quote(r)}' for r in info['requirements']]
  plans.append(Plan(tuple(reqs + extra_deps + [f'{PIP} pytest']), test,
                    'no package install: requirements and the sources on PYTHONPATH'))
  unique = {}
  for plan in plans:
    unique.setdefault(plan.commands, plan)
  return list(unique.values())


def missing_module_lines(output: str) -> list[str]:
  return [f"ModuleNotFoundError: No module named '{m}'"
          for m in _MISSING_MODULE.findall(output)]


def missing_distributions(output: str) -> list[str]:
  """Distributions to add for the `No module named 'x'` errors in a test run's output."""
  names = []
  for module in _MISSING_MODULE.findall(output):
    top = module.split('.')[0]
    names.append(_DISTRIBUTION_OF.get(module, _DISTRIBUTION_OF.get(top, top)))
  return sorted(set(names))


@register_proposer('heuristic')
def heuristic(**unused) -> Proposer:
  del unused

  def propose(repo: str, history: list[AttemptRecord]) -> Plan | None:
    plans = heuristic_plans(repo)
    if history and not history[-1].ok and not history[-1].failed_command:
      # The install went through but tests failed to import something: add it.
      last = history[-1]
      tried = {c for h in history for c in h.plan.commands}
      extra = [f'{PIP} {shlex.quote(d)}' for d in missing_distributions(last.error)]
      extra = [c for c in extra if c not in tried]
      if extra:
        return Plan(last.plan.commands + tuple(extra), last.plan.test_command,
                    'previous plan + modules its tests could not import')
      older = f"{PIP} 'pytest<8'"
      if _OLD_PYTEST_HOOKS in last.error and older not in tried:
        # A conftest written for pytest < 8 (py.path `path` hook arguments).
        return Plan(tuple(older if c == f'{PIP} pytest' else c for c in last.plan.commands),
                    last.plan.test_command, 'previous plan with pytest < 8 (old conftest hooks)')
    tried_plans = {h.plan.commands for h in history}
    untried = [p for p in plans if p.commands not in tried_plans]
    return untried[0] if untried else None
  return propose


_DIGEST_FILES = ('pyproject.toml', 'setup.cfg', 'setup.py', 'tox.ini', 'noxfile.py',
                 'Makefile', 'requirements.txt', 'README.md', 'README.rst')
_SYSTEM = ('You set up Python repositories so that their own test suites run. Commands run '
           'with `sh -c` in a fresh virtual environment (python, pip on PATH) in the '
           'repository root; the network reaches only the package index. Answer with one '
           'JSON object: {"commands": ["shell command", ...], "test_command": "pytest '
           'command with {tests} where test ids go"} and nothing else.')


def repository_digest(repo: str, max_files: int = 200, max_chars: int = 3000) -> str:
  listing = []
  for dirpath, dirnames, filenames in os.walk(repo):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith('.'))
    listing += [os.path.relpath(os.path.join(dirpath, n), repo) for n in sorted(filenames)]
  parts = ['Files:\n' + '\n'.join(listing[:max_files])]
  for name in _DIGEST_FILES + tuple(_requirement_files(repo, test_only=False)):
    text = _read(repo, name)
    if text:
      parts.append(f'--- {name} ---\n{text[:max_chars]}')
  return '\n\n'.join(dict.fromkeys(parts))


def parse_plan(reply: str, repo: str) -> Plan:
  match = re.search(r'\{.*\}', reply, re.S)
  if not match:
    raise ValueError(f'The model answered no JSON object: {reply[:300]!r}')
  data = json.loads(match.group(0))
  commands = data.get('commands')
  if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
    raise ValueError(f'The model\'s "commands" is not a list of strings: {commands!r}')
  test = data.get('test_command') or pytest_command(repo)
  if '{tests}' not in test:
    test += ' {tests}'
  return Plan(tuple(commands), test, 'proposed by the model')


@register_proposer('model')
def model(base_url: str = '', model_name: str = '', api_key_env: str = 'OPENAI_API_KEY',
          fallback: bool = True, **unused) -> Proposer:
  """A model proposes; when its reply cannot be parsed, the heuristic plan is used."""
  del unused
  if not base_url or not model_name:
    raise ValueError('The model proposer needs model_base_url (an OpenAI-compatible '
                     'endpoint, e.g. http://127.0.0.1:8000/v1 from `c2jax serve`) and '
                     'model_name.')
  import openai  # pylint: disable=g-import-not-at-top

  client = openai.OpenAI(base_url=base_url, api_key=os.environ.get(api_key_env, 'none'))
  backup = heuristic()

  def propose(repo: str, history: list[AttemptRecord]) -> Plan | None:
    user = repository_digest(repo)
    for number, record in enumerate(history, 1):
      user += (f'\n\nAttempt {number} ran {json.dumps(list(record.plan.commands))} then '
               f'{record.plan.test_command!r}; it failed'
               + (f' at {record.failed_command!r}' if record.failed_command else ' its tests')
               + f':\n{record.error[-2000:]}')
    reply = client.chat.completions.create(
        model=model_name, temperature=0.0, max_tokens=1024,
        messages=[{'role': 'system', 'content': _SYSTEM}, {'role': 'user', 'content': user}])
    try:
      return parse_plan(reply.choices[0].message.content or '', repo)
    except (ValueError, json.JSONDecodeError):
      if not fallback:
        raise
      return backup(repo, history)
  return propose
