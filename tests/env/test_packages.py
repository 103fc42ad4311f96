"""c2jax.env.packages: released packages as git repositories (an npm tarball, Debian's Go
and Rust source packages), tasks built from them with `c2jax tasks build --repo`, and a
suite's checkouts made again from its JSONL alone, graded as the RL loop grades.

Offline: the packages are committed as `npm pack` and `apt-get download` leave them
(tests/fixtures/packages/), which fetch takes as well as a registry spec."""

import filecmp
import json
import os
import shutil
import subprocess
import sys

import pytest

from c2jax.env import packages, tasks
from c2jax.env.packages import debian_go, debian_rust, instances
from c2jax.rl.tasks import task_sources
from env_testlib import grade

FIXTURES = os.path.join(os.path.dirname(__file__), '..', 'fixtures', 'packages')
GO_DEB = os.path.join(FIXTURES, 'golang-github-google-shlex-dev_0.0~git20191202.e7afc7f-1_all.deb')
RUST_DEB = os.path.join(FIXTURES, 'librust-strsim-dev_0.10.0-1_amd64.deb')
NPM_TGZ = os.path.join(FIXTURES, 'left-pad-1.3.0.tgz')
OLD_GO_DEB = os.path.join(FIXTURES, 'golang-github-dustin-go-humanize-dev_1.0.0-3_all.deb')


def _git(repo, *args):
  return subprocess.run(['git', '-C', repo, *args], capture_output=True, text=True,
                        check=True).stdout


def test_an_npm_tarball_is_a_repository_with_a_fixed_commit(tmp_path):
  package = packages.fetch(NPM_TGZ, cache_dir=str(tmp_path / 'a'))
  assert (package.spec, package.name) == ('npm:left-pad@1.3.0', 'left-pad@1.3.0')
  assert {'package.json', 'index.js', 'test.js'} <= set(os.listdir(package.path))
  assert _git(package.path, 'rev-parse', 'HEAD').strip() == package.base_commit
  assert _git(package.path, 'status', '--porcelain') == ''
  # The same package gives the same commit anywhere (fixed author and date) ...
  again = packages.fetch(NPM_TGZ, cache_dir=str(tmp_path / 'b'))
  assert again.base_commit == package.base_commit
  # ... and a second fetch of the exact spec reads the cache, without the registry.
  os.utime(package.path, (1, 1))
  cached = packages.fetch('npm:left-pad@1.3.0', cache_dir=str(tmp_path / 'a'))
  assert cached == package and os.stat(package.path).st_mtime == 1


def test_a_debian_go_package_from_before_modules_gets_a_go_mod(tmp_path):
  # A path relative to the working directory, as on a command line.
  package = packages.fetch(os.path.relpath(OLD_GO_DEB), cache_dir=str(tmp_path))
  assert package.spec == 'deb:golang-github-dustin-go-humanize-dev=1.0.0-3'
  with open(os.path.join(package.path, 'go.mod')) as f:
    assert f.read() == 'module github.com/dustin/go-humanize\n\ngo 1.16\n'
  assert 'bytes_test.go' in os.listdir(package.path)
  assert any('predates Go modules' in step for step in package.steps)
  # One with its own go.mod keeps it.
  modular = packages.fetch(GO_DEB, cache_dir=str(tmp_path))
  assert not any('predates' in step for step in modular.steps)
  assert _git(modular.path, 'show', 'HEAD:go.mod').startswith('module github.com/google/shlex')


def test_specs_that_name_nothing_fetchable(tmp_path):
  assert packages.is_spec('npm:left-pad') and packages.is_spec(NPM_TGZ)
  assert not packages.is_spec(str(tmp_path)) and not packages.is_spec('C:/checkout')
  for spec, message in (('gem:rails', 'not a package spec'),
                        ('npm:../etc', 'not an npm package name'),
                        ('deb:Not_A_Package', 'not a Debian package name'),
                        ('pypi:a b', 'NAME or NAME==VERSION')):
    with pytest.raises(ValueError, match=message):
      packages.fetch(spec, cache_dir=str(tmp_path))
  (tmp_path / 'not-a-package').mkdir()
  (tmp_path / 'not-a-package' / 'README').write_text('no package/package.json here\n')
  bad = tmp_path / 'bad.tgz'  # (outside the folder it archives: tar would read itself)
  subprocess.run(['tar', 'czf', str(bad), '-C', str(tmp_path / 'not-a-package'), '.'],
                 check=True, capture_output=True)
  with pytest.raises(packages.FetchError, match='not an `npm pack` tarball'):
    packages.fetch(str(bad), cache_dir=str(tmp_path / 'cache'))


def test_go_requirements_are_read_from_both_forms():
  go_mod = ('module example.com/x\n\ngo 1.17\n\nrequire (\n\tgithub.com/a/b v1.2.0\n'
            '\tgolang.org/x/text v0.3.7 // indirect\n)\n\nrequire gopkg.in/yaml.v3 v3.0.1\n'
            'replace github.com/a/b => ../b\n')
  assert debian_go.requirements(go_mod) == [
      ('github.com/a/b', 'v1.2.0'), ('golang.org/x/text', 'v0.3.7'),
      ('gopkg.in/yaml.v3', 'v3.0.1')]


