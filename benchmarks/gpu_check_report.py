"""The GPU check's report: ``<out>.md`` and ``<out>.json`` from what the stages of
``benchmarks/gpu_check.sh`` left in its work folder (pure Python, no torch: it is rerun after
every stage, and a stage that did not run is reported as such). It opens with the issues' [GPU]
targets, judged from the stages' records by ``gpu_targets.py``, then the predictions written before
the reading (``predictions.json``), judged by ``predictions.py``.

Work folder: ``env.json`` (card, torch, commit, load), ``stages.tsv`` (stage, status, seconds),
``conformance.json`` (+ ``.md``), ``flex_grad.json``, ``layerprobe.json``,
``flexprobe.json`` and ``convprobe.json`` (+ ``.md``),
``train_smoke/train_smoke.json``, and one ``benchmarks/run.py``
JSON per benchmark stage (``enc``, ``train16k``, ``train64k_ckpt``, ``train16k_b4``, ``fused16k``, ``paths``,
``extra4k``, ``peers16k``, ``gen16k``, ``locost600k``, ``compiled16k``, ``compiled4k``).

    python benchmarks/gpu_check_report.py --work benchmarks/results/gpu_check --out benchmarks/results/cuda
    python benchmarks/gpu_check_report.py --work R/gpu_check --out R/cuda --plot   # here, with the figures
"""

import argparse
import json
import os

import gpu_targets  # benchmarks/gpu_targets.py, beside this script
import predictions  # benchmarks/predictions.py

# whole16k: the readings before the paths stage replaced it (its section only where it has records)
LEGACY_STAGES = ("whole16k",)
BENCH_STAGES = (
    ("enc", "2. Encoder forward, no grad"),
    ("train16k", "4a. Forward + backward of the whole model"),
    ("train64k_ckpt", "4b. Forward + backward with --checkpoint-activations"),
    ("train16k_b4", "4c. Forward + backward at 16K, several sequences a call (run.py --batch, 4 on a GPU)"),
    ("fused16k", "5a. LOCOST with the fused (torch.compile'd) kernel generator, cached and not"),
    ("fused16k_tf32", "5a'. LOCOST training with the fused generator's product in TF32 (--ssm-kernel-product)"),
    ("paths", "5b. LSG and LED on both GPU paths: whole tensors (auto) and flex (`_flex` rows, forced)"),
    ("whole16k", "5b. LSG and LED on the whole-tensor path (gathered keys; flex was auto's on CUDA then)"),
    ("extra4k", "5c. 4K tokens"),
    ("peers16k", "5d. The HF peers at 16K"),
    ("gen16k", "5e. Generation (beam 4, 128 new tokens, encoder included)"),
    ("locost600k", "5f. LOCOST at the paper's longest inputs"),
    ("compiled16k", "5g. The encoder layers compiled (run.py --compile-layers), forward+backward at 16K"),
    ("compiled4k", "5g'. The encoder layers compiled, the encoder at 4K"),
)
# the probes' sections: (stage, the benchmark stage they follow, title); their tables are their own .md
PROBES = (
    (
        "layerprobe",
        "paths",
        "5b'. One attention layer alone: eager, a CUDA graph, compiled (benchmarks/layer_probe.py)",
    ),
    ("flexprobe", "paths", "5b''. The flex kernel alone, one change at a time (benchmarks/flex_probe.py)"),
    ("convprobe", "fused16k", "5a''. LOCOST's S4D layer alone, in variants (benchmarks/conv_probe.py)"),
)
ARCH_ORDER = (
    "linear",
    "bart",
    "hf_bart",
    "lsg_norm",
    "lsg_norm_flex",
    "led",
    "led_flex",
    "hf_led",
    "locost",
    "locost_cold",
    "locost_ckpt",
)


# the speed-vs-length figures: the stages measured alike (no activation checkpointing, the default
# kernel generator), so that each arch's points form one line
PLOT_STAGES = ("extra4k", "enc", "train16k", "locost600k")


def _read(path, default=None):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def stages(work):
    rows = []
    path = os.path.join(work, "stages.tsv")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    name, status, seconds = line.rstrip("\n").split("\t")
                    rows.append({"stage": name, "status": status, "seconds": int(seconds)})
    return rows


def _order(arch):
    return (ARCH_ORDER.index(arch), arch) if arch in ARCH_ORDER else (len(ARCH_ORDER), arch)


