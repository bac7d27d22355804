"""Conformance on a device: every reference fixture, converted, run on ``--device`` in float32,
bfloat16 and float16, against the reference implementations' outputs and against this CPU's
float32 result (``benchmarks/gpu_check.sh``, stage 1).

For each fixture case (LSG-BART: ``bart_plain``, ``lsg_none``, ``lsg_norm``, ``lsg_pooling``;
``led_w32`` with its first-token global mode; the LOCOST fixture) and each input set (long, mid,
short), one row: the largest absolute difference of the encoder output (valid positions) and of
the logits, float32 on the device against the reference's outputs (the fixture's own tolerance is
1e-4) and against the CPU float32 result (the CPU fast paths, forced); bfloat16 and float16 as the relative error
``|x - cpu| / |cpu|`` of the logits (their drift, no pass mark). On a GPU the layers take their
whole-tensor paths; with ``--device cpu`` (the CI smoke) ``--layer-path whole`` forces them, so
the comparison with the CPU result is not empty there either.

Besides, per dtype, two forms the models take on a GPU against the operations they replace, on
the device, values and gradients (lines under the table; the exit status says no if one fails):
the layers' one-pass gelu (``lsg_fairseq.models.activation``) against fairseq's ``gelu``, bit for
bit; LOCOST's fused RMSNorm (``T5LayerNorm``, ``F.rms_norm``) against HF's operations, within one
rounding of the dtype (``RMS_ULP``) relative to the largest entry (gradients: four); and the
decoders' attention in one SDPA call (a decoding step of the plugin decoder's cross-attention over a
16K-token source, beam 4; LOCOST's T5 attention in eval mode) against the operations it replaces:
float32 within ``SDPA_FP32`` relative error, half dtypes no further from the float32 result than the
replaced operations' own (x ``SDPA_HALF``).

    python benchmarks/device_conformance.py --device cuda --out /tmp/conformance.json
    python benchmarks/device_conformance.py --device cpu --layer-path whole --fixtures ../shared/fixtures
"""

import argparse
import copy
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# Where the fixtures live: the repository's copy first, then the shared folder beside the clone.
FIXTURE_DIRS = (os.path.join(REPO, "tests", "data", "fixtures"), os.path.join(REPO, "..", "shared", "fixtures"))
LSG_FOLDERS = ("bart_plain", "lsg_none", "lsg_norm", "lsg_pooling")
TOLERANCE = 1e-4  # the fixtures' READMEs: float32, values O(1-15)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def find_fixtures(given=None) -> str:
    for folder in [given] if given else FIXTURE_DIRS:
        if folder and os.path.isdir(os.path.join(folder, "lsg")):
            return folder
    raise SystemExit(f"device_conformance.py: error: no fixtures in {given or ' or '.join(FIXTURE_DIRS)}")


def _load(model_pt: str):
    from fairseq import checkpoint_utils

    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([model_pt])
    return models[0].eval()


# ---------------------------------------------------------------- the cases: (name, model.pt, sets)
# Each set: (name, run(model, device) -> (encoder_out (B, T, C) float32 numpy, logits float32 numpy),
# valid (B, T) bool of the encoder rows to compare, reference encoder_out, reference logits).
def lsg_cases(fixtures, work):
    from lsg_fairseq.convert import convert

    inputs = np.load(os.path.join(fixtures, "lsg", "inputs.npz"))
    for name in LSG_FOLDERS:
        model_pt = convert(os.path.join(fixtures, "lsg", name, "hf"), os.path.join(work, name))
        expected = np.load(os.path.join(fixtures, "lsg", name, "outputs.npz"))
        sets = []
        for S in ("long", "mid", "short"):
            if f"{S}_encoder_out" not in expected.files:
                continue
            ids, lengths, dec = (
                torch.from_numpy(inputs[f"{S}_{k}"]) for k in ("input_ids", "lengths", "decoder_input_ids")
            )
            ref_enc = expected[f"{S}_encoder_out"]
            G = ref_enc.shape[1] - ids.shape[1]  # global tokens first in the encoder output
            valid = np.zeros(ref_enc.shape[:2], dtype=bool)
            for i, n in enumerate(lengths.tolist()):
                valid[i, : G + n] = True

            def run(model, device, ids=ids, lengths=lengths, dec=dec):
                enc = model.encoder(ids.to(device), src_lengths=lengths.to(device))
                logits, _ = model(ids.to(device), lengths.to(device), dec.to(device))
                return enc["encoder_out"][0].transpose(0, 1), logits

            sets.append((S, run, valid, ref_enc, expected[f"{S}_logits"]))
        yield f"lsg/{name}", model_pt, sets


