"""LSG attention vs full attention in a base-size encoder: time and peak memory.

A 6-layer BART-base-shaped encoder stack (d 768, 12 heads, FFN 3072, post-LN, GELU), once with
LSG self-attention (block 128, sparse block 128, sparsity factor 4, norm, 1 global token by
default) and once with full attention. Both use the same module
(``lsg_fairseq.modules.lsg_attention.LSGSelfAttention``): the full-attention baseline is its
short-input path (one ``F.scaled_dot_product_attention`` over every token), obtained with a
block size >= L/2, so the two differ only in the attention pattern.

    python benchmarks/lsg_vs_full.py                       # 1K/4K/16K, fwd and fwd+bwd, GPU if any
    python benchmarks/lsg_vs_full.py --lengths 4096 --dtype bf16 --modes fwd

Prints a markdown table (time per call, peak memory, LSG/full ratios). Runs on CPU too (slowly;
use small lengths). Needs only torch: fairseq is not imported.
"""
import argparse
import importlib
import os
import sys
import time
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_attention():
    """Import the pure-torch LSG module without running the package's fairseq registrations."""
    if "lsg_fairseq" not in sys.modules:
        pkg = types.ModuleType("lsg_fairseq")
        pkg.__path__ = [os.path.join(REPO, "lsg_fairseq")]
        sys.modules["lsg_fairseq"] = pkg
    return importlib.import_module("lsg_fairseq.modules.lsg_attention").LSGSelfAttention


LSGSelfAttention = import_attention()


class EncoderLayer(nn.Module):
    """BART encoder layer (post-LN): x + attn -> LN -> x + FFN -> LN."""

    def __init__(self, d, heads, ffn, **attn_kwargs):
        super().__init__()
        self.self_attn = LSGSelfAttention(d, heads, **attn_kwargs)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x, mask=None):  # x: (T, B, C)
        x = self.self_attn_layer_norm(x + self.self_attn(x, x, x, key_padding_mask=mask)[0])
        return self.final_layer_norm(x + self.fc2(F.gelu(self.fc1(x))))


def make_encoder(args, length, full):
    attn = dict(num_global_tokens=args.num_global_tokens, sparsity_type=args.sparsity_type,
                block_size=args.block_size, sparse_block_size=args.sparse_block_size,
                sparsity_factor=args.sparsity_factor)
    if full:  # inputs of <= 2 blocks take the plain SDPA path
        attn.update(block_size=max(length, 2), sparsity_type="none", sparsity_factor=1)
    layers = [EncoderLayer(args.dim, args.heads, args.ffn, **attn) for _ in range(args.layers)]
    return nn.ModuleList(layers)


def run_encoder(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def measure(args, length, full, mode, device, dtype):
    torch.manual_seed(0)
    layers = make_encoder(args, length, full).to(device=device, dtype=dtype)
    T = args.num_global_tokens + length
    x = torch.randn(T, args.batch, args.dim, device=device, dtype=dtype, requires_grad=mode == "fwd+bwd")
    layers.train(mode == "fwd+bwd")

    def step():
        if mode == "fwd":
            with torch.no_grad():
                run_encoder(layers, x)
        else:
            run_encoder(layers, x).float().square().mean().backward()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.repeat):
        step()
    sync()
    ms = (time.perf_counter() - start) / args.repeat * 1e3
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else float("nan")
    del layers, x
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return ms, peak


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--sparse-block-size", type=int, default=128)
    p.add_argument("--sparsity-factor", type=int, default=4)
    p.add_argument("--sparsity-type", default="norm")
    p.add_argument("--num-global-tokens", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]

    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"# LSG vs full attention: {args.layers} layers, d {args.dim}, {args.heads} heads, "
          f"ffn {args.ffn}, batch {args.batch}, {args.dtype}, {name}, torch {torch.__version__}")
    print(f"# LSG: block {args.block_size}, sparse block {args.sparse_block_size}, factor "
          f"{args.sparsity_factor}, {args.sparsity_type}, {args.num_global_tokens} global\n")
    print("| length | mode | full ms | LSG ms | LSG/full time | full peak MiB | LSG peak MiB | LSG/full memory |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for length in args.lengths:
        for mode in args.modes:
            try:
                full_ms, full_mem = measure(args, length, True, mode, device, dtype)
            except torch.OutOfMemoryError:
                full_ms = full_mem = float("nan")
                torch.cuda.empty_cache()
            lsg_ms, lsg_mem = measure(args, length, False, mode, device, dtype)
            print(f"| {length} | {mode} | {full_ms:.1f} | {lsg_ms:.1f} | {lsg_ms / full_ms:.2f} | "
                  f"{full_mem:.0f} | {lsg_mem:.0f} | {lsg_mem / full_mem:.2f} |", flush=True)


if __name__ == "__main__":
    main()
