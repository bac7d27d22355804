# shellcheck shell=bash
# Sourced by every script that runs fairseq-train / fairseq-generate (scripts/demo.sh, the
# examples' run scripts, examples/long_context/common.sh): the device and precision of each
# call, from the environment.
#
#   DEVICE=auto|cpu|cuda    (default auto: cuda when torch sees a GPU, else cpu; cuda without one is refused;
#                            cuda is one GPU, the first torch sees: CUDA_VISIBLE_DEVICES picks it)
#   PRECISION=fp32|bf16|fp16 (default fp32; fp16 needs cuda: fairseq's fp16 trainer is CUDA-only)
#
# Sets TRAIN_DEVICE_FLAGS and GENERATE_DEVICE_FLAGS (arrays) and DEVICE to what was chosen, and defines
# die (scripts/lib.sh) in the sourcing script. Whatever has no half-precision kernel (S4D's FFT
# convolution) runs in float32 inside a bf16/fp16 model.
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # die
DEVICE=${DEVICE:-auto}
PRECISION=${PRECISION:-fp32}
case $DEVICE in
    auto) DEVICE=$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')") ;;
    cpu) ;;
    cuda) seen=$(python -c "import torch; print('yes' if torch.cuda.is_available() else 'torch ' + torch.__version__)")
          [ "$seen" = yes ] || die "DEVICE=cuda: $seen sees no CUDA GPU here; use DEVICE=cpu (or auto)" ;;
    *) die "DEVICE=$DEVICE: expected auto, cpu or cuda" ;;
esac
case $PRECISION in
    fp32) precision_flags=() ;;
    bf16) precision_flags=(--bf16) ;;
    fp16) [ "$DEVICE" = cuda ] || die "PRECISION=fp16 needs DEVICE=cuda (on CPU use PRECISION=bf16)"
          precision_flags=(--fp16) ;;
    *) die "PRECISION=$PRECISION: expected fp32, bf16 or fp16" ;;
esac
if [ "$DEVICE" = cpu ]; then
    TRAIN_DEVICE_FLAGS=(--cpu "${precision_flags[@]}")
else
    # one GPU: fairseq-train's default world size is every GPU torch sees (one process each), and
    # what these pipelines print (ROUGE, time, memory) is one device's
    TRAIN_DEVICE_FLAGS=(--distributed-world-size 1 "${precision_flags[@]}")
fi
# shellcheck disable=SC2034  # read by the scripts that source this file
GENERATE_DEVICE_FLAGS=("${TRAIN_DEVICE_FLAGS[@]}")
