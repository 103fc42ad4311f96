"""Terminal-Bench / Harbor task folders built by the real docker engine (c2jax.env.images)
and graded inside their images; skipped where no engine or sandbox image is up
(tools/setup.sh starts the engine and builds the image). The images built here are
removed at the end."""

import dataclasses
import os
import pathlib
import shutil
import uuid

import docker
import pytest

from c2jax import config as configlib
from c2jax.env import docker_backend, images, reward, sandbox, tasks
from c2jax.eval import oracle, runner
from configs import eval as eval_configs
from env_testlib import write_tree

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / 'fixtures' / 'harbor_build'


def _copy_fixture(root) -> str:
  """The committed Harbor folder, with a file of this session in its build context so
  that its first load here builds (the image is removed at the end)."""
  folder = shutil.copytree(FIXTURE, root / 'harbor_build')
  (folder / 'environment' / 'session.txt').write_text(uuid.uuid4().hex)
  return str(folder)


@pytest.fixture(scope='module')
def harbor(real_docker, tmp_path_factory):
  """(the folder, its task loaded with build_image after a first build of its image)."""
  folder = _copy_fixture(tmp_path_factory.mktemp('harbor'))
  first = images.build_task_image(os.path.join(folder, 'environment'), 'harbor_build')
  assert first.built and first.workdir == '/app'
  assert first.bases == {'python:3.11-slim': docker_backend.sandbox_image()}
  yield folder, tasks.load_task_folder(folder, build_image=True)
  real_docker.images.remove(first.tag, force=True)


def test_a_second_load_reuses_the_image(harbor):
  folder, task = harbor
  again = tasks.load_task_folder(folder, build_image=True)
  assert again.image == task.image and task.image.startswith('c2jax-task:harbor_build-')
  assert not images.build_task_image(os.path.join(folder, 'environment'), 'harbor_build').built
  assert task.dockerfile == os.path.join(folder, 'environment', 'Dockerfile')
  assert task.metadata['image'] == {'from': {'python:3.11-slim': docker_backend.sandbox_image()},
                                    'workdir': '/app'}


def test_the_workspace_is_the_image_workdir(harbor):
  _, task = harbor
  with sandbox.make_task_sandbox('docker', task) as box:
    # What the Dockerfile put in its WORKDIR, and nothing of the build context.
    assert box.list_files() == ['words.txt']
    assert box.read_file('/workspace/words.txt').startswith(b'the quick brown fox')
    result = box.run_shell('pwd -P && tally words.txt | head -n 1 && cat /var/lib/tally/VERSION')
    assert result.exit_code == 0 and result.text == '/app\nfox 4\n1.0\n', result.text
    box.write_file('notes/answer.txt', b'fox\n')
    assert box.run_shell('cat /app/notes/answer.txt').text == 'fox\n'
    graded = reward.grade(box, task)  # no /app/answer.txt yet
    assert box.list_files() == ['notes/answer.txt', 'words.txt']  # the tests went elsewhere
  assert graded.passed == {'harbor_build': False}
  assert 'c2jax: /logs/verifier/reward.txt says 0 (/tests/test.sh exited 0)' in graded.output
  # The tests' pytest lines are shown, behind '| ', and not read as the task's test ids.
  assert '| PASSED ../tests/check_outputs.py::test_runs_in_the_image_workdir' in graded.output


@pytest.mark.slow
def test_oracle_scores_100_percent_through_c2jax_eval(harbor, tmp_path):
  folder, _ = harbor
  cfg = eval_configs.get_config('terminal_bench')
  cfg.suite.args.path, cfg.suite.args.build_images = folder, True
  cfg.agent.backend = 'docker'
  cfg.eval.samples, cfg.eval.ks, cfg.eval.progress = 1, (1,), False
  summary = runner.run(cfg, str(tmp_path / 'run'))
  assert summary['overall']['infra_errors'] == 0, summary['overall']
  assert summary['per_task'] == {'harbor_build': {'samples': 1, 'correct': 1, 'accuracy': 1.0,
                                                  'pass@1': 1.0, 'best_of_1': 1.0}}
  cfg.agent.backend = 'bubblewrap'  # an image needs the docker backend: said up front
  with pytest.raises(configlib.ConfigError, match=r'build_images: .*agent.backend=docker'):
    runner.validate(cfg)


@pytest.mark.slow
def test_doing_nothing_fails(harbor, tmp_path):
  # test.sh exits 0 either way: only its reward file can fail the empty solution.
  _, task = harbor
  empty = dataclasses.replace(task, metadata=dict(task.metadata, solution_script=''))
  summary = runner.evaluate_tasks(oracle.OraclePolicy('docker'), [empty], tmp_path / 'run',
                                  progress=False)
  assert summary['overall']['infra_errors'] == 0
  assert summary['overall']['accuracy'] == 0.0


