#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install lsg-fairseq into it, offline-safe.
#
#   bash scripts/setup_env.sh            # -> .venv/ (override with VENV=path; PYTHON=the interpreter
#                                        # that creates it, default python3)
#
# Order matters:
#  1. torch==2.13.0 first and pinned: an unpinned torch pulls several GB of CUDA packages.
#  2. fairseq-fixed is an sdist with C extensions; pip's isolated build environment would fetch
#     the newest (CUDA) torch just to compile it, so it is built --no-build-isolation against the
#     pinned torch (cython/numpy/setuptools preinstalled). pip caches the built wheel, so only the
#     first run on a machine pays the ~3 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # die

if [ ! -x "$VENV/bin/python" ]; then
    command -v "$PY" > /dev/null || die "PYTHON=$PY: no such command (the python that creates $VENV)"
    echo "[setup] creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip wheel setuptools
"${pip[@]}" install -q torch==2.13.0
"${pip[@]}" install -q cython "numpy<2.5"
echo "[setup] installing lsg-fairseq (first run builds fairseq-fixed: ~3 min)" >&2
"${pip[@]}" install -q --no-build-isolation -e ".[test,plots]"
"$VENV/bin/python" -c "import torch, fairseq, lsg_fairseq; print('[setup] ok: torch', torch.__version__, '| fairseq', fairseq.__version__)" 2>&1 | grep -v '^INFO'