def bench_tables(records) -> str:
    """Per mode: archs x lengths, ``ms (x lin, x bart) / MiB above the weights``."""
    out = []
    for mode in ("enc", "train", "gen"):
        rs = [r for r in records if r["mode"] == mode]
        if not rs:
            continue
        lengths = sorted({r["length"] for r in rs})
        ok = {(r["arch"], r["length"]): r for r in rs if r["status"] == "ok"}
        out.append(f"`{mode}`: milliseconds (ratio to `linear`, to `bart`) / peak MiB above the weights\n")
        out.append("| arch | " + " | ".join(f"{n:,}" for n in lengths) + " |")
        out.append("|---|" + "---:|" * len(lengths))
        for arch in sorted({r["arch"] for r in rs}, key=_order):
            cells = []
            for n in lengths:
                r = ok.get((arch, n))
                if r is None:
                    status = next((x["status"] for x in rs if (x["arch"], x["length"]) == (arch, n)), "not run")
                    cells.append(status.split(":")[0])
                    continue
                ratios = [
                    f"{r['median_s'] / ok[(ref, n)]['median_s']:.2f}x {name}"
                    for ref, name in (("linear", "lin"), ("bart", "bart"))
                    if ref != arch and (ref, n) in ok
                ]
                cells.append(
                    f"{1e3 * r['median_s']:.3g}"
                    + (f" ({', '.join(ratios)})" if ratios else "")
                    + f" / {r['activations_mb']:,.0f}"
                )
            out.append(f"| {arch} | " + " | ".join(cells) + " |")
        paths = sorted({f"{r['arch']}: {r['layer_path']}" for r in rs if r.get("layer_path")})
        if paths:
            out.append("\nLayer paths taken: " + ", ".join(paths))
        shares = [r for r in ok.values() if "host_share" in r and r.get("device_name")]  # 1 on a CPU: not shown
        if shares:
            out.append(
                "\nHost share of the wall (the host's time to queue the call over the call's time; near 1: "
                "the host sets the pace, not the device): "
                + ", ".join(
                    f"{r['arch']} {r['length']:,} {r['host_share']:.2f}"
                    for r in sorted(shares, key=lambda r: (r["length"], _order(r["arch"])))
                )
            )
        controls = [r for r in ok.values() if "control" in r]
        if controls:
            out.append(
                "\nThe process's first row timed again after its other rows (`--control-row`; near 1: the "
                "host and the device kept their pace): "
                + ", ".join(
                    f"{r['arch']} {r['length']:,} {1e3 * r['median_s']:.3g} -> {1e3 * r['control']['median_s']:.3g} ms "
                    f"(**{r['control']['ratio']:.2f}x**)"
                    for r in controls
                )
            )
        compared = [r for r in ok.values() if "compiled_vs_eager" in r]
        if compared:
            out.append(
                "\nThe compiled encoder's output against the same model's eager one, on the device measured "
                "(max |difference| / max |eager|): "
                + ", ".join(
                    f"{r['arch']} {r['length']:,} {r['compiled_vs_eager']:.1e}"
                    for r in sorted(compared, key=lambda r: (r["length"], _order(r["arch"])))
                )
            )
        counted = [r for r in ok.values() if "graphs_compiled_while_timed" in r]  # --compile-layers rows
        late = [r for r in counted if r["graphs_compiled_while_timed"]]
        if counted and not late:
            out.append(f"\nGraphs compiled during the timed calls: none in {len(counted)} compiled rows")
        if late:
            out.append(
                "\n**Compiled during the timed calls** (its time includes a compile; the warm-up calls did "
                "not hold every graph): "
                + ", ".join(
                    f"{r['arch']} {r['mode']} {r['length']:,}: {r['graphs_compiled_while_timed']} graphs"
                    for r in sorted(late, key=lambda r: (r["length"], _order(r["arch"])))
                )
            )
        splits = [r for r in rs if "ssm_share" in r and r["status"] == "ok"]
        if splits:
            out.append(
                "\nLOCOST's S4D layers in one more (profiled) call: ms of kernel generation, convolution "
                "(FFTs, layout, gate), projections; share of the call; MiB its kernel caches hold (made "
                "in the warm-up calls: inside the peak above)\n"
            )
            out.append(
                "| arch | length | kernel | convolution | projections | kernel + convolution share | cache MiB |"
            )
            out.append("|---|---:|---:|---:|---:|---:|---:|")
            for r in splits:
                out.append(
                    f"| {r['arch']} | {r['length']:,} | {1e3 * r['ssm_kernel_s']:.3g} | "
                    f"{1e3 * r['ssm_conv_s']:.3g} | {1e3 * r['ssm_proj_s']:.3g} | {100 * r['ssm_share']:.1f}% | "
                    f"{r.get('ssm_cache_mb', 0):,.0f} |"
                )
        out.append("")
    return "\n".join(out)


