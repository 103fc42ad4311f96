"""Task format and loaders (SWE-bench JSONL instances, Terminal-Bench / Harbor folders).

A Task is everything one rollout needs: the repository snapshot (a host folder), the
prompt, setup commands run before the agent starts, and hidden tests the agent never
sees: files written (`hidden_files`) and/or a diff applied (`test_patch`) only when
grading, then `test_command` run with the test ids. Its output is read per test id by
the log parser `test_parser` names (c2jax.env.testlogs: pytest, node's TAP, jest,
vitest, mocha, go test -json, cargo test). A task whose tests are one script
(Terminal-Bench, Harbor) keeps the default 'pytest' and lists one id, which passes when
the command exits with 0 and prints no pytest result line.
"""

import dataclasses
import json
import os
import tempfile
import tomllib

import yaml

from c2jax.env import testlogs

# Plugin autoload off: entry-point plugins of a big environment cost seconds per run.
PYTEST_COMMAND = ('PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -q '
                  '-p no:cacheprovider {tests}')


@dataclasses.dataclass
class Task:
  id: str
  repo: str
  prompt: str
  test_command: str = PYTEST_COMMAND
  test_parser: str = 'pytest'  # the testlogs.PARSERS entry that reads its output
  fail_to_pass: list[str] = dataclasses.field(default_factory=list)
  pass_to_pass: list[str] = dataclasses.field(default_factory=list)
  setup_commands: list[str] = dataclasses.field(default_factory=list)
  hidden_files: dict[str, str] = dataclasses.field(default_factory=dict)
  test_patch: str = ''
  # A venv layer from `c2jax tasks install` every sandbox of the task starts from ('' =
  # c2jax's own Python environment).
  environment: str = ''
  metadata: dict = dataclasses.field(default_factory=dict)  # category, difficulty, ...
  # The repository's language (c2jax.env.languages: its toolchain is mounted in the
  # task's bubblewrap sandboxes); '' for Python and hand-made tasks.
  language: str = ''

  def __post_init__(self):
    if not self.fail_to_pass:
      raise ValueError(f'Task {self.id!r} has no FAIL_TO_PASS tests; a task needs at '
                       'least one test the agent must make pass.')
    if self.test_parser not in testlogs.PARSERS:
      raise ValueError(f'Task {self.id!r} names test_parser {self.test_parser!r}; known '
                       f'parsers: {sorted(testlogs.PARSERS)}.')

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, record: dict) -> 'Task':
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(record) - known)
    if unknown:
      raise ValueError(f'Task record has unknown keys {unknown}; known: {sorted(known)}.')
    return cls(**record)


def save_jsonl(tasks: list[Task], path: str) -> None:
  with open(path, 'w') as f:
    for task in tasks:
      f.write(json.dumps(task.to_json()) + '\n')


def load_jsonl(path: str) -> list[Task]:
  """Tasks written by save_jsonl (c2jax's own format)."""
  with open(path) as f:
    return [Task.from_json(json.loads(line)) for line in f if line.strip()]


def _id_list(value) -> list[str]:
  return json.loads(value) if isinstance(value, str) else list(value)


def load_swebench_jsonl(path: str, repos_root: str, test_command: str = PYTEST_COMMAND,
                        test_parser: str = 'pytest') -> list[Task]:
  """SWE-bench-style instances; `repos_root/<instance_id>` holds each checkout at its
  base_commit (SWE-bench ships no repositories; check them out beforehand)."""
  tasks = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      record = json.loads(line)
      missing = {'instance_id', 'problem_statement', 'FAIL_TO_PASS'} - set(record)
      if missing:
        raise ValueError(f'{path}:{number} lacks SWE-bench field(s) {sorted(missing)}.')
      repo = os.path.join(repos_root, record['instance_id'])
      if not os.path.isdir(repo):
        raise FileNotFoundError(f'{path}:{number}: no checkout at {repo}; clone '
                                f'{record.get("repo")} at {record.get("base_commit")} there.')
      tasks.append(Task(
          id=record['instance_id'], repo=repo, prompt=record['problem_statement'],
          # c2jax's task builders record the command and environment layer per instance.
          test_command=record.get('test_command', test_command),
          test_parser=record.get('test_parser', test_parser),
          language=record.get('language', ''),
          environment=record.get('environment', ''), fail_to_pass=_id_list(record['FAIL_TO_PASS']),
          pass_to_pass=_id_list(record.get('PASS_TO_PASS', [])),
          test_patch=record.get('test_patch', ''),
          metadata={'source': 'swebench', 'repo': record.get('repo'),
                    'base_commit': record.get('base_commit'),
                    'version': record.get('version'),
                    'gold_patch': record.get('patch', '')}))
  return tasks


