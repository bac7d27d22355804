"""README figures have a committed source: every percentage quoted in the sections that report an
experiment appears in a committed table that the paragraph (or an earlier one of its section) links
to (as the same number: 67% is not 67.3%), in one of its table rows or as a percentage in its prose
(not a command's setting, a load average or a wall time that happens to match), and the demo output
names the commit it came from."""

import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERCENT = re.compile(r"(?<![\d.,])(\d+(?:\.\d+)?)%")
RANGE = re.compile(r"(?<![\d.,])(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)%")  # "29.5-34.5%": both ends
INTERVAL = re.compile(r"\[(\d+(?:\.\d+)?)%?, (\d+(?:\.\d+)?)%?\]")
NUMBER = re.compile(r"(?<![\d.,])\d+(?:\.\d+)?")  # a table row's figures, with or without "%"
LINK = re.compile(r"\]\(([^)#\s]+\.md)\)")  # a linked table; a link to a README is a cross-reference
FENCE = re.compile(r"^```.*?^```", re.M | re.S)

# README -> the sections (by heading prefix; "" is the text before the first "## ") whose figures are checked
CHECKED = {
    "examples/long_range/README.md": ("", "## Protocol", "## Results", "## Order", "## What is shown"),
    "examples/long_context/README.md": ("## Results",),
    "benchmarks/gpu_readings.md": ("", "## "),
    "examples/long_context/demo/timing.md": ("",),
    "README.md": ("## Two commands", "## Examples and benchmarks", "## Mixed precision", "## On a GPU"),
}


def sections(text):
    """(heading, body) of each "## " section; the text before the first one has heading ""."""
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    yield "", parts[0]
    yield from zip(parts[1::2], parts[2::2])


def figures(block):
    """The percentages a block quotes, intervals' bounds included (as numbers: 100% and 100.0% are one)."""
    found = [float(x) for x in PERCENT.findall(block)]
    for lo, _ in RANGE.findall(block):
        found.append(float(lo))
    for lo, hi in INTERVAL.findall(block):
        found += [float(lo), float(hi)]
    return found


def table_figures(text):
    """The figures a committed table file quotes: every number of its table rows ("| ... |"), and
    the percentages of its prose."""
    found = []
    for line in text.splitlines():
        found += NUMBER.findall(line) if line.lstrip().startswith("|") else PERCENT.findall(line)
    return {float(x) for x in found}


def unsourced(readme):
    """(section, figure, block's start) for each checked figure that none of its block's sources quotes.
    A block's sources are the .md files it links to, else those of the last block of its section that
    linked one; a figure with no source at all is unsourced too."""
    folder = os.path.dirname(os.path.join(REPO, readme))
    with open(os.path.join(REPO, readme), encoding="utf-8") as f:
        text = f.read()
    missing = []
    for heading, body in sections(text):
        if not any(heading.startswith(h) if h else heading == "" for h in CHECKED[readme]):
            continue
        sources = []
        for block in re.split(r"\n\s*\n", FENCE.sub("", body)):
            links = [link for link in LINK.findall(block) if os.path.basename(link) != "README.md"]
            if links:
                sources = []
                for link in links:
                    with open(os.path.normpath(os.path.join(folder, link)), encoding="utf-8") as f:
                        sources.append(table_figures(f.read()))
            for x in figures(block):
                if not any(x in s for s in sources):
                    missing.append((heading, x, " ".join(block.split())[:80]))
    return missing


@pytest.mark.parametrize("readme", sorted(CHECKED))
def test_quoted_figures_are_in_the_linked_committed_tables(readme):
    assert unsourced(readme) == []


def test_unsourced_figures_are_caught(tmp_path, monkeypatch):
    """The check itself: a figure its linked table lacks is reported, one the table has is not."""
    (tmp_path / "t.md").write_text("Command: `run.sh` (N=40), load 1.5; chance 8.8%.\n\n| a | 12.5% [10.0%, 15.0%] |\n")
    (tmp_path / "README.md").write_text(
        "## Results\n\nSee [t](t.md): 12.5% [10.0, 15.0], chance 8.8%.\n\n"
        "Then 13.0%, 40% and 1.5%.\n\n## Other\n\n99.0%\n"
    )
    monkeypatch.setattr(__import__(__name__), "REPO", str(tmp_path))
    monkeypatch.setitem(CHECKED, "README.md", ("## Results",))
    # 40 and 1.5 are in the file, as a setting and a load average, not as figures
    assert [(h, x) for h, x, _ in unsourced("README.md")] == [
        ("## Results", 13.0),
        ("## Results", 40.0),
        ("## Results", 1.5),
    ]


def test_demo_output_names_the_commit_it_came_from():
    """The top-level README's demo output says which commit printed it, and it is the output whose
    tables are committed in examples/long_context/demo (the figures of the printed block are there)."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    stamp = re.search(r"printed at commit ([0-9a-f]{7,40})", text)
    assert stamp, "the demo output names no commit"
    assert subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{stamp.group(1)}^{{commit}}"]).returncode == 0
    with open(os.path.join(REPO, "examples", "long_context", "demo", "results.md"), encoding="utf-8") as f:
        table = f.read()
    assert f"code at commit {stamp.group(1)}" in table
    block = FENCE.findall(text[stamp.end() :])[0]
    numbers = table_figures(table)
    assert all(float(x) in numbers for x in PERCENT.findall(block)), block