def smoke_table(runs) -> str:
    out = [
        "| arch | precision | updates | loss first -> last | finite and falling | optimizer groups |",
        "|---|---|---:|---|---|---|",
    ]
    for r in runs:
        losses = f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}" if r["losses"] else "none"
        groups = "<br>".join(g.replace("grouped_adam: ", "") for g in r["groups"]) or "none logged"
        out.append(
            f"| {r['arch']} | {r['precision']} | {r['updates']} | {losses} | "
            f"{'yes' if r['fell'] else '**NO**'} | {groups} |"
        )
    return "\n".join(out) + "\n"


def build(work):
    env = _read(os.path.join(work, "env.json"), {})
    result = {
        "env": env,
        "stages": stages(work),
        "conformance": _read(os.path.join(work, "conformance.json")),
        "flex_grad": _read(os.path.join(work, "flex_grad.json")),
        "flexprobe": _read(os.path.join(work, "flexprobe.json")),
        "layerprobe": _read(os.path.join(work, "layerprobe.json")),
        "convprobe": _read(os.path.join(work, "convprobe.json")),
        "train_smoke": _read(os.path.join(work, "train_smoke", "train_smoke.json")),
        "benchmarks": {},
    }
    for tag, _ in BENCH_STAGES:
        part = _read(os.path.join(work, f"{tag}.json"))
        if part is not None:
            result["benchmarks"][tag] = {"records": part["records"], "runs": part["runs"]}
    said = predictions.load()
    result["predictions"] = {
        "made_after": said["made_after"],
        "rows": [dict(row, measured=m, verdict=v) for row, m, v in predictions.judge(work, said)],
    }
    result["targets"] = [dict(zip(("issue", "target", "measured", "verdict"), row)) for row in gpu_targets.checks(work)]
    return result


def markdown(result, work) -> str:
    env = result["env"]
    selected = env.get("stages_selected", "all")
    command = "benchmarks/gpu_check.sh"
    if selected != "all":
        command = f"STAGES='{' '.join(selected)}' {command}"
    head = [
        f"# GPU check: {env.get('card', '?')} ({env.get('device', '?')})\n",
        f"torch {env.get('torch')} (CUDA {env.get('cuda')}), Python {env.get('python')}, commit "
        f"`{env.get('commit')}`, started {env.get('started')}, load average at start "
        f"{env.get('load_average_start')}, host CPU {env.get('cpu')}. Command: `{command}` "
        "(each stage's log in `gpu_check/`). bf16, batch 1, base-size models unless a table says otherwise.\n",
        "| stage | status | seconds |",
        "|---|---|---:|",
    ]
    head += [f"| {s['stage']} | {s['status']} | {s['seconds']} |" for s in result["stages"]]
    out = ["\n".join(head), ""]
    out.append("## Against the issues' targets\n")
    out.append(
        "Judged by `benchmarks/gpu_targets.py` from the stages above: a ratio is one stage's (one "
        "process); where two stages hold both rows, each is shown and the first decides.\n"
    )
    out.append(gpu_targets.markdown([tuple(t.values()) for t in result["targets"]]))
    said = result["predictions"]
    out.append("## Predictions for this reading\n")
    if env.get("commit") == said["made_after"]:
        out.append(
            f"`benchmarks/predictions.json` was written from this reading (`{said['made_after']}`): not judged.\n"
        )
    else:
        judged = [(r, r["measured"], r["verdict"]) for r in said["rows"]]
        out.append(predictions.markdown(judged, said))
    conf = result["conformance"]
    out.append("## 1. Conformance on every fixture\n")
    if conf:
        out.append(
            f"float32 on `{conf['device']}` (layer path {conf['layer_path']}) against the reference "
            "implementations' outputs (max abs, tolerance 1e-4) and against this machine's CPU float32; "
            f"half precisions as the logits' relative error against the CPU. All float32 within 1e-4: "
            f"**{'yes' if conf['all_fp32_within_tolerance'] else 'NO'}**.\n"
        )
        with open(os.path.join(work, "conformance.md")) as f:
            out.append(f.read())
    else:
        out.append("not measured\n")
    flex = result["flex_grad"]
    out.append("## 1b. Flex against whole tensors (tiny models, float32, padded batch)\n")
    if flex:
        out.append(
            f"Largest difference relative to the whole-tensor path's largest entry, on `{flex['device']}`"
            + (
                ", gradients of every parameter"
                + (
                    " relative to the model's largest gradient entry"
                    if flex.get("gradient_scale") == "model"
                    else " each relative to its own largest entry (a metric since replaced: zero gradients, "
                    "such as the attentions' key biases, compare rounding noise with rounding noise)"
                )
                if flex["backward"]
                else " (forward only: no flex backward on CPU)"
            )
            + f"; tolerance {flex['tolerance']:g}.\n"
        )
        out.append("| case | path taken | encoder | logits | gradients | within |")
        out.append("|---|---|---:|---:|---:|---|")
        for r in flex["rows"]:
            g = "-" if r["gradients"] is None else f"{r['gradients']:.1e}"
            if r.get("gradients_worst_at"):
                g += f" ({r['gradients_worst_at']})"
            out.append(
                f"| {r['case']} | {r['ran']} | {r['encoder']:.1e} | {r['logits']:.1e} | {g} | "
                f"{'yes' if r['ok'] else '**NO**'} |"
            )
        out.append("")
    else:
        out.append("not measured\n")
    for tag, title in BENCH_STAGES[:1]:
        out.append(f"## {title}\n")
        part = result["benchmarks"].get(tag)
        out.append(bench_tables(part["records"]) if part else "not measured\n")
    out.append("## 3. fairseq-train smokes (tiny archs, --optimizer grouped_adam)\n")
    out.append(smoke_table(result["train_smoke"]) if result["train_smoke"] else "not measured\n")
    for tag, title in BENCH_STAGES[1:]:
        part = result["benchmarks"].get(tag)
        if part is None and tag in LEGACY_STAGES:
            continue
        out.append(f"## {title}\n")
        out.append(bench_tables(part["records"]) if part else "not measured\n")
        for probe, after, title in PROBES:
            if tag == after:
                out.append(f"## {title}\n")
                path = os.path.join(work, f"{probe}.md")
                if result[probe] and os.path.exists(path):
                    with open(path) as f:
                        out.append(f.read())
                else:
                    out.append("not measured\n")
    return "\n".join(out)