# Cargo.toml as crates.io normalises it (ryu 1.0.2's shape): dev- and optional
# dependencies Debian may lack, and features that name them.
_MANIFEST = '''[package]
name = "ryu"
version = "1.0.2"

[[test]]
name = "d2s_test"
path = "tests/d2s_test.rs"

[dependencies.no-panic]
version = "0.1"
optional = true

[dependencies.itoa]
version = "1"

[dev-dependencies.num_cpus]
version = "1.8"

[dev-dependencies.rand]
version = "0.7"

[features]
small = []
checked = [
    "no-panic",
    "rand/std",
]
"with.dot" = ["dep:rand"]
'''


def test_cargo_dependencies_debian_lacks_are_dropped_with_what_uses_them(tmp_path):
  import tomllib
  new = debian_rust.drop_dependency(_MANIFEST, tomllib.loads(_MANIFEST), 'rand')
  parsed = tomllib.loads(new)
  assert 'rand' not in parsed['dev-dependencies'] and 'num_cpus' in parsed['dev-dependencies']
  assert parsed['features'] == {'small': [], 'checked': ['no-panic'], 'with.dot': []}
  dropped = debian_rust.drop_dependency(new, parsed, 'no-panic')
  assert 'no-panic' not in tomllib.loads(dropped)['dependencies']
  # A plain dependency cannot go: the crate would not build.
  assert debian_rust.drop_dependency(_MANIFEST, tomllib.loads(_MANIFEST), 'itoa') is None
  for rel, text in (('tests/d2s_test.rs', 'use rand::Rng;\n'),
                    ('tests/plain.rs', '// a random test\nfn main() {}\n'),
                    ('examples/bench.rs', 'extern crate rand;\n'),
                    ('Cargo.toml', new)):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text(text)
  assert debian_rust.prune_targets(str(tmp_path), ['rand']) == [
      'tests/d2s_test.rs', 'examples/bench.rs']
  pruned = tomllib.loads((tmp_path / 'Cargo.toml').read_text())
  assert 'test' not in pruned and pruned['package']['name'] == 'ryu'
  assert (tmp_path / 'tests' / 'plain.rs').exists()


def _same_tree(a: str, b: str) -> bool:
  compared = filecmp.dircmp(a, b, ignore=['.git', '.c2jax-cache'])
  if compared.left_only or compared.right_only or compared.diff_files:
    return False
  return all(_same_tree(os.path.join(a, d), os.path.join(b, d)) for d in compared.common_dirs)


@pytest.mark.slow
@pytest.mark.parametrize('deb, language, tools', [(GO_DEB, 'go', ('go',)),
                                                  (RUST_DEB, 'rust', ('cargo',))],
                         ids=['go', 'rust'])  # not the .deb's path: the same id in any checkout
def test_a_suite_built_from_a_package_is_made_again_from_its_jsonl(tmp_path, deb, language,
                                                                   tools):
  missing = [t for t in tools + ('bwrap', 'git') if shutil.which(t) is None]
  if missing:
    pytest.skip(f'{missing} not installed: needed to build {language} tasks')
  cache, out = str(tmp_path / 'cache'), str(tmp_path / 'build' / 'suite.jsonl')
  proc = subprocess.run(
      [sys.executable, '-m', 'c2jax.cli', 'tasks', 'build', f'--repo={deb}', f'--out={out}',
       '--max_tasks=1', '--max_candidates=4', '--timeout_s=120', f'--packages_dir={cache}'],
      capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  fetched = json.loads(proc.stdout.splitlines()[0])
  with open(out) as f:
    (record,) = [json.loads(line) for line in f]
  assert record['repo'] == fetched['package'] and record['language'] == language
  assert record['base_commit'] == fetched['base_commit']
  report = json.loads(open(out[:-len('.jsonl')] + '.report.json').read())
  assert report['package']['spec'] == fetched['package']
  # The JSONL alone, elsewhere: its checkout is made from the (cached) package and is the
  # builder's task repository file for file; graded, it fails as given and passes with
  # its gold patch.
  committed = str(tmp_path / 'committed.jsonl')
  shutil.copy(out, committed)
  jsonl, root = instances.materialise(committed, cache_dir=cache, log=None)
  (task,) = tasks.load_swebench_jsonl(jsonl, root)
  assert _same_tree(os.path.join(out[:-len('.jsonl')] + '.repos', record['instance_id']),
                    task.repo)
  assert grade(task, '').reward == 0.0
  assert grade(task, record['patch']).reward == 1.0
  assert instances.materialise(committed, cache_dir=cache, log=None) == (jsonl, root)
  # `c2jax rl --config.tasks.source=suite` loads the JSONL alone the same way.
  cfg = type('Cfg', (), dict(source='suite', path=committed, repos_root='',
                             packages_dir=cache))
  (rl_task,) = task_sources.load(cfg)
  assert rl_task.repo == task.repo and rl_task.fail_to_pass == task.fail_to_pass
  # A registry that changed what the version holds is caught, not graded.
  record['base_commit'] = '0' * 40
  with open(committed, 'w') as f:
    f.write(json.dumps(record) + '\n')
  with pytest.raises(packages.FetchError, match='rebuild the suite'):
    instances.materialise(committed, cache_dir=cache, log=None)
