#!/usr/bin/env bash
# The GPU machine's torch on this CPU, before a device call: the tests of what that call runs, under
# the torch it has (2.11 there, 2.13 here: ../shared/gpu/README.md). A difference between the two
# then costs minutes here instead of device minutes.
#
#   bash benchmarks/device_torch.sh                  # the device call's test files
#   TESTS=tests bash benchmarks/device_torch.sh      # the whole suite (~12 min on 2 cores)
#   VENV=DIR ...                                     # the project's venv (default .venv)
#
# A venv ($DEVICE_TORCH_VENV, default /tmp/lsg-device-torch-$DEVICE_TORCH) holds that torch alone;
# everything else (fairseq, the project, pytest) comes from .venv, behind it on sys.path, and its
# commands (fairseq-train, ...) are rewritten to start that venv's python. The first use downloads
# torch's CUDA wheel and the CUDA libraries it loads at import (~3 GB); later uses reuse the venv.
# Python stays this machine's (3.11; the GPU machine's is 3.12).
#
# Seen with torch 2.11 on this CPU and not with 2.13 (benchmarks/README, "Before a device call"):
# conv_probe's time_major_compiled failed (2.11's CPU rfft strides; a row since removed), and compiled flex on two threads sometimes ends in a segmentation fault
# (gpu_check's flex_grad stage run alone).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # die, step
start=$(date +%s)
VENV=${VENV:-.venv}
TORCH=${DEVICE_TORCH:-2.11.0}
venv=${DEVICE_TORCH_VENV:-/tmp/lsg-device-torch-$TORCH}
TESTS=${TESTS:-tests/test_gpu_check.py tests/test_flex_probe.py tests/test_conv_probe.py tests/test_layer_probe.py
tests/test_flex_attention.py tests/test_whole_tensor_paths.py tests/test_mixed_precision.py tests/test_precision.py
tests/test_s4d.py tests/test_benchmarks.py tests/test_activation.py tests/test_lean_layer.py tests/test_locost.py
tests/test_generation.py}
[ $# -eq 0 ] || die "no arguments (TESTS names the tests), got '$*'"
[ -x "$VENV/bin/python" ] || die "no $VENV/bin/python: run 'VENV=$VENV bash scripts/setup_env.sh' first"

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    step "torch==$TORCH into $venv"
    "$VENV/bin/python" -m venv --clear "$venv"
    "$venv/bin/pip" install -q "torch==$TORCH" 2>&1 | grep -v "^WARNING: Location" || true
fi
main_site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
own_site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# after the venv's own site-packages: its torch wins, the rest is .venv's (with its editable install)
echo "import site; site.addsitedir('$main_site')" > "$own_site/zz_lsg_main_venv.pth"
for f in "$VENV"/bin/*; do
    name=$(basename "$f")
    [ -e "$venv/bin/$name" ] && continue
    if head -c 200 "$f" | head -1 | grep -q '^#!.*python'; then
        { echo "#!$venv/bin/python"; tail -n +2 "$f"; } > "$venv/bin/$name" && chmod +x "$venv/bin/$name"
    else
        ln -s "$(readlink -f "$f")" "$venv/bin/$name"  # ruff and the like
    fi
done
got=$(PATH="$venv/bin:$PATH" python -c "import torch, lsg_fairseq; print(torch.__version__)" 2>/dev/null | tail -1)
[[ $got == "$TORCH"* ]] || die "the venv $venv gives torch '$got', not $TORCH: remove it and run again"

step "the tests under torch $got: $(wc -w <<< "$TESTS") paths"
# shellcheck disable=SC2086  # TESTS is a list of paths
PATH="$venv/bin:$PATH" python -m pytest $TESTS -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder
