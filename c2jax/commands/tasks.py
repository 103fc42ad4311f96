"""`c2jax tasks install --repo DIR|SDIST` and `c2jax tasks build --repo DIR --out suite.jsonl`.

--repo is a checkout, an sdist, or a released package (c2jax/env/packages: npm:NAME
[@VERSION], deb:PACKAGE[=VERSION] for Debian's golang-*-dev and librust-*-dev source
packages with their Debian dependencies vendored, pypi:NAME[==VERSION]), fetched once
into --packages_dir as a git repository whose HEAD becomes the records' base_commit.
The repository's language is detected from the marker at its root (pyproject.toml /
setup.py / setup.cfg: python, go.mod: go, Cargo.toml: rust, package.json: node) or
forced with --language.

install (Python): makes the repository's own tests runnable in an environment layer (a
  venv), installing through an egress allowlist (--allow_hosts), verified by its tests
  (--pass_fraction), cached by repository hash; prints the report (every command tried,
  the last error on failure) and exits 1 on failure.
build, Python: installs (cached) and writes a SWE-bench-format suite of planted-bug
  (`mutate`) and revert-and-restore (`revert`) tasks whose tests run in that layer.
build, Go / Rust / node: fetches the dependencies once on the host (go mod vendor, cargo
  vendor, npm ci), then writes planted-bug (`mutate`: one operator or literal of one
  line) and `revert` tasks (c2jax/env/languages/build.py) whose tests run offline in
  bubblewrap with the host's toolchain, and a report of every candidate tried (OUT
  without .jsonl + .report.json).
Either suite: evaluate it with
  `c2jax eval --config=configs/eval.py:swebench --config.suite.args.path=OUT
  --config.suite.args.repos_root=OUT_WITHOUT_.jsonl.repos`, or train on it with
  `--config.tasks.source=suite --config.tasks.path=OUT`.
"""

import json
import sys

from absl import flags

from c2jax.env import install as install_lib
from c2jax.env import languages
from c2jax.env import packages
from c2jax.env import task_builder
from c2jax.env import testlogs

_REPO = flags.DEFINE_string(
    'repo', None, 'Repository folder, source distribution (.tar.gz), or a released '
    'package: npm:NAME[@VERSION], deb:PACKAGE[=VERSION] (Debian golang-*-dev / '
    'librust-*-dev), pypi:NAME[==VERSION], or an npm .tgz / Debian .deb file.')
_PACKAGES = flags.DEFINE_string('packages_dir', packages.DEFAULT_CACHE,
                                'Where fetched packages are kept (by exact version).')
_OUT = flags.DEFINE_string('out', None, '`build`: the suite JSONL to write.')
_LANGUAGE = flags.DEFINE_enum('language', 'auto', ['auto', *languages.LANGUAGES],
                              'The repository\'s language; auto: detected from its root.')
_KINDS = flags.DEFINE_list('kinds', list(task_builder.KINDS), '`build`: task kinds.')
_MAX_TASKS = flags.DEFINE_integer('max_tasks', 8, '`build`: most tasks to write.')
_MAX_CANDIDATES = flags.DEFINE_integer('max_candidates', 40,
                                       '`build`: most candidate edits to test.')
_SEED = flags.DEFINE_integer('seed', 0, '`build`: seed of the candidate order.')
_ALLOW = flags.DEFINE_list('allow_hosts', list(install_lib.InstallConfig.allow_hosts),
                           'Hosts install commands may reach (everything else is refused).')
_INDEX = flags.DEFINE_string('index_url', install_lib.InstallConfig.index_url, 'Package index.')
_PROPOSER = flags.DEFINE_enum('proposer', 'heuristic', install_lib.proposer_names(),
                              'Who proposes install commands.')
_MODEL_URL = flags.DEFINE_string('model_base_url', '', '`model` proposer: OpenAI-compatible '
                                 'endpoint (e.g. a `c2jax serve`).')
_MODEL_NAME = flags.DEFINE_string('model_name', '', '`model` proposer: model name.')
_ATTEMPTS = flags.DEFINE_integer('max_attempts', 4, 'Install plans to try.')
_FRACTION = flags.DEFINE_float('pass_fraction', 0.5, 'Share of collected tests that must pass.')
_TIMEOUT = flags.DEFINE_float('timeout_s', 600.0, 'Limit of each command and the test run (s).')
_MEMORY = flags.DEFINE_integer('memory_mb', 4096, 'Memory limit of each command (MB).')
_CACHE = flags.DEFINE_string('cache_dir', install_lib.runner.DEFAULT_CACHE,
                             'Where layers and results live (by repository hash).')