def plot_records(work):
    """(records, display rows) of :data:`PLOT_STAGES`, each arch labelled with the attention path its
    records ran (``lsg_norm (flex)``): a path change between readings is then seen, not hidden."""
    records, rows = [], {}
    for tag in PLOT_STAGES:
        part = _read(os.path.join(work, f"{tag}.json"))
        if part is None:
            continue
        row_of = {r["arch"]: r for r in part["rows"]}
        for r in part["records"]:
            label = f"{r['arch']} ({r['layer_path']})" if r.get("layer_path") else r["arch"]
            records.append(dict(r, arch=label))
            rows.setdefault(label, dict(row_of.get(r["arch"], {}), arch=label))
    return records, list(rows.values())


def plot(work, stem):
    """``<stem>_time.png`` and ``<stem>_memory.png`` of :func:`plot_records`, drawn as
    benchmarks/report.py draws the CPU results' (with matplotlib: where the results come back, not
    on the GPU machine)."""
    from report import plot as draw  # benchmarks/report.py, beside this script

    records, rows = plot_records(work)
    return draw(records, stem, rows) if records else []


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True, help="output stem: <out>.md and <out>.json")
    p.add_argument("--plot", action="store_true", help="also <out>_time.png and <out>_memory.png (needs matplotlib)")
    args = p.parse_args(argv)
    # a mistyped path: one line, not an empty report nor a traceback
    if not os.path.isfile(os.path.join(args.work, "stages.tsv")):
        p.error(f"--work {args.work}: not a gpu_check.sh work folder (no stages.tsv)")
    if not os.path.isdir(os.path.dirname(args.out) or "."):
        p.error(f"--out {args.out}: no folder {os.path.dirname(args.out)}")
    result = build(args.work)
    text = markdown(result, args.work)
    for suffix, content in ((".md", text), (".json", json.dumps(result, indent=1))):
        tmp = args.out + suffix + ".tmp"
        with open(tmp, "w") as f:
            f.write(content)
        os.replace(tmp, args.out + suffix)
    print(f"wrote {args.out}.md, {args.out}.json")
    if args.plot:
        print("wrote " + (", ".join(plot(args.work, args.out)) or "no figure: no records of " + " ".join(PLOT_STAGES)))


if __name__ == "__main__":
    main()
