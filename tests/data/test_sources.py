"""Source specs -> repositories."""

import pytest

from c2jax.data import sources

from data_testlib import git_checkout


def test_language_by_extension_and_name():
  assert sources.language_of("a/b.py") == "python"
  assert sources.language_of("x/Makefile") == "make"
  assert sources.language_of("img.png") is None


def test_folder_of_repositories(tree):
  repos = {r.name: r for r in sources.discover([f"{tree}/*"])}
  assert sorted(repos) == ["alpha", "beta", "delta", "gamma"]
  assert repos["gamma"].files == ("a.py", "b/c.py", "b/d.go")


def test_git_checkout_lists_tracked_files_only(tmp_path):
  repo = sources.directory_repository(git_checkout(tmp_path / "proj"))
  assert repo.name == "proj" and repo.files == ("tracked.py",)


def test_clashing_repository_names_are_an_error(tmp_path):
  (tmp_path / "a" / "same").mkdir(parents=True)
  (tmp_path / "b" / "same").mkdir(parents=True)
  with pytest.raises(ValueError, match="both named repository 'same'"):
    sources.discover([str(tmp_path / "a" / "same"), str(tmp_path / "b" / "same")])


def test_missing_directory_is_an_error(tmp_path):
  with pytest.raises(ValueError, match="is not a directory"):
    sources.discover([str(tmp_path / "nope")])


def test_installed_python_sources():
  stdlib = {r.name: r for r in sources.discover(["stdlib"])}
  assert "json/__init__.py" in stdlib["stdlib/json"].files
  assert "os.py" in stdlib["stdlib/_modules"].files
  assert not any("site-packages" in name for name in stdlib)
  site = {r.name.lower(): r for r in sources.discover(["site-packages"])}
  assert "numpy/__init__.py" in site["site-packages/numpy"].files
