"""LSG and LED on the flex path against the whole-tensor path on a device, forward and backward
(``benchmarks/gpu_check.sh``, stage ``flex_grad``; issue 33's GPU gradient check).

Tiny models (every LSG sparsity type, and LED with a global token id), float32, a padded batch:
the encoder output, the logits and every parameter's gradient of the flex path against the
whole-tensor path, which the CPU suite ties to the dense references
(``tests/test_whole_tensor_paths.py``). On CPU flex has no backward: ``--device cpu`` (the CI
smoke) compares the forward only.

    python benchmarks/flex_gradcheck.py --device cuda --out /tmp/flex_grad.json
"""

import argparse
import json
import sys

import torch

TOLERANCE = 1e-4  # float32 through two attention kernels; relative to the largest entry (gradients: of the model)
VOCAB = 60
LSG = [
    "--block-size",
    "16",
    "--sparse-block-size",
    "16",
    "--sparsity-factor",
    "2",
    "--num-global-tokens",
    "2",
    "--encoder-embed-dim",
    "64",
    "--encoder-attention-heads",
    "4",
]  # head dim 16: flex's minimum
CASES = {
    f"lsg_{t}": ["lsg_bart_tiny"] + LSG + ["--sparsity-type", t]
    for t in ("none", "norm", "pooling", "stride", "block_stride", "lsh", "bos_pooling")
}
CASES["led"] = [
    "led_tiny",
    "--attention-window",
    "16",
    "--global-token-ids",
    "7",
    "--encoder-embed-dim",
    "64",
    "--encoder-attention-heads",
    "4",
]


def build(argv):
    """A tiny model of ``argv`` (arch + flags) with random weights, as run.py builds its rows."""
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    from bench_models import _Task, make_dictionary  # benchmarks/bench_models.py, beside this script

    arch, *flags = argv
    ns = options.parse_args_and_arch(
        options.get_training_parser(),
        ["/nonexistent", "--task", "translation", "--arch", arch, "--max-source-positions", "256",
         "--max-target-positions", "64", "--dropout", "0", "--attention-dropout", "0", *flags],
    )  # fmt: skip
    return ARCH_MODEL_REGISTRY[arch].build_model(ns, _Task(make_dictionary(VOCAB)))


def batch(device):
    """Two right-padded rows of 200 and 150 tokens (``<s> ... </s>``) and 7 decoder inputs."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (2, 200), generator=g)
    src[:, 0] = 0
    for i, n in enumerate((200, 150)):
        src[i, n - 1] = 2
        src[i, n:] = 1
    prev = torch.randint(4, VOCAB, (2, 7), generator=g)
    prev[:, 0] = 2
    return src.to(device), torch.tensor([200, 150], device=device), prev.to(device)


def run(model, path, device, grad):
    from lsg_layers.modules.paths import forced_path, paths_ran

    src, lengths, prev = batch(device)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # lsh draws its random projections: the same ones on both paths
    with forced_path(model, path), torch.set_grad_enabled(grad):
        enc = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        logits, _ = model(src, lengths, prev)
        ran = paths_ran(model)
        if grad:
            logits.float().pow(2).mean().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return enc.detach(), logits.detach(), grads, ran


def rel_max(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def gradient_difference(test: dict, ref: dict):
    """(largest |test - ref| entry over every parameter's gradient, relative to the largest entry of
    any ``ref`` gradient; the parameter where it lies). One scale for the whole model, not one per
    tensor: some gradients are zero in exact arithmetic (an attention's key bias adds the same
    amount to every score of a row, which softmax cancels), so two correct kernels leave rounding
    noise there (~1e-18 in float64, ~1e-9 in float32), and noise over noise is O(1)."""
    scale = max(float(g.abs().max()) for g in ref.values())
    worst, where = 0.0, None
    for name, g in ref.items():
        d = float((test[name] - g).abs().max()) / max(scale, 1e-30)
        if d >= worst:
            worst, where = d, name
    return worst, where


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import lsg_fairseq  # noqa: F401

    grad = args.device != "cpu"
    rows = []
    for name in args.cases:
        torch.manual_seed(0)
        model = build(CASES[name]).to(args.device).eval()
        whole = run(model, "whole", args.device, grad)
        flex = run(model, "flex", args.device, grad)
        worst_grad, worst_at = gradient_difference(flex[2], whole[2]) if grad else (0.0, None)
        row = {
            "case": name,
            "ran": flex[3],
            "encoder": rel_max(flex[0], whole[0]),
            "logits": rel_max(flex[1], whole[1]),
            "gradients": worst_grad if grad else None,
            "gradients_worst_at": worst_at,
            "tensors_with_gradients": len(flex[2]),
        }
        row["ok"] = flex[3] == "flex" and max(row["encoder"], row["logits"], worst_grad) <= TOLERANCE
        rows.append(row)
        print(
            f"{name:<16} ran {flex[3]}: encoder {row['encoder']:.1e}, logits {row['logits']:.1e}"
            + (f", gradients {worst_grad:.1e} at {worst_at} ({len(flex[2])} tensors)" if grad else ", forward only"),
            flush=True,
        )
    result = {
        "device": args.device,
        "torch": torch.__version__,
        "backward": grad,
        "tolerance": TOLERANCE,
        "gradient_scale": "model",  # gradient_difference's; absent from the first reading's file (per tensor)
        "rows": rows,
        "all_ok": all(r["ok"] for r in rows),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(
        f"flex against whole tensors, {'forward and backward' if grad else 'forward'}: "
        f"{'all within' if result['all_ok'] else 'NOT all within'} {TOLERANCE:g}"
    )
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
