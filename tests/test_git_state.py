"""env.json's git state: dirty means the code that ran differs from the commit, not that a
committed run's output folders are being regenerated."""

import subprocess

from attnbench.run.executing.environment import git_state


def git(root, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


def test_dirty_follows_the_code_and_ignores_the_output_folders(tmp_path):
    (tmp_path / "attnbench").mkdir()
    (tmp_path / "attnbench" / "core.py").write_text("x = 1\n")
    for out in ("results", "reports"):
        (tmp_path / out / "run1").mkdir(parents=True)
        (tmp_path / out / "run1" / "results.csv").write_text("a,b\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "first")
    clean = git_state(tmp_path)
    assert clean["git_dirty"] is False and len(clean["git_sha"]) == 40

    # a committed run regenerated: its folders deleted and written again
    (tmp_path / "results" / "run1" / "results.csv").unlink()
    (tmp_path / "reports" / "run1" / "results.csv").write_text("changed\n")
    (tmp_path / "results" / "run2").mkdir()
    (tmp_path / "results" / "run2" / "env.json").write_text("{}")
    assert git_state(tmp_path)["git_dirty"] is False

    (tmp_path / "impls").mkdir()  # an untracked drop-in impl changes what runs
    (tmp_path / "impls" / "mine.py").write_text("")
    assert git_state(tmp_path)["git_dirty_files"] == ["impls/mine.py"]
    (tmp_path / "impls" / "mine.py").unlink()
    (tmp_path / "attnbench" / "core.py").write_text("x = 2\n")
    state = git_state(tmp_path)
    assert state["git_dirty"] is True and state["git_dirty_files"] == ["attnbench/core.py"]


def test_outside_a_checkout_the_state_is_unknown(tmp_path):
    assert git_state(tmp_path) == {"git_sha": None, "git_dirty": None, "git_dirty_files": None}
