"""One encoder attention layer alone, eager against captured: does the host set the pace of the
GPU paths at batch 1? (issue 33; ``gpu_check.sh`` stage ``layerprobe``).

On the second H200 reading the whole-tensor path of LSG took 8.9 ms for the encoder at 16K where
the attention-free ``linear`` encoder took 5.34: ~0.6 ms a layer for an attention whose kernels
need little (the blocks' SDPA ~8 GFLOP, ~0.05 ms; the gathered keys and values ~0.5 GB of traffic,
~0.1 ms). One layer issues 60-70 kernel launches (``tests/test_whole_tensor_paths.py``); at 5-10 us
of host time each that alone is 0.3-0.7 ms, so at batch 1 the host may set the pace, not the
device. This probe times one base layer (d 768, 12 heads, bf16, batch 1, no grad) at ``--length``
tokens, per pattern and path (LSG: ``lsg_whole``, ``lsg_flex``; LED: ``led_whole``, ``led_flex``):

- ``model``: the layer's forward as the encoder calls it (its block tables kept from the first
  call, as the encoder shares them among its layers);
- ``cuda_graph``: the same forward captured once in a CUDA graph and replayed: the device's own
  time, no host work per launch (a host-device synchronisation inside the layer makes the capture
  fail, and the row says so);
- ``compiled``: ``torch.compile`` of the layer (element-wise ops fused, launches still one by one).

If ``cuda_graph`` is much faster than ``model``, the layer is launch-bound and the remedies are
fewer launches or captured graphs (``torch.compile(mode="reduce-overhead")``, CUDA graphs per
length bucket); if not, the kernels themselves are the cost (the enc stage's profile says which).

``--profile-dir DIR``: after every path's rows are timed (a profiler with CUDA activity stays
attached after its block and slows later launches), each path's ``model`` call runs
``--profile-calls`` more times under the profiler, in a layer built again: its host and device time
and its aten ops a call go into the path's record, the table of ops by host time into
``DIR/profile_layer_<path>.txt`` (where the host's time goes: the ops, the compiled call's guards,
the launches).

    python benchmarks/layer_probe.py --device cuda --length 16384 --out /tmp/layerprobe.json
    python benchmarks/layer_probe.py --device cpu --length 512 --paths lsg_whole led_whole \
        --variants model cuda_graph --out /tmp/l.json                       # CI: the harness only
"""

import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

from lsg_layers.modules.longformer_attention import LongformerSelfAttention
from lsg_layers.modules.lsg_attention import LSGSelfAttention
from probes import (  # benchmarks/probes.py, beside this script
    add_common_args,
    relative_difference,
    row_cells,
    start_result,
    time_variants,
    write,
)

PATHS = ["lsg_whole", "led_whole", "lsg_flex", "led_flex"]
VARIANTS = ["model", "cuda_graph", "compiled"]
SAME_MATH = {"cuda_graph", "compiled"}
TOLERANCE = 2e-2  # relative to the largest entry: bf16 outputs of the same math through other kernels


def build(pattern: str, L: int, d: int, heads: int, device, dtype, gen):
    """(layer, call_of): lsg_bart_base's encoder attention (1 global token prepended, norm
    sparsity, blocks of 128) or led_base's (window 1,024, the first token global); ``call_of(fn)``
    is the forward of ``fn`` (the layer or its compiled form) on the layer's seeded input."""
    torch.manual_seed(0)
    if pattern == "lsg":
        layer = LSGSelfAttention(d, heads, sparsity_type="norm")
        x = torch.randn(1 + L, 1, d, generator=gen)  # (T, n, C): the global token, then the tokens
        extra = {}
    else:
        layer = LongformerSelfAttention(d, heads, attention_window=1024)
        x = torch.randn(L, 1, d, generator=gen)
        first = (torch.zeros(1, 1, dtype=torch.long, device=device), torch.ones(1, 1, dtype=torch.bool, device=device))
        extra = {"global_index": first}  # as the LED encoder passes it: found once per forward
    layer = layer.to(device, dtype).eval()
    x = x.to(device, dtype)

    def call_of(fn):
        tables: dict = {}  # kept across calls, as the encoder's layers share one forward's

        def call():
            return fn(x, x, x, block_masks=tables, **extra)[0]

        return call

    return layer, call_of


def captured(call):
    """``call`` captured in a CUDA graph; replaying it returns the captured output tensor."""
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA graphs need a CUDA device")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):  # warm-up off the capture: allocator pools, lazy inits, compiles
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = call()

    def replay():
        graph.replay()
        return out

    return replay


