"""lsg_text.provenance: the commit a committed table is stamped with."""

import subprocess

from lsg_text.provenance import git_stamp


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_stamp_is_the_last_commit_touching_the_code(tmp_path):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@t")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "m.py").write_text("x = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "code")
    code_commit = _git(tmp_path, "log", "-1", "--format=%h")
    (tmp_path / "README.md").write_text("words\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "readme")
    # a later commit that does not touch the code leaves the stamp alone
    assert git_stamp(str(tmp_path), ["code"]) == code_commit
    assert git_stamp(str(tmp_path), ["code", "README.md"]) != code_commit
    (tmp_path / "code" / "m.py").write_text("x = 2\n")
    assert git_stamp(str(tmp_path), ["code"]) == code_commit + " + uncommitted changes"


def test_stamp_outside_git_says_unknown(tmp_path):
    assert git_stamp(str(tmp_path), ["code"]) == "unknown"
