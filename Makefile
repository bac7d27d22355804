# Two entry points (see README): `make demo` (the main job end to end) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test clean

setup:
	bash scripts/setup_env.sh

demo: setup
	VENV=$(VENV) bash scripts/demo.sh

# --no-loadscope-reorder: pytest-xdist otherwise orders the files by their number of tests, so the
# one-test file marked `long` (tests/conftest.py puts it first) was handed out last and ran alone
# PYTHONDONTWRITEBYTECODE emptied: the suite starts a few hundred Python processes, each of which
# would otherwise compile the project's own modules again (site-packages have their bytecode).
# -n 3 on two cores: a worker waits on its commands' starts and writes (two workers kept the cores
# 93% busy, three 97%), and each worker takes one thread (tests/conftest.py).
# Where its time goes (CI allows 15 minutes): benchmarks/results/suite_durations_501a9a8.md
test: setup
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest tests -q -p no:cacheprovider -n 3 --dist loadfile --no-loadscope-reorder

clean:
	rm -rf demo_out