def run_path(name, args, device, dtype, on_row=None):
    pattern, path = name.split("_")
    layer, call_of = build(pattern, args.length, args.dim, args.heads, device, dtype, torch.Generator().manual_seed(0))
    layer.path = path
    part = {"path": name, "rows": []}

    def prepare(variant):
        if variant == "model":
            return call_of(layer), {}
        if variant == "cuda_graph":
            return captured(call_of(layer)), {}
        if variant == "compiled":
            return call_of(torch.compile(layer)), {}
        raise ValueError(variant)

    def row_done(part):
        part["rows"][-1]["path_ran"] = layer.ran
        if on_row is not None:
            on_row(part)

    time_variants(
        args.variants, prepare, device, args.warmup, args.repeat, SAME_MATH, relative_difference, part, row_done
    )
    return part


def profile_path(name, args, device, dtype) -> dict:
    """The path's ``model`` call under the profiler, in a layer built again (``main`` times every
    path first: a profiler with CUDA activity stays attached after its block and slows every later
    launch); its op table into ``args.profile_dir``."""
    pattern, path = name.split("_")
    layer, call_of = build(pattern, args.length, args.dim, args.heads, device, dtype, torch.Generator().manual_seed(0))
    layer.path = path
    summary, table = host_profile(call_of(layer), torch.device(device), args.profile_calls)
    with open(os.path.join(args.profile_dir, f"profile_layer_{name}.txt"), "w") as f:
        f.write(table)
    return summary


def host_profile(call, device, calls: int):
    """(summary, table) of ``calls`` calls of ``call`` (after one more untimed) under the profiler:
    host and device milliseconds and aten ops a call (self times summed: nothing counted twice),
    and the ops' table by self host time."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.no_grad():
        call()
        with profile(activities=activities) as prof:
            for _ in range(calls):
                call()
            if device.type == "cuda":
                torch.cuda.synchronize()
    events = prof.key_averages()

    def device_us(e):  # the attribute's name before torch 2.4
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))

    summary = {
        "calls": calls,
        "host_ms": sum(e.self_cpu_time_total for e in events) / calls / 1e3,
        "device_ms": sum(device_us(e) for e in events) / calls / 1e3,
        "aten_ops": sum(e.count for e in events if e.key.startswith("aten::")) / calls,
    }
    return summary, events.table(sort_by="self_cpu_time_total", row_limit=25)


def markdown(result) -> str:
    out = [
        f"One base encoder attention layer ({result['heads']} heads, d {result['dim']}, {result['dtype']}, batch 1, "
        f"no grad) at {result['length']:,} tokens on `{result['device']}`; median of {result['repeat']} calls "
        f"after {result['warmup']}; diff: largest |difference| from `model` relative to its largest entry.\n",
        "| layer, path | variant | path taken | first call s | ms | x model | diff |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for part in result["paths"]:
        for r in part["rows"]:
            head = f"| {part['path']} | {r['variant']} | {r.get('path_ran') or ''} |"
            out.append(head + row_cells(r, TOLERANCE))
    profiled = [part for part in result["paths"] if "profile" in part]
    if profiled:
        calls = profiled[0]["profile"]["calls"]
        out += [
            f"\n`model` under the profiler ({calls} calls; self times summed, per call; the ops by host time: "
            "`profile_layer_<path>.txt`):\n",
            "| layer, path | host ms | device ms | aten calls (nested too) |",
            "|---|---:|---:|---:|",
        ]
        for part in profiled:
            pr = part["profile"]
            out.append(f"| {part['path']} | {pr['host_ms']:.3f} | {pr['device_ms']:.3f} | {pr['aten_ops']:.0f} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--length", type=int, default=16384, help="tokens (a multiple of 128)")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--paths", nargs="+", default=PATHS, choices=PATHS)
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    p.add_argument("--profile-dir", help="profile each path's model call; its op table goes here")
    p.add_argument("--profile-calls", type=int, default=3, help="calls profiled (after one untimed)")
    args = p.parse_args(argv)
    if args.length % 128:
        p.error(f"--length must be a multiple of 128, got {args.length}")
    dtype, result = start_result(p, args, ("device", "length", "dim", "heads", "dtype", "warmup", "repeat"))
    if args.variants[0] != "model":
        p.error("--variants: the first must be model (the others are compared with it)")
    result["paths"] = []
    for i, name in enumerate(args.paths):

        def on_row(part, i=i):
            result["paths"][i:] = [part]
            write(result, args.out, markdown)

        run_path(name, args, args.device, dtype, on_row)
    if args.profile_dir:  # after every path's rows were timed
        for part in result["paths"]:
            if part["rows"] and part["rows"][0]["status"] == "ok":
                part["profile"] = profile_path(part["path"], args, args.device, dtype)
                write(result, args.out, markdown)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