def led_cases(fixtures, work):
    from lsg_fairseq.convert import convert

    led = os.path.join(fixtures, "led")
    model_pt = convert(os.path.join(led, "led_w32", "hf"), os.path.join(work, "led_w32"))
    inputs = np.load(os.path.join(led, "inputs.npz"))
    expected = np.load(os.path.join(led, "led_w32", "outputs.npz"))
    sets = []
    for S in ("long", "mid", "short"):
        ids, lengths, dec = (
            torch.from_numpy(inputs[f"{S}_{k}"]) for k in ("input_ids", "lengths", "decoder_input_ids")
        )
        valid = np.arange(ids.shape[1])[None, :] < lengths.numpy()[:, None]

        def run(model, device, ids=ids, lengths=lengths, dec=dec):
            enc = model.encoder(ids.to(device), lengths.to(device))  # default mode: first token global
            logits, _ = model.decoder(dec.to(device), encoder_out=enc)
            return enc["encoder_out"][0].transpose(0, 1), logits

        sets.append((S, run, valid, expected[f"{S}_first_encoder_out"], expected[f"{S}_first_logits"]))
    yield "led/led_w32", model_pt, sets


def locost_cases(fixtures, work):
    from lsg_fairseq.convert import convert

    folder = os.path.join(fixtures, "locost")
    model_pt = convert(os.path.join(folder, "model"), os.path.join(work, "locost"))
    io = np.load(os.path.join(folder, "reference_io.npz"))
    with open(os.path.join(work, "locost", "token_map.json")) as f:
        token_map = json.load(f)
    to_fairseq = {}
    for index, hf in enumerate(token_map):
        if index:  # index 0: the decoder start, a duplicate of HF id 0
            to_fairseq.setdefault(hf, index)
    mask = io["attention_mask"].astype(bool)
    L = int(mask.sum(1).max())
    src = np.vectorize(to_fairseq.get)(io["input_ids"][:, :L])
    src[~mask[:, :L]] = 1  # fairseq's <pad>
    prev = np.vectorize(to_fairseq.get)(io["decoder_input_ids"])
    prev[:, 0] = 0  # the decoder start (HF row 0)
    cols = np.array([to_fairseq[h] for h in range(io["logits"].shape[-1])])  # fairseq index of each HF id
    src, prev, lengths = torch.from_numpy(src), torch.from_numpy(prev), torch.from_numpy(mask[:, :L].sum(1))

    def run(model, device):
        enc = model.encoder(src.to(device), lengths.to(device))
        logits, _ = model.decoder(prev.to(device), encoder_out=enc)
        return enc["encoder_out"][0].transpose(0, 1), logits[..., torch.from_numpy(cols).to(device)]

    yield "locost", model_pt, [("long", run, mask[:, :L], io["encoder_last_hidden_state"][:, :L], io["logits"])]


# ---------------------------------------------------------------- measuring
def outputs(model, run, device, dtype, layer_path):
    from lsg_layers.modules.paths import forced_path

    model = model.to(device=device, dtype=dtype)
    with torch.no_grad(), forced_path(model, layer_path):
        enc, logits = run(model, device)
    return enc.float().cpu().numpy(), logits.float().cpu().numpy()


