# Two entry points (see README): `make demo` (the main job end to end) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test clean

setup:
	bash scripts/setup_env.sh

demo: setup
	VENV=$(VENV) bash scripts/demo.sh

test: setup
	$(PY) -m pytest tests -q -p no:cacheprovider -n 2 --dist loadfile

clean:
	rm -rf demo_out
