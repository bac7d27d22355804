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


def _stamp_gaps(source: str) -> set:
    """The packages a module's ``CODE_PATHS`` leaves out, read from its AST: a stamp over those paths
    would not move when that package's code does. ``*PACKAGES`` (or ``*provenance.PACKAGES``) covers
    them all."""
    import ast

    from lsg_text.provenance import PACKAGES

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CODE_PATHS" for t in node.targets):
            covered = set()
            for elt in getattr(node.value, "elts", []):
                if isinstance(elt, ast.Starred) and "PACKAGES" in ast.unparse(elt.value):
                    covered.update(PACKAGES)
                elif isinstance(elt, ast.Constant):
                    covered.add(elt.value)
            return set(PACKAGES) - covered
    return {"<no CODE_PATHS>"}


def test_every_stamped_table_covers_every_package():
    """The scripts that stamp a committed table name all the installed code in what they stamp
    (lsg_layers was missing from all four once the layers left the plugin)."""
    import os

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    stamping = []
    for folder, _, files in os.walk(os.path.join(repo, "examples")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    source = f.read()
                if "git_stamp(" in source:
                    stamping.append(os.path.relpath(path, repo))
                    assert _stamp_gaps(source) == set(), path
    assert len(stamping) >= 4, stamping
    # the check can fail: the form the four had
    assert _stamp_gaps('CODE_PATHS = ("examples/x.py", "lsg_fairseq", "lsg_text")') == {"lsg_layers"}


def test_packages_are_the_installed_ones():
    import ast
    import os

    from lsg_text.provenance import PACKAGES

    setup_py = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.py")
    with open(setup_py, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    include = next(k.value for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords if k.arg == "include")
    top_level = {e.value for e in include.elts if "." not in e.value}
    assert set(PACKAGES) == top_level
