#!/usr/bin/env python
"""Build tests/data, the data the test suite reads, from the full sets in ../shared.

The suite must pass in a fresh clone with nothing beside it, so the part of ../shared that the
tests read lives in the repository, as small as the tests allow (tests/data/README.md):

* fixtures/: the conformance fixtures. HF checkpoint folders are copied byte for byte
  (lsg_*/hf/tokenizer.json, which nothing reads, is left out). Of each .npz, only the arrays the
  tests read, stored LZMA-compressed (np.load reads them as usual). Encoder outputs keep their
  shape, but positions past each row's real tokens (padding, which no test compares and the
  fixture READMEs exclude from the contract) are set to 0, which compresses. LOCOST's
  kernel_bidirectional and kernel_raw_fp64 are rebuilt bit for bit by :func:`read_kernels`: the
  first from kernel_raw (its README's formula), the second from kernel_raw plus a stored float64
  difference.
* documents/: the first lines of the SumPubMed and SQuALITY splits (as many as the most any test
  reads, so the tests read the same documents as before) and two whole Gutenberg books.

manifest.json records, for every file written, its source in ../shared with the source's sha256,
what was done, and the sha256 of the result (per array for .npz). tests/test_test_data.py checks
the files against it, and, where ../shared is present, that a rebuild gives the same manifest.
Same inputs -> same manifest.

Example:
    python scripts/make_test_data.py                      # ../shared -> tests/data
    python scripts/make_test_data.py --shared /data/lsg-shared --out /tmp/test-data
"""

import argparse
import hashlib
import io
import json
import os
import sys
import zipfile
from typing import Dict, Iterator, List, Tuple

import numpy as np

from lsg_text.atomic import atomic_files
from lsg_text.errors import report
from lsg_text.fileio import DataError, check_output_path, require_dir

PROG = "make_test_data.py"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the HF checkpoint folders the tests convert, and the files left out of them
HF_FOLDERS = [
    "fixtures/lsg/bart_plain/hf",
    "fixtures/lsg/lsg_none/hf",
    "fixtures/lsg/lsg_norm/hf",
    "fixtures/lsg/lsg_pooling/hf",
    "fixtures/led/led_w32/hf",
    "fixtures/locost/model",
]
NOT_READ = {"tokenizer.json"}  # the converter reads vocab.json + merges.txt, never this
#: other files copied whole: meta.json for its checkpoint_keys (tests/test_export.py)
WHOLE = ["fixtures/locost/meta.json", "data/gutenberg/blake-poems.txt", "data/gutenberg/shakespeare-macbeth.txt"]
#: JSONL subsets: the first N lines, N the most any test reads
FIRST_LINES = {
    "data/sumpubmed/train.jsonl": 20,  # test_convert_locost's sentencepiece text
    "data/sumpubmed/valid.jsonl": 4,  # word_data, test_end_to_end, test_scripts
    "data/sumpubmed/test.jsonl": 4,  # test_scripts (4 per split)
    "data/squality/train.jsonl": 3,  # test_gsg_task's fine-tuning
}
LSG_GLOBALS = {"bart_plain": 0, "lsg_none": 4, "lsg_norm": 4, "lsg_pooling": 4}  # global tokens first
SETS = ["long", "mid", "short"]

COPY = "copy"
PADDING_ZEROED = "copy, positions past each row's real tokens set to 0"
FP64_DIFFERENCE = "kernel_raw_fp64 - kernel_raw in float64 (read_kernels adds kernel_raw back)"
BIDIRECTIONAL = "rebuilt from kernel_raw: [Kf[0] + Kb[0], Kf[1:], 0, Kb[:0:-1]] per channel"
FP64 = "rebuilt: kernel_raw (as float64) + kernel_raw_fp64_minus_raw"


def in_repo(rel: str) -> str:
    """Where a file of ../shared goes in tests/data: fixtures/ stays, data/ becomes documents/."""
    return "documents/" + rel[len("data/") :] if rel.startswith("data/") else rel


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def array_record(a: np.ndarray, how: str, source: np.ndarray) -> dict:
    return {
        "dtype": a.dtype.str,
        "shape": list(a.shape),
        "sha256": sha256(np.ascontiguousarray(a).tobytes()),
        "how": how,
        "from_sha256": sha256(np.ascontiguousarray(source).tobytes()),
    }


def padding_zeroed(a: np.ndarray, lengths, first: int = 0) -> np.ndarray:
    """``a`` (..., B, T, C) with row i's positions from ``first + lengths[i]`` on set to 0."""
    out = a.copy()
    for i, n in enumerate(lengths):
        out[..., i, first + int(n) :, :] = 0
    return out


