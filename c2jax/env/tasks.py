"""Task format and loaders (SWE-bench JSONL instances, Terminal-Bench / Harbor folders).

A Task is everything one rollout needs: the repository snapshot (a host folder), the
prompt, setup commands run before the agent starts, and hidden tests the agent never
sees: files written (`hidden_files`) and/or a diff applied (`test_patch`) only when
grading, then `test_command` run with the test ids. Its output is read per test id by
the log parser `test_parser` names (c2jax.env.testlogs: pytest, node's TAP, jest,
vitest, mocha, go test -json, cargo test). A task whose tests are one script
(Terminal-Bench, Harbor) keeps the default 'pytest' and lists one id, which passes when
the command exits with 0 and prints no pytest result line.

A Terminal-Bench / Harbor folder loaded with build_image has a docker `image` built from
its Dockerfile (c2jax.env.images): its sandboxes start from it, the image's WORKDIR
their workspace, and its tests run as the benchmarks run them: the tests folder (and
Terminal-Bench's run-tests.sh) in a fresh /tests, the script run from the WORKDIR with
TEST_DIR=/tests. Without an image they stay in the workspace (tests/, run-tests.sh) and
run from there. Either way Harbor's reward file (/logs/verifier/reward.txt, or
reward.json's "reward"; the folder is emptied first) is the verdict when the script
writes one (1 passes), else the script's exit status; its log is printed with every
line behind '| ', so that the pytest lines of the tests it runs are not read as the
task's own test ids.
"""

import atexit
import dataclasses
import functools
import json
import os
import shutil
import tempfile
import tomllib

import yaml

from c2jax.env import testlogs

# Plugin autoload off: entry-point plugins of a big environment cost seconds per run.
PYTEST_COMMAND = ('PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -q '
                  '-p no:cacheprovider {tests}')

# A built task's hidden tests are written here in the grader's workspace; its test
# command moves them to /tests before running its script (see the module docstring).
IMAGE_TESTS_DIR = '.c2jax_tests'
_TO_TESTS_DIR = r"""rm -rf /tests && mkdir -p /tests && cp -R {hidden}/. /tests/ &&
  rm -rf {hidden} || {{ echo 'c2jax: could not put the tests in /tests'; exit 1; }}
"""
# A folder task's test command: its script, then the verdict (see the module docstring).
_SCRIPT_TEST_COMMAND = r"""{prepare}rm -rf /logs/verifier && mkdir -p /logs/verifier ||
  {{ echo 'c2jax: could not make /logs/verifier'; exit 1; }}
log=$(mktemp)
{env}bash {script} > "$log" 2>&1
code=$?
sed 's/^/| /' "$log"
rm -f "$log"
if [ -s /logs/verifier/reward.txt ]; then
  reward=$(tr -d ' \t\r\n' < /logs/verifier/reward.txt); from=reward.txt
elif [ -s /logs/verifier/reward.json ]; then
  reward=$(tr -d ' \t\r\n' < /logs/verifier/reward.json |
           sed -n 's/.*"reward":\([-+.0-9eE]*\).*/\1/p'); from=reward.json
else
  echo "c2jax: {script} exited $code and wrote no reward file: its exit status decides"
  exit $code
fi
echo "c2jax: /logs/verifier/$from says ${{reward:-no reward}} ({script} exited $code)"
[ "$(echo "$reward" | sed 's/\.0*$//')" = 1 ]
"""


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
  # A Terminal-Bench / Harbor folder's Dockerfile ('' = none), and the image built from
  # it (c2jax.env.images; '' = not built): the docker backend starts the task's
  # sandboxes from the image, its WORKDIR the workspace, instead of copying `repo` in.
  dockerfile: str = ''
  image: str = ''

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