def max_abs(a, b, valid=None):
    d = np.abs(a - b)
    return float((d[valid] if valid is not None else d).max())


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


FAMILIES = {"lsg": lsg_cases, "led": led_cases, "locost": locost_cases}


def check(fixtures, device, layer_path, dtypes, work, families=tuple(FAMILIES)):
    rows = []
    for cases in (FAMILIES[f] for f in families):
        for name, model_pt, sets in cases(fixtures, work):
            for S, run, valid, ref_enc, ref_logits in sets:
                cpu_enc, cpu_logits = outputs(_load(model_pt), run, "cpu", torch.float32, "cpu")
                enc, logits = outputs(_load(model_pt), run, device, torch.float32, layer_path)
                row = {
                    "fixture": name,
                    "set": S,
                    "device": device,
                    "enc_vs_reference": max_abs(enc, ref_enc, valid),
                    "logits_vs_reference": max_abs(logits, ref_logits),
                    "enc_vs_cpu": max_abs(enc, cpu_enc, valid),
                    "logits_vs_cpu": max_abs(logits, cpu_logits),
                }
                row["fp32_ok"] = bool(max(row["enc_vs_reference"], row["logits_vs_reference"]) <= TOLERANCE)
                for tag in dtypes:
                    if tag != "fp32":
                        _, half_logits = outputs(_load(model_pt), run, device, DTYPES[tag], layer_path)
                        row[f"{tag}_logits_rel_vs_cpu"] = rel_err(half_logits, cpu_logits)
                rows.append(row)
                print(
                    f"{name:<16} {S:<5} fp32 vs reference {row['enc_vs_reference']:.1e} / "
                    f"{row['logits_vs_reference']:.1e}, vs cpu {row['enc_vs_cpu']:.1e} / {row['logits_vs_cpu']:.1e}"
                    + "".join(f", {t} {row[f'{t}_logits_rel_vs_cpu']:.1e}" for t in dtypes if t != "fp32"),
                    flush=True,
                )
    return rows


def gelu_check(device, dtypes) -> dict:
    """{dtype: {"values": bool, "grads": bool}}: one-pass gelu against fairseq's on ``device``, on a
    seeded (4096, 3072) tensor (the FFN's width) with zeros, tiny, huge and infinite entries (NaN
    where both are NaN counts as equal)."""
    from fairseq.modules.gelu import gelu as fairseq_gelu

    from lsg_fairseq.models.activation import one_pass_gelu

    def same(a, b):
        return bool(((a == b) | (a.isnan() & b.isnan())).all())

    out = {}
    for name in dtypes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4096, 3072, generator=g) * 4
        x[0, :7] = torch.tensor([0.0, -0.0, 1e-8, -30.0, 30.0, float("inf"), -float("inf")])
        x = x.to(device=device, dtype=DTYPES[name]).requires_grad_(True)
        ours, theirs = one_pass_gelu(x), fairseq_gelu(x)
        (g_ours,) = torch.autograd.grad(ours.float().nansum(), x)
        (g_theirs,) = torch.autograd.grad(theirs.float().nansum(), x)
        out[name] = {"values": same(ours, theirs), "grads": same(g_ours, g_theirs)}
    return out


RMS_ULP = {"fp32": 2**-22, "bf16": 2**-7, "fp16": 2**-10}