def _read_tree(folder: str, prefix: str) -> dict[str, str]:
  out = {}
  for dirpath, _, filenames in os.walk(folder):
    for name in filenames:
      full = os.path.join(dirpath, name)
      with open(full, encoding='utf-8', errors='replace') as f:
        out[os.path.join(prefix, os.path.relpath(full, folder))] = f.read()
  return out


def load_task_folder(folder: str) -> Task:
  """A Terminal-Bench (task.yaml, run-tests.sh, tests/) or Harbor (task.toml,
  instruction.md, tests/test.sh) task folder. The workspace starts from `environment/`
  when present (its Dockerfile, if any, is not built: the sandbox's own tools are used)."""
  name = os.path.basename(os.path.normpath(folder))
  env_dir = os.path.join(folder, 'environment')
  if os.path.exists(os.path.join(folder, 'task.toml')):
    with open(os.path.join(folder, 'task.toml'), 'rb') as f:
      config = tomllib.load(f)
    with open(os.path.join(folder, 'instruction.md')) as f:
      prompt = f.read()
    command, meta = 'bash tests/test.sh', config.get('metadata', {})
    hidden = _read_tree(os.path.join(folder, 'tests'), 'tests')
    source = 'harbor'
  elif os.path.exists(os.path.join(folder, 'task.yaml')):
    with open(os.path.join(folder, 'task.yaml')) as f:
      config = yaml.safe_load(f)
    prompt, meta = config['instruction'], config
    hidden = _read_tree(os.path.join(folder, 'tests'), 'tests')
    with open(os.path.join(folder, 'run-tests.sh')) as f:
      hidden['run-tests.sh'] = f.read()
    command, source = 'bash run-tests.sh', 'terminal-bench'
  else:
    raise FileNotFoundError(f'{folder} is not a task folder: expected task.toml + '
                            'instruction.md (Harbor) or task.yaml + run-tests.sh '
                            '(Terminal-Bench).')
  if not os.path.isdir(env_dir):
    env_dir = tempfile.mkdtemp(prefix=f'c2jax-{name}-empty-')
  metadata = {'source': source, 'category': meta.get('category'),
              'difficulty': meta.get('difficulty')}
  # The reference solution (never shown to the agent): what an oracle runs.
  for solution in ('solution.sh', os.path.join('solution', 'solve.sh')):
    if os.path.isfile(os.path.join(folder, solution)):
      with open(os.path.join(folder, solution)) as f:
        metadata['solution_script'] = f.read()
      break
  return Task(id=name, repo=env_dir, prompt=prompt, test_command=command,
              fail_to_pass=[name], hidden_files=hidden, metadata=metadata)


def is_task_folder(folder: str) -> bool:
  return (os.path.exists(os.path.join(folder, 'task.toml')) or
          os.path.exists(os.path.join(folder, 'task.yaml')))


def load_task_folders(path: str) -> list[Task]:
  """One Harbor / Terminal-Bench task folder, or every task folder directly inside
  `path` (a benchmark checkout's tasks/ directory), sorted by name."""
  if is_task_folder(path):
    return [load_task_folder(path)]
  if not os.path.isdir(path):
    raise FileNotFoundError(f'{path!r} is not a directory of Harbor / Terminal-Bench tasks.')
  folders = sorted(os.path.join(path, d) for d in os.listdir(path)
                   if is_task_folder(os.path.join(path, d)))
  if not folders:
    raise FileNotFoundError(f'{path} holds no task folders (task.toml or task.yaml).')
  return [load_task_folder(f) for f in folders]