def bidirectional_kernel(kernel_raw: np.ndarray) -> np.ndarray:
    """The circular length-2L kernel (H, 2L) of fixtures/locost from its raw kernels (2, H, L)."""
    kf, kb = kernel_raw
    zero = np.zeros_like(kf[:, :1])
    return np.concatenate([kf[:, :1] + kb[:, :1], kf[:, 1:], zero, kb[:, :0:-1]], axis=1)


def read_kernels(path: str) -> Dict[str, np.ndarray]:
    """tests/data's kernels_layer0.npz as the reference wrote it: L, kernel_raw,
    kernel_bidirectional and kernel_raw_fp64 (bit for bit; manifest.json holds their sha256)."""
    with np.load(path) as stored:
        out = {"L": stored["L"], "kernel_raw": stored["kernel_raw"]}
        out["kernel_raw_fp64"] = stored["kernel_raw"].astype(np.float64) + stored["kernel_raw_fp64_minus_raw"]
    out["kernel_bidirectional"] = bidirectional_kernel(out["kernel_raw"])
    return out


def npz_bytes(arrays: Dict[str, np.ndarray]) -> bytes:
    """An .npz that np.load reads, its members LZMA-compressed (about 8% smaller than np.savez_compressed
    on these float arrays, and 6x on LOCOST's ssm0_input), dated 1980 so the bytes depend on the arrays only."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, a in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_LZMA
            with z.open(info, "w") as f:
                np.lib.format.write_array(f, a, allow_pickle=False)
    return buf.getvalue()


# ----------------------------------------------------------------------------- what goes where
def npz_files(shared: str) -> Iterator[Tuple[str, Dict[str, Tuple[np.ndarray, str, np.ndarray]]]]:
    """(source path, {array: (stored array, how, source array)}) for every .npz the tests read."""

    def load(rel):
        with np.load(os.path.join(shared, rel)) as f:
            return dict(f)

    lsg_in = load("fixtures/lsg/inputs.npz")
    yield "fixtures/lsg/inputs.npz", {k: (a, COPY, a) for k, a in lsg_in.items() if not k.startswith("nopad_")}
    for name, globals_ in LSG_GLOBALS.items():
        out, arrays = load(f"fixtures/lsg/{name}/outputs.npz"), {}
        for S in SETS:
            if f"{S}_encoder_out" in out:  # bart_plain has no long set
                enc, lengths = out[f"{S}_encoder_out"], lsg_in[f"{S}_lengths"]
                arrays[f"{S}_encoder_out"] = (padding_zeroed(enc, lengths, globals_), PADDING_ZEROED, enc)
                arrays[f"{S}_logits"] = (out[f"{S}_logits"], COPY, out[f"{S}_logits"])
        yield f"fixtures/lsg/{name}/outputs.npz", arrays

    led_in = load("fixtures/led/inputs.npz")
    yield "fixtures/led/inputs.npz", {k: (a, COPY, a) for k, a in led_in.items()}
    out, arrays = load("fixtures/led/led_w32/outputs.npz"), {}
    for k, a in out.items():  # every array is read: S_G_encoder_out / _logits, mid_first_encoder_hidden_states
        lengths = led_in[k.split("_")[0] + "_lengths"]
        arrays[k] = (padding_zeroed(a, lengths), PADDING_ZEROED, a) if "encoder" in k else (a, COPY, a)
    yield "fixtures/led/led_w32/outputs.npz", arrays

    io_ = load("fixtures/locost/reference_io.npz")
    lengths = io_["attention_mask"].sum(1)
    arrays = {
        k: (io_[k], COPY, io_[k]) for k in ("input_ids", "attention_mask", "decoder_input_ids", "logits", "ssm0_input")
    }  # ssm0_input: padded positions are input
    for k in ("encoder_last_hidden_state", "ssm0_output"):
        arrays[k] = (padding_zeroed(io_[k], lengths), PADDING_ZEROED, io_[k])
    yield "fixtures/locost/reference_io.npz", arrays  # encoder_hidden_after_block0: not read

    kernels = load("fixtures/locost/kernels_layer0.npz")
    raw, fp64 = kernels["kernel_raw"], kernels["kernel_raw_fp64"]
    difference = fp64 - raw.astype(np.float64)
    yield (
        "fixtures/locost/kernels_layer0.npz",
        {
            "L": (kernels["L"], COPY, kernels["L"]),
            "kernel_raw": (raw, COPY, raw),
            "kernel_raw_fp64_minus_raw": (difference, FP64_DIFFERENCE, fp64),
        },
    )


def whole_files(shared: str) -> List[str]:
    names = list(WHOLE)
    for folder in HF_FOLDERS:
        names += [f"{folder}/{n}" for n in sorted(os.listdir(os.path.join(shared, folder))) if n not in NOT_READ]
    return names


def build(shared: str) -> Tuple[Dict[str, bytes], dict]:
    """Every file of tests/data (path -> bytes) and the manifest, from the full sets in ``shared``."""
    files: Dict[str, bytes] = {}
    manifest: Dict[str, dict] = {}

    def source(rel):
        with open(os.path.join(shared, rel), "rb") as f:
            return f.read()

    for rel in whole_files(shared):
        data = source(rel)
        files[in_repo(rel)] = data
        manifest[in_repo(rel)] = {"from": rel, "from_sha256": sha256(data), "how": COPY, "sha256": sha256(data)}
    for rel, n in FIRST_LINES.items():
        data = source(rel)
        lines = data.splitlines(keepends=True)
        if len(lines) < n:
            raise DataError(f"{os.path.join(shared, rel)}: {len(lines)} lines, the tests read {n}")
        files[in_repo(rel)] = subset = b"".join(lines[:n])
        manifest[in_repo(rel)] = {
            "from": rel,
            "from_sha256": sha256(data),
            "how": f"first {n} lines",
            "sha256": sha256(subset),
        }
    for rel, arrays in npz_files(shared):
        files[rel] = npz_bytes({k: a for k, (a, _, _) in arrays.items()})
        manifest[rel] = {
            "from": rel,
            "from_sha256": sha256(source(rel)),
            "arrays": {k: array_record(a, how, src) for k, (a, how, src) in arrays.items()},
        }
    kernels_rel = "fixtures/locost/kernels_layer0.npz"
    with np.load(os.path.join(shared, kernels_rel)) as ref:
        rebuilt = read_kernels(io.BytesIO(files[kernels_rel]))
        manifest[kernels_rel]["rebuilt"] = {}
        for k, how in (("kernel_bidirectional", BIDIRECTIONAL), ("kernel_raw_fp64", FP64)):
            if not (rebuilt[k].dtype == ref[k].dtype and np.array_equal(rebuilt[k], ref[k])):
                raise AssertionError(f"{kernels_rel}: {k} does not rebuild bit for bit")  # a bug, not bad input
            manifest[kernels_rel]["rebuilt"][k] = array_record(ref[k], how, ref[k])
    return files, {"files": dict(sorted(manifest.items()))}


def manifest_json(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()


def earlier_build(out: str) -> set:
    """The files an earlier build wrote in ``out`` (its manifest's, relative to ``out``): the only
    ones a rebuild may delete. Anything else there (a README.md, a user's file) is kept."""
    path = os.path.join(out, "manifest.json")
    if not os.path.isfile(path):
        return set()
    try:
        with open(path, encoding="utf-8") as f:
            listed = json.load(f)["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"--out {out}: its manifest.json is not one this script wrote ({e}); move it away") from None
    return {r for r in listed if isinstance(r, str) and not os.path.isabs(r) and ".." not in r.split("/")}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--shared",
        default=os.path.join(REPO, "..", "shared"),
        help="the full sets: fixtures/{lsg,led,locost} and data/{sumpubmed,squality,gutenberg} "
        "(default: ../shared beside the repository)",
    )
    p.add_argument(
        "--out",
        default=os.path.join(REPO, "tests", "data"),
        help="where the files and manifest.json go; README.md files there are kept (default: tests/data)",
    )
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_output_path(args.out, "--out", folder=True)
        require_dir(args.shared, "--shared")
        earlier = earlier_build(args.out)
        files, manifest = build(args.shared)
    except (DataError, OSError) as e:
        return report(e, PROG)
    files["manifest.json"] = manifest_json(manifest)
    paths = [os.path.join(args.out, rel) for rel in files]
    with atomic_files(paths) as handles:
        for handle, data in zip(handles, files.values()):
            handle.write(data)
    for rel in sorted(earlier - set(files)):  # written by the earlier build, not by this one
        path = os.path.join(args.out, rel)
        if os.path.isfile(path):
            os.remove(path)
    total = sum(map(len, files.values()))
    print(f"{PROG}: wrote {len(files)} files, {total / 1e6:.2f} MB, to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