def rms_norm_check(device, dtypes) -> dict:
    """{dtype: {"fused": whether T5LayerNorm takes it there, "values": rel. diff, "grads": rel. diff,
    "ok": within the bounds}}: ``F.rms_norm`` against ``T5LayerNorm.reference`` on a seeded
    (3, 4096, 768) input (base width)."""
    import torch.nn.functional as F

    from lsg_layers.modules.t5_layers import T5LayerNorm

    out = {}
    for name in dtypes:
        g = torch.Generator().manual_seed(0)
        norm = T5LayerNorm(768, eps=1e-6)
        with torch.no_grad():
            norm.weight.copy_(torch.rand(768, generator=g) + 0.5)
        norm = norm.to(device=device, dtype=DTYPES[name])
        x = (torch.randn(3, 4096, 768, generator=g) * 3).to(device=device, dtype=DTYPES[name]).requires_grad_(True)
        fused, reference = F.rms_norm(x, (768,), norm.weight, norm.variance_epsilon), norm.reference(x)
        grad = torch.randn(fused.shape, generator=g).to(device=device, dtype=fused.dtype)
        pairs = zip(
            torch.autograd.grad(fused, (x, norm.weight), grad), torch.autograd.grad(reference, (x, norm.weight), grad)
        )
        grads = max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in pairs)
        values = float(
            (fused.detach().float() - reference.detach().float()).abs().max() / reference.detach().abs().max()
        )
        ok = values <= RMS_ULP[name] and grads <= 4 * RMS_ULP[name]
        out[name] = {"fused": norm.fused(x), "values": values, "grads": grads, "ok": ok}
    return out


SDPA_FP32, SDPA_HALF = 1e-5, 1.25