def load_task_folder(folder: str, build_image: bool = False,
                     base_images: dict[str, str] | None = None) -> Task:
  """A Terminal-Bench (task.yaml, run-tests.sh, tests/, a Dockerfile at the root) or
  Harbor (task.toml, instruction.md, tests/test.sh, environment/Dockerfile) task folder.

  With build_image, the folder's Dockerfile is built (c2jax.env.images, once: a second
  load finds the image; `base_images` extends the base-image table) and the task runs in
  that image (see the module docstring). Without it, or without a Dockerfile, the
  workspace starts from `environment/` (else empty) with the sandbox's own tools, and the
  tests run in the workspace (`bash tests/test.sh`, `bash run-tests.sh`); the
  Dockerfile, if any, is recorded but not built."""
  name = os.path.basename(os.path.normpath(folder))
  env_dir = os.path.join(folder, 'environment')
  if os.path.exists(os.path.join(folder, 'task.toml')):
    with open(os.path.join(folder, 'task.toml'), 'rb') as f:
      config = tomllib.load(f)
    with open(os.path.join(folder, 'instruction.md')) as f:
      prompt = f.read()
    script, meta, scripts = 'tests/test.sh', config.get('metadata', {}), {}
    source, context = 'harbor', env_dir
  elif os.path.exists(os.path.join(folder, 'task.yaml')):
    with open(os.path.join(folder, 'task.yaml')) as f:
      config = yaml.safe_load(f)
    prompt, meta = config['instruction'], config
    with open(os.path.join(folder, 'run-tests.sh')) as f:
      scripts = {'run-tests.sh': f.read()}
    script, source, context = 'run-tests.sh', 'terminal-bench', folder
  else:
    raise FileNotFoundError(f'{folder} is not a task folder: expected task.toml + '
                            'instruction.md (Harbor) or task.yaml + run-tests.sh '
                            '(Terminal-Bench).')
  tests = _read_tree(os.path.join(folder, 'tests'), '')
  dockerfile = os.path.join(context, 'Dockerfile')
  dockerfile = os.path.abspath(dockerfile) if os.path.isfile(dockerfile) else ''
  if not os.path.isdir(env_dir):
    env_dir = _empty_folder()
  metadata = {'source': source, 'category': meta.get('category'),
              'difficulty': meta.get('difficulty')}
  # The reference solution (never shown to the agent): what an oracle runs.
  for solution in ('solution.sh', os.path.join('solution', 'solve.sh')):
    if os.path.isfile(os.path.join(folder, solution)):
      with open(os.path.join(folder, solution)) as f:
        metadata['solution_script'] = f.read()
      break
  image = ''
  if build_image and dockerfile:
    from c2jax.env import images  # pylint: disable=g-import-not-at-top  # the docker SDK

    built = images.build_task_image(context, name, base_images=base_images)
    image = built.tag
    metadata['image'] = {'from': built.bases, 'workdir': built.workdir}
  if image:  # the tests go to /tests, as Terminal-Bench and Harbor put them
    hidden = {os.path.join(IMAGE_TESTS_DIR, p): text for p, text in {**tests, **scripts}.items()}
    command = _SCRIPT_TEST_COMMAND.format(
        prepare=_TO_TESTS_DIR.format(hidden=IMAGE_TESTS_DIR), env='TEST_DIR=/tests ',
        script='/tests/' + os.path.basename(script))
  else:
    hidden = {**{os.path.join('tests', p): text for p, text in tests.items()}, **scripts}
    command = _SCRIPT_TEST_COMMAND.format(prepare='', env='', script=script)
  return Task(id=name, repo=env_dir, prompt=prompt, test_command=command,
              fail_to_pass=[name], hidden_files=hidden, metadata=metadata,
              dockerfile=dockerfile, image=image)


@functools.cache
def _empty_folder() -> str:
  """The repository of a task folder without an environment folder: one empty folder per
  process (the sandbox copies it, so no task writes into it), removed at exit."""
  folder = tempfile.mkdtemp(prefix='c2jax-empty-repo-')
  atexit.register(shutil.rmtree, folder, True)
  return folder


def is_task_folder(folder: str) -> bool:
  return (os.path.exists(os.path.join(folder, 'task.toml')) or
          os.path.exists(os.path.join(folder, 'task.yaml')))


def load_task_folders(path: str, build_images: bool = False,
                      base_images: dict[str, str] | None = None,
                      limit: int = 0) -> list[Task]:
  """One Harbor / Terminal-Bench task folder, or every task folder directly inside
  `path` (a benchmark checkout's tasks/ directory), sorted by name; the first `limit`
  (0: all). build_images and base_images: load_task_folder's."""
  if is_task_folder(path):
    folders = [path]
  elif not os.path.isdir(path):
    raise FileNotFoundError(f'{path!r} is not a directory of Harbor / Terminal-Bench tasks.')
  else:
    folders = sorted(os.path.join(path, d) for d in os.listdir(path)
                     if is_task_folder(os.path.join(path, d)))
  if not folders:
    raise FileNotFoundError(f'{path} holds no task folders (task.toml or task.yaml).')
  return [load_task_folder(f, build_images, base_images) for f in folders[:limit or None]]
