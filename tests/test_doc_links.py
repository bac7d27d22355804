"""The committed Markdown points at what the repository holds: every relative link (``[x](path)``)
and every relative path in backticks (```../x.md```) of a tracked ``.md`` file names a tracked file
or folder, as seen from that file. A path beside the checkout (``../shared/...``, which the READMEs
write from the repository's root) is not the repository's, and is left alone; so are URLs, anchors
and fenced code. And every test a document or a comment cites as ``test_x.py::name`` (with or
without ``tests/``; a name ending in ``_`` stands for the tests it begins) is defined in that file."""

import ast
import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")
RELATIVE = re.compile(r"`(\.\.?/[A-Za-z0-9_./-]+)`")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
URL = re.compile(r"^[a-z][a-z0-9+.-]*:")


def tracked(repo: str) -> set:
    """The repository's tracked files and the folders that hold them, relative to its root."""
    files = subprocess.run(["git", "-C", repo, "ls-files"], capture_output=True, text=True, check=True)
    paths = set()
    for name in files.stdout.splitlines():
        while name:
            paths.add(name)
            name = os.path.dirname(name)
    return paths


def dangling(repo: str) -> list:
    """(file, target) for each link or backticked relative path that names nothing tracked."""
    paths = tracked(repo)
    found = []
    for md in sorted(p for p in paths if p.endswith(".md")):
        with open(os.path.join(repo, md), encoding="utf-8") as f:
            text = FENCE.sub("", f.read())
        targets = [t for t in LINK.findall(text) if not URL.match(t) and not t.startswith("#")]
        targets += [t for t in RELATIVE.findall(text) if not t.startswith("../shared")]
        for target in targets:
            path = target.split("#")[0].rstrip("/")
            if path and os.path.normpath(os.path.join(os.path.dirname(md), path)) not in paths:
                found.append((md, target))
    return found


TEST_REF = re.compile(r"(?<![\w/.-])((?:tests/)?test_\w+\.py)::(\w+)")
# files that cite tests of other code: the records of past commits' runs, the upstream fairseq
# tests the stock scenarios mirror, and this file's examples
OTHER_TESTS = ("benchmarks/results/", "tests/stock_fairseq/", "tests/test_doc_links.py")


def unknown_tests(repo: str) -> list:
    """(file, reference) for each ``test_x.py::name`` of a tracked .md, .py or .sh file that names no test of tests/."""
    defined = {}
    found = []
    cites = (".md", ".py", ".sh")  # documents, and the docstrings and comments of code
    for md in sorted(p for p in tracked(repo) if p.endswith(cites) and not p.startswith(OTHER_TESTS)):
        with open(os.path.join(repo, md), encoding="utf-8") as f:
            refs = TEST_REF.findall(f.read())
        for file, name in refs:
            path = os.path.join(repo, "tests", os.path.basename(file))
            if path not in defined:
                try:
                    with open(path, encoding="utf-8") as f:
                        tree = ast.parse(f.read())
                except FileNotFoundError:
                    tree = ast.Module(body=[], type_ignores=[])
                defined[path] = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            names = defined[path]
            if not (name in names or (name.endswith("_") and any(n.startswith(name) for n in names))):
                found.append((md, f"{file}::{name}"))
    return found


def test_every_test_a_document_cites_exists():
    assert unknown_tests(REPO) == []


def test_a_moved_or_renamed_test_is_caught(tmp_path):
    """The check itself: a test cited in a file that does not define it (moved), a name that no test
    has, and a prefix no test begins with are reported; a test, a prefix and a class are not."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_one_thing():\n    pass\n\nclass TestGroup:\n    pass\n")
    (tmp_path / "tests" / "test_b.py").write_text("def test_two():\n    pass\n")
    (tmp_path / "README.md").write_text(
        "`tests/test_a.py::test_one_thing`, `test_a.py::test_one_`, `test_a.py::TestGroup`,\n"
        "`tests/test_b.py::test_one_thing`, `test_a.py::test_three`, `test_b.py::test_one_`, `test_c.py::test_x`\n"
    )
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    assert unknown_tests(str(tmp_path)) == [
        ("README.md", "tests/test_b.py::test_one_thing"),
        ("README.md", "test_a.py::test_three"),
        ("README.md", "test_b.py::test_one_"),
        ("README.md", "test_c.py::test_x"),
    ]


def test_every_relative_link_and_path_names_a_tracked_file():
    assert dangling(REPO) == []


def test_a_dangling_link_is_caught(tmp_path):
    """The check itself: a link to a file that is not tracked (absent, or there but not committed),
    and a backticked ../ path one level off, are reported; good ones, URLs and ../shared are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "table.md").write_text("| a |\n")
    (tmp_path / "docs" / "README.md").write_text(
        "[t](table.md), [folder](../docs/), [web](https://example.org), [here](#top), `../shared/data`,\n"
        "[gone](gone.md), [untracked](new.md#row), `../table.md`\n\n```\n[in a fence](nowhere.md)\n```\n"
    )
    (tmp_path / "docs" / "new.md").write_text("not committed\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "docs/README.md", "docs/table.md"], check=True)
    assert dangling(str(tmp_path)) == [
        ("docs/README.md", "gone.md"),
        ("docs/README.md", "new.md#row"),
        ("docs/README.md", "../table.md"),
    ]
