"""tests/data: the files the suite reads are the ones manifest.json names, and they equal the full sets.

The full sets (../shared) are not in the repository; scripts/make_test_data.py took what the tests
read from them. Here, always: every file and array of tests/data has the sha256 that manifest.json
gives it, the LOCOST kernels rebuild bit for bit, and the manifest agrees with itself. Where
../shared sits beside the checkout, a rebuild from it gives the committed manifest.

To change what tests/data holds: edit scripts/make_test_data.py, run it, commit data and manifest.
"""

import hashlib
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import BIN, REPO_ROOT, SHARED, TEST_DATA, locost_kernels, make_test_data

with open(os.path.join(TEST_DATA, "manifest.json"), encoding="utf-8") as f:
    MANIFEST = json.load(f)
FILES = MANIFEST["files"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def array_sha256(a: np.ndarray) -> str:
    return sha256(np.ascontiguousarray(a).tobytes())


def test_every_file_is_in_the_manifest_and_no_more():
    found = set()
    for folder, _, names in os.walk(TEST_DATA):
        found |= {os.path.relpath(os.path.join(folder, n), TEST_DATA) for n in names if n != "README.md"}
    assert found - {"manifest.json"} == set(FILES)
    for rel in FILES:  # each data folder (fixtures/lsg, documents/sumpubmed, ...) says where its files come from
        assert os.path.isfile(os.path.join(TEST_DATA, *rel.split("/")[:2], "README.md")), rel


def test_files_and_arrays_match_the_manifest():
    for rel, record in FILES.items():
        path = os.path.join(TEST_DATA, rel)
        if "arrays" not in record:
            with open(path, "rb") as f:
                assert sha256(f.read()) == record["sha256"], rel
            continue
        with np.load(path) as stored:
            assert sorted(stored.files) == sorted(record["arrays"]), rel
            for name, want in record["arrays"].items():
                a = stored[name]
                got = {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": array_sha256(a)}
                assert got == {k: want[k] for k in got}, (rel, name)


def test_locost_kernels_rebuild_bit_for_bit():
    """kernel_bidirectional and kernel_raw_fp64 are not stored; what the tests get has the sha256
    of the reference's arrays (recorded from ../shared when tests/data was made)."""
    kernels = locost_kernels()
    rebuilt = FILES["fixtures/locost/kernels_layer0.npz"]["rebuilt"]
    assert sorted(kernels) == sorted(["L", "kernel_raw", *rebuilt])
    for name, want in rebuilt.items():
        a = kernels[name]
        assert (a.dtype.str, list(a.shape), array_sha256(a)) == (want["dtype"], want["shape"], want["from_sha256"])
    assert np.abs(kernels["kernel_raw_fp64"] - kernels["kernel_raw"]).max() < 1e-6  # the README's 1e-6


def test_manifest_matches_the_full_sets():
    """Always: the manifest agrees with itself (a copy has its source's sha256; every derivation
    is one the script names; zeroed padding is zero). Where ../shared sits beside the checkout
    (developers' clones; not CI's or a user's): a rebuild from it gives the committed manifest."""
    make = make_test_data()
    known = {make.COPY, make.PADDING_ZEROED, make.FP64_DIFFERENCE}
    for rel, record in FILES.items():
        assert make.in_repo(record["from"]) == rel
        if "arrays" not in record:
            assert (record["how"] == make.COPY) == (record["sha256"] == record["from_sha256"]), rel
            continue
        for name, a in record["arrays"].items():
            assert a["how"] in known, (rel, name)
            assert (a["how"] == make.COPY) == (a["sha256"] == a["from_sha256"]), (rel, name)
    with np.load(os.path.join(TEST_DATA, "fixtures", "locost", "reference_io.npz")) as io:
        n = io["attention_mask"].sum(1)
        assert n.tolist() == [3000, 1234] and not io["ssm0_output"][1, n[1] :].any()
    if os.path.isdir(SHARED):
        _, manifest = make.build(SHARED)
        assert manifest == MANIFEST


# ----------------------------------------------------------------------------- the full sets stay outside
NEED_FULL_DATA = [  # (script, PART, the variable set to a missing path, others pointed at what exists)
    ("scripts/demo.sh", None, "DATA", {}),
    ("examples/lsg_summarization/run_small.sh", None, "DATA", {}),
    ("examples/lsg_summarization/run_small.sh", "convert", "BART_HF", {"DATA": "documents/sumpubmed"}),
    ("examples/locost/run_small.sh", "rouge", "DATA", {}),
    ("examples/locost/run_small.sh", "book", "BOOK", {}),
    ("examples/gsg_pretraining/run.sh", None, "GUTENBERG", {}),
    ("examples/gsg_pretraining/run.sh", None, "FT_DATA", {"GUTENBERG": "valid_book"}),
]


@pytest.mark.parametrize("script, part, var, others", NEED_FULL_DATA)
def test_an_example_without_its_full_data_says_where_in_one_line(tmp_path, script, part, var, others):
    """Before any work: one line naming the missing path and the variable to set, exit 2."""
    (tmp_path / "valid_book").mkdir()
    (tmp_path / "valid_book" / "chesterton-thursday.txt").write_text("the gsg example's valid book\n")
    env = dict(os.environ, PATH=os.pathsep.join([BIN, os.environ["PATH"]]), DEVICE="cpu", OUT=str(tmp_path / "out"))
    env[var] = str(tmp_path / "nowhere")
    for k, v in others.items():
        env[k] = os.path.join(TEST_DATA, v) if v.startswith("documents/") else str(tmp_path / v)
    if part:
        env["PART"] = part
    proc = subprocess.run(["bash", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    prog, _, message = lines[0].partition(": error: ")
    assert prog.endswith(os.path.basename(script)) and message.startswith(str(tmp_path / "nowhere")), lines[0]
    # a file knob: set VAR=/path/to/it; a folder knob: the folder that holds the missing file
    assert f"set {var}=" in message or f"set {var} to the folder that holds " in message, message
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")  # nothing done yet


def test_a_rebuild_deletes_only_what_the_earlier_build_wrote(tmp_path, capsys, monkeypatch):
    """scripts/make_test_data.py --out: the files of the earlier build's manifest that this build no
    longer writes go; a file the script never wrote (a user's, a README.md) stays (it deleted every
    file but README.md before). An --out that is a file is one line, nothing written."""
    make = make_test_data()
    shared, out = tmp_path / "shared", tmp_path / "out"
    shared.mkdir()
    (out / "sub").mkdir(parents=True)
    for rel, text in {"kept.txt": "old", "gone.txt": "old", "notes.txt": "mine", "sub/results.csv": "mine"}.items():
        (out / rel).write_text(text)
    (out / "README.md").write_text("readme")
    (out / "manifest.json").write_text(json.dumps({"files": {"kept.txt": {}, "gone.txt": {}}}))
    monkeypatch.setattr(make, "build", lambda shared: ({"kept.txt": b"new"}, {"files": {"kept.txt": {}}}))
    assert make.main(["--shared", str(shared), "--out", str(out)]) == 0
    left = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert left == {
        "kept.txt": "new",
        "notes.txt": "mine",
        "sub/results.csv": "mine",
        "README.md": "readme",
        "manifest.json": make.manifest_json({"files": {"kept.txt": {}}}).decode(),
    }
    capsys.readouterr()
    assert make.main(["--shared", str(shared), "--out", str(out / "notes.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"make_test_data.py: error: --out {out / 'notes.txt'}: exists and is not a folder" + (
        " (choose another output folder)"
    )
    assert (out / "notes.txt").read_text() == "mine"