_FORCE = flags.DEFINE_bool('force', False, 'Install again even if a result is cached.')

USAGE = ('usage: c2jax tasks install --repo DIR|SDIST [flags]          (Python)\n'
         '       c2jax tasks build --repo DIR|SDIST --out suite.jsonl [flags]\n'
         '             [--language=auto|' + '|'.join(languages.LANGUAGES) + ']\n'
         '  Go, Rust and node repositories (go.mod, Cargo.toml, package.json) need no '
         'install step;\n'
         '  their build writes OUT.report.json beside the suite.')


def _config() -> install_lib.InstallConfig:
  return install_lib.InstallConfig(
      allow_hosts=tuple(_ALLOW.value), index_url=_INDEX.value, proposer=_PROPOSER.value,
      max_attempts=_ATTEMPTS.value, pass_fraction=_FRACTION.value, timeout_s=_TIMEOUT.value,
      memory_mb=_MEMORY.value, cache_dir=_CACHE.value, model_base_url=_MODEL_URL.value,
      model_name=_MODEL_NAME.value)


def main(argv: list[str]) -> int:
  if len(argv) != 2 or argv[1] not in ('install', 'build'):
    print(f'c2jax tasks: expected one sub-command, install or build.\n{USAGE}', file=sys.stderr)
    return 2
  if not _REPO.value:
    print(f'c2jax tasks {argv[1]}: --repo is required.\n{USAGE}', file=sys.stderr)
    return 2
  if argv[1] == 'build' and not _OUT.value:
    print(f'c2jax tasks build: --out is required.\n{USAGE}', file=sys.stderr)
    return 2
  package, repo = None, _REPO.value
  try:
    if packages.is_spec(repo):
      package = packages.fetch(repo, cache_dir=_PACKAGES.value, timeout_s=_TIMEOUT.value)
      repo = package.path
      print(json.dumps({'package': package.spec, 'path': package.path,
                        'base_commit': package.base_commit, 'steps': package.steps}))
    language = (languages.detect(repo) if _LANGUAGE.value == 'auto'
                else languages.get(_LANGUAGE.value))
    config = _config()
  except (ValueError, FileNotFoundError, packages.FetchError) as e:
    print(f'c2jax tasks: {e}', file=sys.stderr)
    return 2
  if language.prepare is not None:
    return _build_without_install(argv[1], language, repo, package)
  result = install_lib.install(repo, config, force=_FORCE.value)
  print(result.report() + (' [cached]' if result.cached else ''))
  if not result.ok:
    return 1
  if argv[1] == 'build':
    records = task_builder.build_suite(
        result, _OUT.value, kinds=tuple(_KINDS.value), max_tasks=_MAX_TASKS.value,
        max_candidates=_MAX_CANDIDATES.value, seed=_SEED.value, timeout_s=_TIMEOUT.value,
        memory_mb=_MEMORY.value, package=package)
    print(json.dumps({'suite': _OUT.value, 'tasks': len(records),
                      'by_kind': {k: sum(r['created_by'] == k for r in records)
                                  for k in task_builder.KINDS}}))
    if not records:
      print('No candidate edit made a task (no test caught any); raise --max_candidates.',
            file=sys.stderr)
      return 1
  return 0


def _build_without_install(command: str, language: languages.Language, repo: str,
                           package: packages.Package | None) -> int:
  """Go, Rust, node: the build fetches what the tests need itself."""
  if command == 'install':
    print(f'c2jax tasks install: {repo} is a {language.name} repository; '
          '`c2jax tasks build` prepares it (install is for Python).', file=sys.stderr)
    return 2
  report = languages.report_path(_OUT.value)
  try:
    records = languages.build_suite(
        repo, _OUT.value, language=language.name, kinds=tuple(_KINDS.value),
        max_tasks=_MAX_TASKS.value,
        max_candidates=_MAX_CANDIDATES.value, seed=_SEED.value, timeout_s=_TIMEOUT.value,
        memory_mb=_MEMORY.value, package=package)
  except (ValueError, RuntimeError) as e:  # the repository, its fetch or the flags
    print(f'c2jax tasks build: {e}', file=sys.stderr)
    return 2
  except testlogs.NoTestsSeen as e:
    print(f'c2jax tasks build: {e}', file=sys.stderr)
    return 1
  print(json.dumps({'suite': _OUT.value, 'language': language.name, 'tasks': len(records),
                    'by_kind': {k: sum(r['created_by'] == k for r in records)
                                for k in task_builder.KINDS}, 'report': report}))
  if not records:
    print(f'No candidate edit made a task; {report} says why each was dropped. Raise '
          '--max_candidates or try another --seed.', file=sys.stderr)
    return 1
  return 0