def test_a_built_image_needs_the_docker_backend(harbor):
  _, task = harbor
  with pytest.raises(ValueError, match="the 'bubblewrap' backend cannot start"):
    sandbox.make_task_sandbox('bubblewrap', task)


def test_an_unbuilt_dockerfile_is_said_once_and_its_reward_file_still_grades(tmp_path,
                                                                            caplog):
  # No image: today's workspace (a copy of environment/), said once per task; the reward
  # file the script writes is still the verdict (it exits 0 either way).
  task = tasks.load_task_folder(_copy_fixture(tmp_path))
  assert task.image == '' and task.dockerfile.endswith('environment/Dockerfile')
  with caplog.at_level('WARNING'):
    for _ in range(2):
      with sandbox.make_task_sandbox('bubblewrap', task) as box:
        assert 'Dockerfile' in box.list_files()
        graded = reward.grade(box, task)
  warned = [r.getMessage() for r in caplog.records if 'was not built' in r.getMessage()]
  assert len(warned) == 1 and 'build_images' in warned[0], warned
  assert graded.reward == 0.0, graded.output
  assert 'c2jax: /logs/verifier/reward.txt says 0 (tests/test.sh exited 0)' in graded.output
  # The workspace is environment/ and the tests are not in /tests: the limitation.
  assert '| ERROR: file or directory not found: /tests/check_outputs.py' in graded.output


@pytest.mark.slow
def test_a_terminal_bench_folder_with_a_mapped_base(real_docker, tmp_path):
  # Multi-stage, a FROM through a global ARG (the t-bench base of the table) and one
  # through base_images; tests in /tests with TEST_DIR, the exit status the verdict.
  folder = write_tree(tmp_path / 'tb-stages', {
      'task.yaml': 'instruction: Copy /opt/built.txt to /app/out.txt.\ndifficulty: easy\n',
      'Dockerfile': 'ARG BASE=ghcr.io/laude-institute/t-bench/python-3-13:20250620\n'
                    'FROM ${BASE} AS build\nRUN echo built > /built.txt\n'
                    'FROM my-org/runner:1\nCOPY --from=build /built.txt /opt/built.txt\n'
                    'WORKDIR /app\n',
      'run-tests.sh': 'python3 -m pytest -q -rA -p no:cacheprovider $TEST_DIR/test_outputs.py\n',
      'tests/test_outputs.py': 'def test_copied():\n'
                               '  assert open("/app/out.txt").read() == "built\\n"\n',
      'solution.sh': 'cp /opt/built.txt out.txt\n'})
  table = {'my-org/runner:*': docker_backend.sandbox_image()}
  # Ids only: listing Image objects inspects each, racing other tests' removals.
  dangling = lambda: set(real_docker.api.images(filters={'dangling': True}, quiet=True))
  before = dangling()
  task = tasks.load_task_folder(folder, build_image=True, base_images=table)
  try:
    sandbox_image = docker_backend.sandbox_image()
    assert task.metadata['image']['from'] == {
        'ghcr.io/laude-institute/t-bench/python-3-13:20250620': sandbox_image,
        'my-org/runner:1': sandbox_image}
    empty = dataclasses.replace(task, id='empty', metadata=dict(task.metadata,
                                                                solution_script=''))
    summary = runner.evaluate_tasks(oracle.OraclePolicy('docker', concurrency=2),
                                    [task, empty], tmp_path / 'run', progress=False)
    assert {t: m['accuracy'] for t, m in summary['per_task'].items()} == {
        'tb-stages': 1.0, 'empty': 0.0}
    # The first stage's image, which the engine's builder leaves untagged, is gone.
    assert not [image for image in dangling() - before if any(
        'echo built > /built.txt' in (layer.get('CreatedBy') or '')
        for layer in _history(real_docker, image))]
  finally:
    real_docker.images.remove(task.image, force=True)


def _history(client, image: str) -> list[dict]:
  try:
    return client.api.history(image)
  except docker.errors.NotFound:  # another test's image, removed meanwhile
    return []


def test_an_unknown_base_is_a_clear_error(real_docker, tmp_path):
  context = write_tree(tmp_path / 'environment', {'Dockerfile': 'FROM c2jax-no-such-base:1.0\n'})
  with pytest.raises(images.BaseImageError) as error:
    images.build_task_image(context, 'unknown-base')
  message = str(error.value)
  assert 'FROM c2jax-no-such-base:1.0 names an image the docker engine does not have' in message
  assert 'python:3[.x[.y]][-slim][-bookworm]' in message  # the table
  assert "base_images=\"('c2jax-no-such-base:1.0=LOCAL_IMAGE',)\"" in message
  with pytest.raises(images.BaseImageError, match=r'maps to c2jax-absent:0 .*does not have'):
    images.build_task_image(context, 'unknown-base',
                            base_images={'c2jax-no-such-base:*': 'c2jax-absent:0'})