def sdpa_check(device, dtypes, source: int = 16384) -> dict:
    """{"cross_step" | "t5": {dtype: {"fused": rel. diff from the float32 result, "replaced": the same
    for the operations replaced, "ok"}}} on ``device``, base sizes (768, 12 heads), beam 4, a seeded
    ``source``-token memory whose last quarter is padding for the second of two sources."""
    from lsg_fairseq.models.cross_attention import LongSourceCrossAttention
    from lsg_layers.modules.t5_layers import T5Attention

    g = torch.Generator().manual_seed(0)
    beam, n = 4, 2
    memory = torch.randn(source, n, 768, generator=g)
    pad = torch.zeros(n, source, dtype=torch.bool)
    pad[1, 3 * source // 4 :] = True
    query = torch.randn(1, n * beam, 768, generator=g)
    torch.manual_seed(0)  # the layers' initial weights
    cross = LongSourceCrossAttention(768, 12, kdim=768, vdim=768, encoder_decoder_attention=True).eval()
    t5 = T5Attention(768, 64, 12).eval()
    bias = torch.zeros(n, 1, 1, source).masked_fill(pad[:, None, None, :], torch.finfo(torch.float32).min)

    def cross_step(dtype, fused: bool):
        attn = copy.deepcopy(cross).to(device=device, dtype=dtype)
        attn.set_beam_size(beam)
        state: dict = {}
        mem, q = memory.to(device=device, dtype=dtype), query.to(device=device, dtype=dtype)
        attn(q, mem, mem, pad.to(device), state, need_weights=True, static_kv=True)  # the first step: caches
        out, _ = attn(q, mem, mem, pad.to(device), state, need_weights=not fused, static_kv=True)
        return out.float()

    def t5_step(dtype, fused: bool):
        attn = copy.deepcopy(t5).to(device=device, dtype=dtype)
        if not fused:
            attn.fused = lambda q: False  # the layer's own forward, on HF's operations
        x, mem = query.transpose(0, 1).to(device=device, dtype=dtype), memory.transpose(0, 1).to(device, dtype)
        return attn(x, memory=mem, bias=bias.to(device)).float()  # a source's beam folded by forward

    out = {}
    with torch.no_grad():
        for label, step in (("cross_step", cross_step), ("t5", t5_step)):
            exact = step(torch.float32, fused=False)
            out[label] = {}
            for name in dtypes:
                fused, replaced = (
                    rel_err(step(DTYPES[name], f).cpu().numpy(), exact.cpu().numpy()) for f in (True, False)
                )
                ok = fused <= SDPA_FP32 if name == "fp32" else fused <= SDPA_HALF * replaced
                out[label][name] = {"fused": fused, "replaced": replaced, "ok": bool(ok)}
    return out


def sdpa_line(checks: dict) -> str:
    cells = "; ".join(
        f"{label}: "
        + ", ".join(
            f"{t} {r['fused']:.1e} / {r['replaced']:.1e} ({'ok' if r['ok'] else '**NO**'})" for t, r in c.items()
        )
        for label, c in checks.items()
    )
    return f"\nDecoder attention in one SDPA call against the float32 result (fused / replaced operations): {cells}.\n"


def rms_norm_line(checks: dict) -> str:
    cells = ", ".join(
        f"{t} {r['values']:.1e} / {r['grads']:.1e} ({'ok' if r['ok'] else '**NO**'}"
        f"{'' if r['fused'] else ', not taken here'})"
        for t, r in checks.items()
    )
    return f"\nFused RMSNorm against HF's operations (values / gradients, relative to the largest entry): {cells}.\n"


def gelu_line(gelu: dict) -> str:
    cells = ", ".join(f"{t} {'yes' if r['values'] and r['grads'] else '**NO**'}" for t, r in gelu.items())
    return f"\nOne-pass gelu equals fairseq's bit for bit (values and gradients): {cells}.\n"


def markdown(rows, dtypes) -> str:
    half = [t for t in dtypes if t != "fp32"]
    head = (
        "| fixture | set | fp32 encoder vs reference | fp32 logits vs reference | fp32 encoder vs CPU | "
        "fp32 logits vs CPU | " + " | ".join(f"{t} logits rel. vs CPU" for t in half) + " | within 1e-4 |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        out.append(
            f"| {r['fixture']} | {r['set']} | {r['enc_vs_reference']:.1e} | {r['logits_vs_reference']:.1e} | "
            f"{r['enc_vs_cpu']:.1e} | {r['logits_vs_cpu']:.1e} | "
            + "".join(f"{r[f'{t}_logits_rel_vs_cpu']:.1e} | " for t in half)
            + ("yes" if r["fp32_ok"] else "**NO**")
            + " |"
        )
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--layer-path", default="auto", choices=["auto", "whole", "cpu"])
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument(
        "--fixtures", default=None, help="folder with lsg/, led/, locost/ (default: " + " or ".join(FIXTURE_DIRS) + ")"
    )
    p.add_argument("--out", required=True, help="JSON written here (the markdown beside it, .md)")
    args = p.parse_args(argv)
    fixtures = find_fixtures(args.fixtures)
    import lsg_fairseq  # noqa: F401  (registers the models)

    start = time.time()
    with tempfile.TemporaryDirectory() as work:
        rows = check(fixtures, args.device, args.layer_path, args.dtypes, work, args.families)
    gelu = gelu_check(args.device, args.dtypes)
    rms = rms_norm_check(args.device, args.dtypes)
    sdpa = sdpa_check(args.device, args.dtypes, source=16384 if args.device != "cpu" else 1024)
    result = {
        "device": args.device,
        "layer_path": args.layer_path,
        "torch": torch.__version__,
        "seconds": round(time.time() - start, 1),
        "rows": rows,
        "all_fp32_within_tolerance": all(r["fp32_ok"] for r in rows),
        "gelu_one_pass": gelu,
        "rms_norm_fused": rms,
        "decoder_sdpa": sdpa,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(markdown(rows, args.dtypes) + gelu_line(gelu) + rms_norm_line(rms) + sdpa_line(sdpa))
    gelu_same = all(r["values"] and r["grads"] for r in gelu.values())
    rms_ok = all(r["ok"] for r in rms.values())
    sdpa_ok = all(r["ok"] for c in sdpa.values() for r in c.values())
    print(
        f"{len(rows)} rows, fp32 within {TOLERANCE:g} of the references: {result['all_fp32_within_tolerance']}; "
        f"one-pass gelu the same as fairseq's: {gelu_same}; fused RMSNorm within a rounding of HF's: {rms_ok}; "
        f"decoder attention in one SDPA call within its bounds: {sdpa_ok} "
        f"({result['seconds']:.0f} s)"
    )
    return 0 if result["all_fp32_within_tolerance"] and gelu_same and rms_ok and sdpa_ok else 1


if __name__ == "__main__":
    sys.exit(main())
