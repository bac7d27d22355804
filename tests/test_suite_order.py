"""The suite's order on ``make test``'s workers: the file marked ``long`` goes out first.

pytest-xdist's ``--dist loadfile`` hands out whole files, by default reordered by their number of
tests (most first), which put the one-test long-context file last: it then ran alone for ~6 minutes
while the other worker idled (a 965 s suite). ``--no-loadscope-reorder`` keeps the collection
order, which conftest.py sorts ``long`` first."""

import os

from conftest import REPO_ROOT, load_script

suite_work = load_script("benchmarks/suite_work.py", "suite_work")


def pytest_line(makefile: str) -> str:
    """The pytest line of the Makefile's ``test`` recipe, as ``benchmarks/suite_work.py`` reads it."""
    return " ".join(suite_work.pytest_command(makefile, 3, ["tests"])[1])


def keeps_the_long_file_first(command: str) -> bool:
    return "--dist loadfile" not in command or "--no-loadscope-reorder" in command


def test_make_test_keeps_the_collection_order():
    with open(os.path.join(REPO_ROOT, "Makefile")) as f:
        assert keeps_the_long_file_first(pytest_line(f.read()))


def test_the_check_can_fail():
    makefile = "test: setup\n\t$(PY) -m pytest tests -q -n 2 --dist loadfile\n"
    assert not keeps_the_long_file_first(pytest_line(makefile))


def test_a_worker_takes_its_share_of_the_cores():
    """conftest.worker_threads: two workers on two cores take one thread each, and this process runs
    with the share it was given."""
    import torch

    from conftest import worker_threads

    assert worker_threads({"PYTEST_XDIST_WORKER_COUNT": "2"}, 2) == 1
    assert worker_threads({"PYTEST_XDIST_WORKER_COUNT": "2"}, 16) == 8
    assert worker_threads({"PYTEST_XDIST_WORKER_COUNT": "4"}, 2) == 1
    assert worker_threads({}, 2) is None
    share = worker_threads(os.environ, len(os.sched_getaffinity(0)))
    if share is not None:  # a worker of pytest -n N: torch and the commands it starts
        assert torch.get_num_threads() == share and os.environ["OMP_NUM_THREADS"] == str(share)