def test_a_failed_step_is_named_with_the_end_of_the_log(real_docker, tmp_path):
  run = write_tree(tmp_path / 'run', {
      'Dockerfile': 'FROM python:3.11-slim\nRUN echo preparing the tool && exit 3\n'})
  with pytest.raises(images.ImageBuildError) as error:
    images.build_task_image(run, 'failing-run')
  message = str(error.value)
  assert 'Step 2/3 : RUN echo preparing the tool && exit 3 failed' in message
  assert 'returned a non-zero code: 3' in message
  assert 'preparing the tool' in message.split('--- end of the build log ---')[1]
  missing = write_tree(tmp_path / 'missing', {'Dockerfile': 'FROM debian:bookworm-slim\n'
                                                            'COPY absent.txt /app/\n'})
  with pytest.raises(images.ImageBuildError, match=r'Step 2/3 : COPY absent.txt /app/ failed'):
    images.build_task_image(missing, 'missing-file')


def test_base_references_and_table_entries():
  assert images.normalize_reference('docker.io/library/python:3.11-slim@sha256:00') == (
      'python:3.11-slim')
  assert images.normalize_reference('ubuntu') == 'ubuntu:latest'
  assert images.parse_base_images(['node:20*= my-node:20 ']) == {'node:20*': 'my-node:20'}
  with pytest.raises(ValueError, match="'node' is not FROM=IMAGE"):
    images.parse_base_images(['node'])


def test_the_engine_is_needed_only_to_build(tmp_path, monkeypatch):
  # A folder loaded without build_image needs no engine; with it, no engine is an error.
  folder = _copy_fixture(tmp_path)
  monkeypatch.setenv('DOCKER_HOST', 'tcp://127.0.0.1:1')
  assert tasks.load_task_folder(folder).image == ''
  with pytest.raises(images.ImageBuildError, match='needs a docker engine, and none answers'):
    tasks.load_task_folder(folder, build_image=True)


@pytest.mark.slow
def test_rl_task_source_builds_the_folders_images(real_docker, tmp_path):
  # `c2jax rl --config.tasks.source=harbor --config.tasks.build_images=true` on docker:
  # the episodes start from the folder's image, its FROM mapped by tasks.base_images.
  # The sandbox image (tools/setup_docker.sh) stands in for python / debian / ubuntu
  # bases: apt-get and useradd are there, and pip installs from the registry into the
  # system Python (behind the host's TLS proxy too: the image trusts the host's added
  # CAs). `apt-get update && apt-get install` works as well; not run here (the Debian
  # index is ~9 MB).
  from c2jax.rl import job
  from c2jax.rl.tasks import task_sources
  folder = write_tree(tmp_path / 'tb-rl', {
      'task.yaml': 'instruction: Say what /app/ready.txt holds.\n',
      'Dockerfile': (
          'FROM my-org/tools:2\n'
          'RUN apt-get --version && useradd -m agent && mkdir /app && \\\n'
          '    echo ready > /app/ready.txt && chown -R agent /app && \\\n'
          '    pip install --no-cache-dir --disable-pip-version-check six==1.16.0\n'
          'WORKDIR /app\nUSER agent\n'),
      'run-tests.sh': 'test -f /app/ready.txt\n'})
  cfg = job.job_defaults('tiny')
  cfg.tasks.source, cfg.tasks.path, cfg.tasks.build_images = 'harbor', str(folder), True
  cfg.tasks.base_images = (f'my-org/tools:*={docker_backend.sandbox_image()}',)
  task_sources.validate(cfg.tasks, 'docker')
  (task,) = task_sources.load(cfg.tasks)
  try:
    assert task.image.startswith(images.REPOSITORY + ':tb-rl-')
    assert task.metadata['image']['from'] == {'my-org/tools:2': docker_backend.sandbox_image()}
    with sandbox.make_task_sandbox('docker', task) as box:
      shown = box.run_shell('cat ready.txt; python3 -c "import six; print(six.__version__)"; '
                            'whoami').text.split()
    assert shown == ['ready', '1.16.0', 'agent']
  finally:
    real_docker.images.remove(task.image, force=True)


def test_rl_task_image_settings_are_checked():
  from c2jax.rl import job
  from c2jax.rl.tasks import task_sources
  cfg = job.job_defaults('tiny')
  cfg.tasks.source, cfg.tasks.path, cfg.tasks.build_images = 'harbor', '.', True
  with pytest.raises(configlib.ConfigError, match=r"tasks.build_images.*agent.backend is "
                     r"'bubblewrap'.*--config.agent.backend=docker"):
    task_sources.validate(cfg.tasks, 'bubblewrap')
  cfg.tasks.base_images = ('python:3.11',)
  with pytest.raises(configlib.ConfigError, match=r"tasks.base_images.*is not FROM=IMAGE"):
    task_sources.validate(cfg.tasks, 'docker')
  cfg.tasks.source = 'suite'
  with pytest.raises(configlib.ConfigError, match=r"tasks.build_images.*source 'harbor'"):
    task_sources.validate(cfg.tasks, 'docker')

