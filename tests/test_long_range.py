"""examples/long_range: the binding variant, exact match, the control row, the report's statistics,
the experiment end to end (smoke), and the claim CI holds: LSG reads far keys that BART truncated to
1,024 cannot."""

import json
import os
import subprocess
import sys

import pytest
import torch

from lsg_text.errors import ConfigError
from lsg_text.synthetic import (
    ANIMALS,
    COLOURS,
    MAX_COUNT,
    NAMES,
    SyntheticConfig,
    count_hits,
    exact_match,
    heldout_pair,
    heldout_set,
    key_hits,
    make_split,
    order_hits,
    parse_order,
)
from lsg_text.synthetic.position_rule import band, fit_position_rule, position_rule_scores

from conftest import load_script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(REPO, "examples", "long_range")
BINDING = SyntheticConfig(
    variant="binding", min_tokens=1300, max_tokens=1600, min_keys=2, max_keys=3, min_gap=1024, holdout=True
)


def load_report():
    return load_script("examples/long_range/report.py", "long_range_report", neighbours=False)


@pytest.fixture(scope="module")
def binding_examples():
    return list(make_split("test", 40, seed=5, cfg=BINDING))


def _sentences(document):
    return [s.strip() for s in document.replace("\n", " ").split(".") if s.strip()]


def test_binding_joins_two_far_sentences_and_skips_decoys(binding_examples):
    for ex in binding_examples:
        words = ex["document"].split()
        sentences = _sentences(ex["document"])
        offsets = [k["token_offset"] for k in ex["keys"]]
        assert offsets == sorted(offsets) and 2 <= len(ex["keys"]) <= 3
        for k in ex["keys"]:
            assert k["token_offset"] - k["bind_offset"] >= 1024
            assert (
                " ".join(words[k["bind_offset"] : k["bind_offset"] + 6])
                == f"The {k['colour']} {k['animal']} is called {k['name']}."
            )
            assert (
                " ".join(words[k["token_offset"] : k["token_offset"] + 5])
                == f"{k['name']} visited {k['city']} on {k['weekday']}."
            )
            # the summary's sentence occurs nowhere in the document: it has to be put together
            assert f"The {k['colour']} {k['animal']} visited" not in ex["document"]
            decoys = [s for s in sentences if s.startswith(f"{k['name']} avoided ")]
            assert len(decoys) == 1 and k["city"] not in decoys[0] and k["weekday"] not in decoys[0]
        # one more bound name that only ever avoids
        bound = [s.split()[-1] for s in sentences if " is called " in s]
        assert len(bound) == len(ex["keys"]) + 1 and set(bound) <= set(NAMES)
        assert ex["summary"] == " ".join(
            f"The {k['colour']} {k['animal']} visited {k['city']} on {k['weekday']}." for k in ex["keys"]
        )
        assert exact_match(ex["summary"], ex["summary"])


def test_decoy_names_with_even_mentions_leave_no_name_standing_out():
    """--decoy-names N --even-mentions: N never-used bound names, each mentioned three times (bound,
    avoided twice) like a key's name (bound, avoided, visited): only "visited" marks the key's name."""
    from collections import Counter

    cfg = SyntheticConfig(
        variant="binding",
        min_tokens=1300,
        max_tokens=1600,
        min_keys=1,
        max_keys=1,
        min_gap=1024,
        holdout=True,
        decoy_names=4,
        even_mentions=True,
    )
    for ex in make_split("valid", 20, seed=3, cfg=cfg):
        words = [w.strip(".,") for w in ex["document"].split()]
        bound = [s.split()[-1] for s in _sentences(ex["document"]) if " is called " in s]
        assert len(bound) == 5 and len(set(bound)) == 5
        counts = Counter(w for w in words if w in NAMES)
        assert {counts[n] for n in bound} == {3} and sum(counts.values()) == 15
        (key,) = ex["keys"]
        assert ex["document"].count(" visited ") + ex["document"].startswith(f"{key['name']} visited") >= 1
        assert sum(1 for s in _sentences(ex["document"]) if " visited " in f" {s} ") == 1
    with pytest.raises(ValueError, match="decoy_names"):
        SyntheticConfig(
            variant="binding", min_tokens=3000, max_tokens=3500, min_keys=1, max_keys=3, decoy_names=len(NAMES)
        ).validate()


def test_committed_outputs_rescore_to_the_committed_table(tmp_path):
    """report.py regenerates the documents from outputs/<variant>/data.json: any change to the generator's
    draws (a new option must keep its default's) would move the committed main table."""
    out = tmp_path / "r"
    subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "report.py"),
            "--outputs",
            os.path.join(HERE, "outputs"),
            "--report-dir",
            str(out),
            "--variants",
            "retrieval",
            "binding",
            "--rows",
            "local_8",
            "bart_1024",
            "full_4096",
            "lsg_norm",
            "led",
            "locost",
            "--seeds",
            "1",
            "2",
            "3",
            "--n-docs",
            "50",
        ],
        check=True,
        capture_output=True,
    )
    with open(os.path.join(HERE, "results.json")) as f:
        committed = json.load(f)["variants"]
    assert json.loads((out / "results.json").read_text())["variants"] == committed


@pytest.mark.parametrize("folder", ["order", "order3"])
def test_committed_order_outputs_rescore_to_the_committed_table(tmp_path, folder):
    """The order tables (order/: 2 arrivals, order3/: 3, the gap's): their raw outputs and data.json
    regenerate the committed numbers, the position-only row included (fitted on the 1,500 training
    documents the long stage trained on, regenerated from the same flags: no training)."""
    here = os.path.join(HERE, folder)
    assert (
        load_report().main(
            [
                "--outputs",
                os.path.join(here, "outputs"),
                "--report-dir",
                str(tmp_path),
                "--variants",
                "order",
                "--rows",
                "local_8",
                "bart_1024",
                "full_4096",
                "lsg_norm",
                "led",
                "locost",
                "--seeds",
                "1",
                "2",
                "3",
                "--n-docs",
                "50",
            ]
        )
        == 0
    )
    with open(os.path.join(here, "results.json")) as f:
        committed = json.load(f)["variants"]
    assert json.loads((tmp_path / "results.json").read_text())["variants"] == committed
    rows = committed["order"]
    assert list(rows)[:2] == ["local_8", "position_only"]
    ref = rows["position_only"]
    if folder == "order3":
        assert [r for r, c in rows.items() if c["beats_control"] and r != "position_only"] == [
            "lsg_norm",
            "led",
            "locost",
        ]
        # the README's reading: position alone beats the control too, and no long row is above the rule's
        # interval, so the gap cannot tell these rows from a reader that only knows where arrivals lie
        assert ref["beats_control"] is True
        assert all(rows[r]["exact"] <= ref["exact_ci"][1] for r in ("lsg_norm", "led", "locost"))
    else:
        assert not any(c["beats_control"] for r, c in rows.items() if r != "position_only")
        assert all(c["exact"] < ref["exact_ci"][0] for r, c in rows.items() if r != "position_only")


def test_binding_words_never_occur_in_filler(binding_examples):
    special = set(NAMES) | {"called", "avoided", "visited", "is"} | set(COLOURS) | set(ANIMALS)
    for ex in binding_examples[:10]:
        for s in _sentences(ex["document"]):
            if " is called " in s or " visited " in s or " avoided " in s:
                continue
            assert not special & set(s.split()), s


def test_holdout_keeps_test_pairs_out_of_training():
    train = list(make_split("train", 60, seed=5, cfg=BINDING))
    test = list(make_split("test", 60, seed=5, cfg=BINDING))
    pair = lambda k: (k["colour"], k["animal"])  # noqa: E731
    train_pairs = {pair(k) for ex in train for k in ex["keys"]}
    test_pairs = {pair(k) for ex in test for k in ex["keys"]}
    assert train_pairs and test_pairs and not train_pairs & test_pairs
    assert all(heldout_pair(*p) for p in test_pairs)
    # without holdout both sides draw from every pair (the long_context data is unchanged)
    loose = SyntheticConfig(min_tokens=300, max_tokens=400, min_keys=3, max_keys=3)
    assert any(heldout_pair(k["colour"], k["animal"]) for ex in make_split("train", 40, 5, loose) for k in ex["keys"])


def test_binding_is_deterministic_and_validated():
    a = [json.dumps(e) for e in make_split("valid", 3, seed=7, cfg=BINDING)]
    assert a == [json.dumps(e) for e in make_split("valid", 3, seed=7, cfg=BINDING)]
    with pytest.raises(ValueError, match="min_gap"):
        SyntheticConfig(variant="binding", min_tokens=500, max_tokens=900, min_gap=1024).validate()
    with pytest.raises(ValueError, match="variant"):
        SyntheticConfig(variant="counting").validate()


def test_exact_match_needs_every_key_in_order_and_nothing_else():
    keys = [
        dict(colour="red", animal="fox", city="Paris", weekday="Monday"),
        dict(colour="blue", animal="owl", city="Lima", weekday="Friday"),
    ]
    right = "The red fox visited Paris on Monday. The blue owl visited Lima on Friday."
    assert exact_match(right, right) and exact_match(right, "  " + right.replace(" ", "  "))
    assert not exact_match(right, right.replace("Lima", "Oslo"))  # a decoy's city
    assert not exact_match(right, " ".join(reversed(right.split(". "))))  # order
    assert not exact_match(right, right + " The red fox visited Paris on Monday.")  # extra
    assert not exact_match(right, "The red fox visited Paris on Monday.")  # missing
    # per-slot recall still credits the slots it gets right
    assert sum(sum(h.values()) for h in key_hits(keys, right.replace("Lima", "Oslo"))) == 7


def _outputs(tmp_path, variant, rows, keys=3):
    """A hand-made outputs/ folder: data.json of 12 small documents and hypotheses per row/seed."""
    flags = [
        "--variant",
        variant,
        "--holdout",
        "--min-gap",
        "300",
        "--min-keys",
        "2",
        "--max-keys",
        str(keys),
        "--min-tokens",
        "600",
        "--max-tokens",
        "900",
        "--seed",
        "3",
    ]
    folder = tmp_path / "outputs" / variant
    folder.mkdir(parents=True)
    (folder / "data.json").write_text(json.dumps({"flags": flags}))
    report = load_report()
    docs = report.scored_documents(str(folder / "data.json"), "test", 12)
    for row, make in rows.items():
        for seed in (1, 2):
            (folder / f"{row}.seed{seed}.txt").write_text("".join(make(d, seed) + "\n" for d in docs))
    return docs


def test_report_scores_raw_outputs_and_compares_with_the_control(tmp_path):
    docs = _outputs(
        tmp_path,
        "binding",
        {
            "local_8": lambda d, s: "",
            "lsg_norm": lambda d, s: d["summary"],
            # seed 1 right on every other document, seed 2 wrong on all: far slots missed
            "led": lambda d, s: (
                d["summary"]
                if s == 1 and int(d["id"].split("-")[-1]) % 2 == 0
                else d["summary"].replace(d["keys"][0]["animal"], "zebra")
            ),
        },
    )
    report = load_report()
    assert (
        report.main(
            [
                "--outputs",
                str(tmp_path / "outputs"),
                "--report-dir",
                str(tmp_path / "rep"),
                "--variants",
                "binding",
                "--rows",
                "local_8",
                "lsg_norm",
                "led",
                "--seeds",
                "1",
                "2",
                "--n-docs",
                "12",
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "rep" / "results.json").read_text())["variants"]["binding"]
    assert res["lsg_norm"]["exact"] == 1.0 and res["lsg_norm"]["exact_ci"] == [1.0, 1.0]
    assert res["local_8"]["exact"] == 0.0 and res["local_8"]["slot_recall"] == 0.0
    assert res["lsg_norm"]["beats_control"] is True and res["local_8"]["beats_control"] is None
    assert res["led"]["exact"] == pytest.approx(0.25) and res["led"]["exact_per_seed"] == [0.5, 0.0]
    lo, hi = res["led"]["exact_ci"]
    assert 0.0 <= lo < 0.25 < hi <= 0.5
    assert res["led"]["beats_control"] is True  # 25 points over 0, disjoint intervals
    assert res["lsg_norm"]["far_ci"] == [1.0, 1.0] and res["lsg_norm"]["far_above_control"] is True
    assert res["local_8"]["far_ci"] == [0.0, 0.0] and res["local_8"]["far_above_control"] is None
    far_total = sum(2 * len(d["keys"]) for d in docs)
    assert res["led"]["far_recall"] == pytest.approx(1 - (6 + 12) / (2 * far_total))  # one animal per wrong doc
    # lsg_norm writes the right bound animal every time; the control writes none
    assert res["lsg_norm"]["binding_choice"]["right_among_bound"] == 1.0
    assert res["local_8"]["binding_choice"]["bound_animal_written"] == 0.0
    pick = res["lsg_norm"]["binding_choice"]["random_bound_pick"]
    assert pick == pytest.approx(
        sum(1 / (len(d["keys"]) + 1) * len(d["keys"]) for d in docs) / sum(len(d["keys"]) for d in docs)
    )
    md = (tmp_path / "rep" / "results.md").read_text()
    assert "| LSG-BART (norm) at 4,096 | 100.0% [100.0%, 100.0%] | 100.0% / 100.0% | yes |" in md
    assert "do not edit by hand" in md


def test_report_refuses_missing_hypotheses(tmp_path, capsys):
    _outputs(tmp_path, "retrieval", {"local_8": lambda d, s: "", "lsg_norm": lambda d, s: d["summary"]})
    path = tmp_path / "outputs" / "retrieval" / "lsg_norm.seed2.txt"
    path.write_text("\n".join(path.read_text().split("\n")[:5]))
    assert (
        load_report().main(
            [
                "--outputs",
                str(tmp_path / "outputs"),
                "--report-dir",
                str(tmp_path / "rep"),
                "--variants",
                "retrieval",
                "--rows",
                "local_8",
                "lsg_norm",
                "--seeds",
                "1",
                "2",
                "--n-docs",
                "12",
            ]
        )
        == 2
    )
    assert "lsg_norm.seed2.txt: 5 hypotheses for 12 documents" in capsys.readouterr().err


def test_report_names_a_missing_or_bad_input_before_scoring(tmp_path, capsys):
    """A missing seed file, a variant without data.json, a data.json that is not JSON, --n-docs 0 and a
    --report-dir that is a file: one line each, nothing written (they were tracebacks, --n-docs 0 an
    empty table)."""
    _outputs(tmp_path, "retrieval", {"local_8": lambda d, s: "", "lsg_norm": lambda d, s: d["summary"]})
    (tmp_path / "outputs" / "binding").mkdir()
    (tmp_path / "a_file").write_text("x")
    common = ["--outputs", tmp_path / "outputs", "--rows", "local_8", "lsg_norm", "--n-docs", "12"]
    rep = ["--report-dir", tmp_path / "rep"]
    cases = {
        (*common, *rep, "--variants", "retrieval", "--seeds", "1", "3"): "--outputs (row 'local_8', seed 3): "
        f"file not found: {tmp_path / 'outputs' / 'retrieval' / 'local_8.seed3.txt'}",
        (*common, *rep, "--variants", "retrieval", "binding", "--seeds", "1"): "--outputs (variant 'binding'): "
        "file not found",
        (*common, "--report-dir", tmp_path / "a_file", "--variants", "retrieval", "--seeds", "1"): "--report-dir "
        f"{tmp_path / 'a_file'}: exists and is not a folder",
        (*common[:-1], "0", *rep, "--variants", "retrieval", "--seeds", "1"): "argument --n-docs: must be an "
        "integer >= 1, got '0'",
    }
    for argv, expected in cases.items():
        status, err = run_main(load_report(), argv, capsys)
        assert status == 2 and err.startswith("report.py: error: ") and err.count("\n") == 1, (argv, err)
        assert expected in err, (argv, err)
    data = tmp_path / "outputs" / "retrieval" / "data.json"
    data.write_text("{truncated")
    status, err = run_main(load_report(), (*common, *rep, "--variants", "retrieval", "--seeds", "1"), capsys)
    assert status == 2 and f"{data}: not the data.json run.sh writes" in err and err.count("\n") == 1, err
    assert not (tmp_path / "rep").exists()


def test_extract_refuses_a_malformed_generate_output_in_one_line(tmp_path, capsys):
    bad = tmp_path / "generate.out"
    bad.write_text("not fairseq-generate output\n")
    assert load_report().main(["extract", str(bad), "3", str(tmp_path / "hyp.txt")]) == 2
    assert (
        capsys.readouterr().err
        == f"report.py: error: {bad}: no H-/D- lines found; is this fairseq-generate output (without --quiet)?\n"
    )
    assert load_report().main(["extract", str(bad), "three", str(tmp_path / "hyp.txt")]) == 2
    assert capsys.readouterr().err == "report.py: error: extract N: must be an integer >= 1, got 'three'\n"


def test_control_row_cannot_mix_beyond_its_window(tmp_path):
    """local_8 (LED layers, --attention-window 8, no global token): an encoder output moves only when
    a token within 4 positions (per layer) changes."""
    from conftest import build_task_and_model, write_toy_dict

    argv = [
        write_toy_dict(tmp_path),
        "--task",
        "long_document_summarization",
        "--arch",
        "led_tiny",
        "--max-source-positions",
        "4096",
        "--attention-window",
        "8",
        "--global-attention",
        "none",
    ]
    model = build_task_and_model(argv)[1].eval()
    layers = len(model.encoder.layers)
    tokens = torch.randint(4, 40, (1, 600))
    tokens[0, -1] = 2
    changed = tokens.clone()
    changed[0, 300] = 41
    with torch.no_grad():
        a = model.encoder(tokens, src_lengths=torch.tensor([600]))["encoder_out"][0][:, 0]
        b = model.encoder(changed, src_lengths=torch.tensor([600]))["encoder_out"][0][:, 0]
    moved = ((a - b).abs().amax(-1) > 1e-6).nonzero().flatten()
    assert moved.min() >= 300 - 4 * layers and moved.max() <= 300 + 4 * layers
    assert 300 in moved.tolist()


def load_reach():
    return load_script("examples/long_range/reach.py", "long_range_reach", neighbours=False)


def test_reach_of_the_rows_one_layer(monkeypatch):
    """reach.py's one-layer reach (the table the README's rows cite) follows from each row's shape:
    +-4 for the control, +-16 for LED's window of 32, one LSG block on each side plus the sparse keys'
    span (32 keys, each of 2 tokens) for lsg_norm, everything for full attention, LOCOST and lsg_wide; and it
    moves when the shape does (a sparsity factor of 32 takes LSG past the binding's 1,024-word gap)."""
    monkeypatch.chdir(REPO)  # arch_flags is read from examples/long_context/common.sh
    reach = load_reach()
    got = {
        row: reach.measure(row, 2048, [1100], seed=1)["one_layer_reach"]
        for row in ("local_8", "led", "lsg_norm", "lsg_wide", "full_4096", "locost")
    }
    assert got["local_8"] == 4 and got["led"] == 16
    assert 2 * 32 <= got["lsg_norm"] < 2 * 32 + 2 * 32 < reach.FAR
    # from 1100 to position 1 (0 is left out: LED's global); lsg_wide's 128 sparse keys of 32 tokens reach it
    assert got["full_4096"] == got["locost"] == got["lsg_wide"] == 1099
    wide = reach.measure("lsg_norm", 2048, [1100], seed=1, extra=("--sparsity-factor", "32"))
    assert wide["one_layer_reach"] >= reach.FAR


def run_main(script, argv, capsys):
    """(exit status, stderr) of ``script.main(argv)``, argparse's refusals included."""
    try:
        status = script.main([str(a) for a in argv])
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err


def test_reach_refuses_bad_flags_before_measuring(tmp_path, capsys):
    """An input too short to change a token in, a probe before the first token, an --out below a file:
    one line each, before any model is built (they were an IndexError, a silently wrapped index, and
    a traceback from the write after minutes of measuring)."""
    reach = load_reach()
    (tmp_path / "file").write_text("x")
    cases = {
        ("--length", "0"): "argument --length: must be an integer >= 3, got '0'",
        ("--probes", "-5"): "argument --probes: must be an integer >= 1, got '-5'",
        ("--out", tmp_path / "file" / "reach"): "is a file, not a folder",
    }
    for argv, expected in cases.items():
        status, err = run_main(reach, argv, capsys)
        assert status == 2 and err.startswith("reach.py: error: ") and err.count("\n") == 1, (argv, err)
        assert expected in err, (argv, err)


def load_binding_flow():
    return load_script("examples/long_range/binding_flow.py", "long_range_binding_flow", neighbours=False)


def _flow_document():
    """A toy binding document in pieces: the key (moose, Nora) bound at 10, used 1,200 tokens later, a
    decoy name (owl, Pim) bound near the end; filler elsewhere. Returns (dictionary, tokens, key)."""
    from fairseq.data import Dictionary

    d = Dictionary()
    words = ["The", "silver", "brown", "is", "called", "visited", "avoided", "Tokyo", "on", "Monday", "Nora", "Pim"]
    words = ["\u2581" + w for w in words + list(ANIMALS)] + ["."] + [f"\u2581f{i}" for i in range(50)]
    for w in words:
        d.add_symbol(w)
    filler = [f"\u2581f{i % 50}" for i in range(1400)]
    bind = "\u2581The \u2581silver \u2581moose \u2581is \u2581called \u2581Nora .".split()
    decoy = "\u2581The \u2581brown \u2581owl \u2581is \u2581called \u2581Pim .".split()
    use = "\u2581Nora \u2581visited \u2581Tokyo \u2581on \u2581Monday .".split()
    pieces = filler[:10] + bind + filler[10:1210] + use + filler[1210:1300] + decoy + filler[1300:] + ["</s>"]
    key = {"name": "Nora", "animal": "moose", "colour": "silver"}
    return d, torch.tensor([d.index(p) for p in pieces]), key


def test_binding_flow_refuses_bad_inputs_in_one_line(tmp_path, capsys):
    """A --data without the split, a --checkpoints item that is not ROW=PATH or names no file, a
    checkpoint torch cannot read, a negative --far, an --out below a file: one line each, every path
    checked before the first checkpoint is measured (they were tracebacks, the last after the work)."""
    flow = load_binding_flow()
    data = tmp_path / "long"
    (data / "jsonl").mkdir(parents=True)
    (data / "bin").mkdir()
    (data / "jsonl" / "valid.jsonl").write_text("{}\n")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    (tmp_path / "file").write_text("x")
    ok = ["--data", data, "--checkpoints", f"a={junk}"]
    cases = {
        ("--data", tmp_path, "--checkpoints", f"a={junk}"): f"--data (the binding set's long/): file not found: "
        f"{tmp_path / 'jsonl' / 'valid.jsonl'}",
        ("--data", data, "--checkpoints", f"a={junk}", "lsg_norm"): "--checkpoints: expected ROW=PATH, got 'lsg_norm'",
        ("--data", data, "--checkpoints", f"a={junk}", "b=/no/such.pt"): "--checkpoints b: file not found: /no/such.pt",
        (*ok, "--far", "-1"): "argument --far: must be an integer >= 0, got '-1'",
        (*ok, "--out", tmp_path / "file" / "flow"): "is a file, not a folder",
        tuple(ok): str(junk),  # the checkpoint itself: lsg_fairseq's checkpoint_errors names it
    }
    for argv, expected in cases.items():
        status, err = run_main(flow, argv, capsys)
        assert status == 2 and err.startswith("binding_flow.py: error: ") and err.count("\n") == 1, (argv, err)
        assert expected in err, (argv, err)


def test_binding_flow_tells_routing_from_broadcast_and_locality(monkeypatch):
    """binding_flow.py's ratio on hand-made encoders: one that routes each bound animal to every mention of
    its name (the binding an encoder needs) scores far above 1; one that adds the document's mean to every
    position (a global token's broadcast) scores 1; one that mixes +-4 tokens leaves the use site still."""
    flow = load_binding_flow()
    d, tokens, key = _flow_document()
    table = torch.randn(len(d), 16, generator=torch.Generator().manual_seed(0))
    called = d.index("\u2581called")

    def routing(model, toks):
        out = table[toks].clone()
        for i in (toks == called).nonzero().flatten().tolist():
            out[toks == toks[i + 1]] += table[toks[i - 2]]  # every mention of the name hears its animal
        return out

    def broadcast(model, toks):
        return table[toks] + table[toks].mean(0)

    def local(model, toks):
        e = torch.nn.functional.pad(table[toks].T[None], (4, 4))
        return torch.nn.functional.avg_pool1d(e, 9, 1)[0].T

    got = {}
    for name, fn in (("routing", routing), ("broadcast", broadcast), ("local", local)):
        monkeypatch.setattr(flow, "encode", fn)
        got[name] = flow.probe_document(None, d, tokens, key)
    assert got["routing"]["gap"] >= flow.FAR
    assert got["routing"]["use"] > 100 * max(got["routing"]["baseline"], 1e-9)
    assert got["broadcast"]["use"] == pytest.approx(got["broadcast"]["baseline"], rel=1e-4)
    assert got["local"]["use"] == 0 and got["local"]["bind"] > 0


def test_order_flow_and_position_readout_on_hand_made_encoders(monkeypatch):
    """binding_flow.py --variant order: an encoder that marks every token with whether an arrival came
    before it moves the later arrival when the earlier one is taken away (forward >> 1) and not the other
    way; a +-4 mixer moves neither. The position readout finds an encoder that writes a token's index into
    its output (R^2 ~ 1) and not one whose outputs ignore position (R^2 ~ 0)."""
    flow = load_binding_flow()
    d, _, _ = _flow_document()
    arrive = "\u2581The \u2581{} \u2581arrived .".split()
    d.add_symbol("\u2581arrived")
    d.add_symbol("\u2581found")
    filler = [f"\u2581f{i % 50}" for i in range(1400)]
    pieces = (
        filler[:20]
        + [w.format("fox") for w in arrive]
        + filler[20:1200]
        + [w.format("owl") for w in arrive]
        + filler[1200:]
        + ["</s>"]
    )
    tokens = torch.tensor([d.index(p) for p in pieces])
    table = torch.randn(len(d), 16, generator=torch.Generator().manual_seed(1))
    arrived = d.index("\u2581arrived")

    def marks_what_came_before(model, toks):  # each arriving animal hears how many arrived before it
        seen = torch.cumsum((toks == arrived).float(), 0) * torch.roll(toks == arrived, -1)
        return table[toks] + 3 * seen[:, None] * table[arrived]

    def local(model, toks):
        e = torch.nn.functional.pad(table[toks].T[None], (4, 4))
        return torch.nn.functional.avg_pool1d(e, 9, 1)[0].T

    monkeypatch.setattr(flow, "encode", marks_what_came_before)
    forward, backward = (flow.probe_order(None, d, tokens, *p) for p in ((0, 1), (1, 0)))
    assert forward["gap"] >= flow.FAR and forward["use"] > 0 and forward["baseline"] == 0
    assert backward["use"] == 0  # nothing after the later arrival is ever taken into account
    monkeypatch.setattr(flow, "encode", local)
    assert flow.probe_order(None, d, tokens, 0, 1)["use"] == 0
    data = [{"source": tokens[: 900 + 40 * i]} for i in range(6)]
    monkeypatch.setattr(
        flow,
        "encode",
        lambda model, toks: torch.cat([table[toks], torch.arange(len(toks), dtype=torch.float)[:, None]], 1),
    )
    assert flow.position_readout(None, data, 6, 4096) == pytest.approx(1.0, abs=1e-6)
    monkeypatch.setattr(flow, "encode", lambda model, toks: table[toks])
    assert flow.position_readout(None, data, 6, 4096) < 0.2


def _run(tmp_path, **env):
    env = dict(
        os.environ,
        OUT=str(tmp_path / "out"),
        REPORT_DIR=str(tmp_path / "report"),
        VENV=os.path.dirname(os.path.dirname(sys.executable)),
        **env,
    )
    r = subprocess.run(["bash", os.path.join(HERE, "run.sh")], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp_path / "report" / "results.json").read_text())


@pytest.mark.parametrize(
    "keys, data, message",
    [
        ("3", ["--min-keys", "2", "--max-keys", "2"], "KEYS=3, but FIT_DATA="),
        ("two", ["--min-keys", "2", "--max-keys", "2"], "KEYS=two: expected a number"),
        ("2", ["--seed", "1"], "not run.sh's data.json with --min-keys/--max-keys"),
    ],
)
def test_regap_refuses_fit_data_without_thresholds_for_keys_before_decoding(tmp_path, keys, data, message):
    """A FIT_DATA drawn with other arrival counts than KEYS would fail at the report, after every
    checkpoint was decoded: refused first, in one line, nothing written."""
    fit = tmp_path / "data.json"
    fit.write_text(json.dumps({"flags": ["--variant", "order", *data]}))
    env = dict(os.environ, KEYS=keys, FIT_DATA=str(fit), VENV=os.path.dirname(os.path.dirname(sys.executable)))
    args = [str(tmp_path / "no_set"), str(tmp_path / "report"), f"locost={tmp_path / 'no.pt'}"]
    r = subprocess.run(["bash", os.path.join(HERE, "regap.sh"), *args], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.startswith("regap.sh: error: ") and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "report").exists()


def test_long_range_experiment_smoke(tmp_path):
    """The control and a long row on the order variant, a few updates: the script cannot rot, its raw
    outputs re-score to the same table, and regap.sh re-scores the order checkpoint on documents with
    their arrivals anywhere. run.sh does not depend on the variant; the other variants' documents and
    scoring are tested above, and retrieval runs end to end in CI through examples/long_context
    (test_lsg_reads_far_keys_that_truncated_bart_cannot). One variant keeps the suite's time."""
    res = _run(tmp_path, SMOKE="1", VARIANTS="order", ROWS="local_8 locost", SEEDS="2")
    assert set(res["variants"]) == {"order"}
    assert list(res["variants"]["order"]) == ["local_8", "position_only", "locost"]
    assert res["variants"]["order"]["position_only"]["rule_fitted_on"].startswith("the first 8 train documents")
    assert len(res["variants"]["order"]["locost"]["exact_per_seed"]) == 1
    assert (tmp_path / "report" / "outputs" / "order" / "local_8.seed2.txt").exists()
    assert "order_choice" in res["variants"]["order"]["locost"]
    again = tmp_path / "again"
    assert (
        load_report().main(
            [
                "--outputs",
                str(tmp_path / "report" / "outputs"),
                "--report-dir",
                str(again),
                "--variants",
                "order",
                "--rows",
                "local_8",
                "locost",
                "--seeds",
                "2",
                "--n-docs",
                "4",
                "--n-train",
                "8",
            ]
        )
        == 0
    )
    assert json.loads((again / "results.json").read_text())["variants"] == res["variants"]
    ckpt = tmp_path / "out" / "runs" / "order.locost.s2" / "checkpoint_last.pt"
    # binding_flow.py end to end on that checkpoint (its probes are tested on hand-made encoders below)
    flow = [str(a) for a in ("--data", tmp_path / "out" / "order" / "long", "--checkpoints", f"locost={ckpt}")]
    flow += ["--variant", "order", "--far", "0", "--out", str(tmp_path / "flow" / "order")]
    assert load_binding_flow().main(flow) == 0
    flow_rows = json.loads((tmp_path / "flow" / "order.json").read_text())
    assert list(flow_rows) == ["locost forward", "locost backward"] and flow_rows["locost forward"]["keys"] > 0
    assert "| `locost forward` |" in (tmp_path / "flow" / "order.md").read_text()
    r = subprocess.run(
        [
            "bash",
            os.path.join(HERE, "regap.sh"),
            str(tmp_path / "out" / "order" / "long"),
            str(tmp_path / "regap"),
            f"locost={ckpt}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(
            os.environ,
            N="3",
            WORK=str(tmp_path / "work"),
            N_TRAIN="8",
            FIT_DATA=str(tmp_path / "report" / "outputs" / "order" / "data.json"),
            VENV=os.path.dirname(os.path.dirname(sys.executable)),
        ),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    regap = json.loads((tmp_path / "regap" / "results.json").read_text())["variants"]["order"]
    assert regap["position_only"]["rule"] == res["variants"]["order"]["position_only"]["rule"]  # FIT_DATA's
    regap = regap["locost"]
    assert len((tmp_path / "regap" / "outputs" / "order" / "locost.seed1.txt").read_text().split("\n")) == 4
    assert 0 <= regap["exact"] <= 1
    docs = [json.loads(line) for line in open(tmp_path / "work" / "jsonl" / "valid.jsonl")]
    assert (
        len(docs) == 3
        and min(b["token_offset"] - a["token_offset"] for d in docs for a, b in zip(d["keys"], d["keys"][1:])) < 1024
    )  # placed anywhere
    # DATA_ONLY (gpu_pilot.sh's first step, by hand) on the same data: kept, and no report file written (it
    # wrote the outputs' data.json into REPORT_DIR, by default the committed examples/long_range/outputs)
    r = subprocess.run(
        ["bash", os.path.join(HERE, "run.sh")],
        env=dict(os.environ, OUT=str(tmp_path / "out"), REPORT_DIR=str(tmp_path / "data_only"), DATA_ONLY="1")
        | dict(SMOKE="1", VARIANTS="order", VENV=os.path.dirname(os.path.dirname(sys.executable))),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "order data: kept" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "data_only").exists()
    # examples/locost/retrieval_64k.sh on the same checkpoint, laid out as long_context/run.sh's OUT
    # (runs/locost, long/spm), with documents too short to hold a key past 4,096: its "n/a" row
    lc = tmp_path / "lc"
    (lc / "runs" / "locost").mkdir(parents=True)
    (lc / "long").mkdir()
    os.symlink(ckpt, lc / "runs" / "locost" / "checkpoint_last.pt")
    os.symlink(tmp_path / "out" / "order" / "long" / "spm", lc / "long" / "spm")
    table = tmp_path / "retrieval.md"
    env = dict(os.environ, OUT=str(lc), N_DOCS="2", WORDS="700", MAX_SRC="2048", REPORT=str(table))
    env["VENV"] = os.path.dirname(os.path.dirname(sys.executable))
    r = subprocess.run(
        ["bash", os.path.join(REPO, "examples", "locost", "retrieval_64k.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    md = table.read_text()
    assert "Key recall over 2 keys: " in md and "never seen in training): n/a (0 keys)" in md.replace("\n", " ")
    assert "| 0-8,192 | 8 |" in md and not (tmp_path / "retrieval.md.part").exists()
    # run.sh again on the same data (kept: its stamp matches), JOBS=2 rows at once with a MODEL_FLAGS
    # that fairseq-train refuses: both runs say why, the third row never starts, no report is written
    # (a failure in the last batch went unnoticed until the report's cp of a missing file)
    env = dict(os.environ, OUT=str(tmp_path / "out"), REPORT_DIR=str(tmp_path / "failed"), SMOKE="1")
    env.update(VENV=os.path.dirname(os.path.dirname(sys.executable)), VARIANTS="order", SEEDS="2", JOBS="2")
    env.update(ROWS="lsg_norm led bart_1024", MODEL_FLAGS="--encoder-layers x")
    r = subprocess.run(["bash", os.path.join(HERE, "run.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "order data: kept" in r.stderr, r.stderr[-3000:]
    for row in ("lsg_norm", "led"):
        log = tmp_path / "out" / "runs" / f"order.{row}.s2.short" / "train.log"
        assert f"run.sh: error: training order.{row}.s2.short failed; the end of {log}:" in r.stderr
    assert "argument --encoder-layers: invalid int value: 'x'" in r.stderr
    assert r.stderr.rstrip().endswith("run.sh: error: 2 run(s) failed (above); no report written")
    assert not (tmp_path / "out" / "runs" / "order.bart_1024.s2.short").exists()
    assert not (tmp_path / "failed" / "results.md").exists()


def test_count_variant_aggregates_mentions_spread_over_the_document():
    cfg = SyntheticConfig(variant="count", min_tokens=1300, max_tokens=1600, min_keys=2, max_keys=3)
    examples = list(make_split("test", 30, seed=2, cfg=cfg))
    for ex in examples:
        words = ex["document"].split()
        firsts = [k["token_offset"] for k in ex["keys"]]
        assert firsts == sorted(firsts)
        for k in ex["keys"]:
            assert 1 <= k["count"] <= MAX_COUNT and len(k["mentions"]) == k["count"]
            assert [i for i in range(len(words) - 1) if words[i : i + 2] == ["A", k["animal"]]] == k["mentions"]
        assert ex["summary"] == " ".join(f"The {k['animal']} was seen {k['count']} times." for k in ex["keys"])
        assert sum(len(k["mentions"]) for k in ex["keys"]) == sum(1 for w in words if w == "seen.")
    # the count's words never occur in filler
    filler_words = {w for ex in examples for s in _sentences(ex["document"]) if " was seen" not in s for w in s.split()}
    assert not filler_words & {"was", "seen", "times", *map(str, range(10))}
    # mentions do spread: most documents have an animal seen at least twice, 1,024+ words apart
    assert sum(any(k["mentions"][-1] - k["mentions"][0] >= 1024 for k in ex["keys"]) for ex in examples) >= 10
    keys = [{"animal": "fox", "count": 3}, {"animal": "owl", "count": 1}]
    assert count_hits(keys, "The fox was seen 3 times. The owl was seen 2 times.") == [
        {"animal": True, "count": True},
        {"animal": True, "count": False},
    ]
    assert count_hits(keys, "The owl was seen 1 times.")[1] == {"animal": False, "count": False}


def test_order_variant_needs_the_relation_of_far_arrivals():
    cfg = SyntheticConfig(variant="order", min_tokens=2200, max_tokens=2500, min_keys=2, max_keys=3, holdout=True)
    sets = {}
    for split in ("train", "test"):
        examples = list(make_split(split, 40, seed=4, cfg=cfg))
        sets[split] = {frozenset(k["animal"] for k in ex["keys"]) for ex in examples}
        for ex in examples:
            words = ex["document"].split()
            offsets = [k["token_offset"] for k in ex["keys"]]
            assert [i for i in range(len(words) - 2) if words[i + 2] == "arrived."] == offsets  # each arrives once
            assert [words[i + 1] for i in offsets] == [k["animal"] for k in ex["keys"]]
            assert all(b - a >= 1024 for a, b in zip(offsets, offsets[1:]))
            assert parse_order(ex["summary"]) == [k["animal"] for k in ex["keys"]]
    assert all(heldout_set(s) for s in sets["test"]) and not any(heldout_set(s) for s in sets["train"])
    assert not sets["train"] & sets["test"]
    # both orders of a pair occur in training: the set alone does not tell the order
    train = [tuple(k["animal"] for k in ex["keys"]) for ex in make_split("train", 400, 4, cfg) if len(ex["keys"]) == 2]
    assert any(p[::-1] in train for p in train)
    with pytest.raises(ValueError, match="too small for 3 arrivals"):
        SyntheticConfig(variant="order", min_tokens=2000, max_tokens=2500, max_keys=3).validate()
    with pytest.raises(ValueError, match="min_keys >= 2"):
        SyntheticConfig(variant="order", min_tokens=2200, max_tokens=2500, min_keys=1).validate()
    keys = [{"animal": "fox"}, {"animal": "owl"}, {"animal": "bear"}]
    right = "The fox arrived before the owl. The owl arrived before the bear."
    assert order_hits(keys, right) == [{"animal": True}] * 3
    assert order_hits(keys, "The owl arrived before the fox.") == [{"animal": False}] * 3
    assert order_hits(keys, "The fox arrived before the bear.") == [{"animal": True}, {"animal": False}] + [
        {"animal": False}
    ]


def _arrivals(*offsets):
    """A hand-made ``order`` example: only what the position-only rule reads (arrival offsets in words)."""
    return {"keys": [{"animal": a, "token_offset": o} for a, o in zip(("fox", "owl", "bear"), offsets)]}


def test_position_only_rule_ranks_each_arrival_by_its_own_offset():
    """The rule's thresholds fall between the training arrivals' bands; a test document whose arrivals
    lie in their bands is right, one whose first two arrivals both lie early is wrong, though the
    order of their offsets would tell (the rule never compares two arrivals)."""
    train = [_arrivals(100 + i, 1500 + i, 2900 + i) for i in range(0, 300, 10)]
    rule = fit_position_rule(train)
    ((t1, t2),) = [r["thresholds"] for r in rule.values()]
    assert list(rule) == [3] and rule[3]["train_exact"] == 1.0 and rule[3]["n_docs"] == 30
    assert 390 < t1 <= 1500 and 1790 < t2 <= 2900
    right, wrong, late = (_arrivals(300, 2000, 3200), _arrivals(50, 300, 3000), _arrivals(1700, 2950, 3300))
    scores = position_rule_scores([right, wrong, late], rule)
    assert [s["exact"] for s in scores] == [1.0, 0.0, 0.0]
    assert scores[1]["slots"] == [True, False, True]  # the second arrival lies in the first band
    assert scores[2]["slots"] == [False, False, True]
    # 2 arrivals: one threshold; the search is exact (every threshold tried by brute force agrees)
    import random

    rng = random.Random(4)
    docs = [_arrivals(a, a + rng.randint(1, 2000)) for a in (rng.randint(0, 2000) for _ in range(200))]
    fitted = fit_position_rule(docs)[2]
    pairs = [tuple(k["token_offset"] for k in d["keys"]) for d in docs]
    best = max(sum(a < t <= b for a, b in pairs) for t in range(0, 4100))
    assert fitted["train_exact"] * len(docs) == best
    (t,) = fitted["thresholds"]
    assert sum(d["keys"][0]["token_offset"] < t <= d["keys"][1]["token_offset"] for d in docs) == best
    with pytest.raises(ConfigError, match="no training document has 3 arrivals"):
        position_rule_scores([right], fit_position_rule(docs))


def test_seed_resampled_interval_widens_with_seed_variance():
    """Seed 1 right on every document, seed 2 wrong on every one: every document's pooled score is 0.5,
    so the document bootstrap sees no spread, and only the interval that also draws seeds does."""
    import random

    report = load_report()
    right = [{"exact": 1.0, "slots": [True], "far": [True]}] * 20
    wrong = [{"exact": 0.0, "slots": [False], "far": [False]}] * 20
    c = report.cell([right, wrong], random.Random(0), random.Random(1))
    assert c["exact"] == 0.5 and c["exact_ci"] == [0.5, 0.5]
    assert c["exact_ci_seeds"] == [0.0, 1.0]
    again = report.cell([right, wrong], random.Random(0), random.Random(1))
    assert again == c  # seeded: the same intervals every time


def test_report_tells_order_from_copying(tmp_path):
    swap = lambda d, s: "The {1} arrived before the {0}.".format(*(k["animal"] for k in d["keys"]))  # noqa: E731
    docs = _outputs(
        tmp_path,
        "order",
        {"local_8": lambda d, s: swap(d, s) if s == 1 else d["summary"], "locost": lambda d, s: d["summary"]},
        keys=2,
    )
    report = load_report()
    assert (
        report.main(
            [
                "--outputs",
                str(tmp_path / "outputs"),
                "--report-dir",
                str(tmp_path / "rep"),
                "--variants",
                "order",
                "--rows",
                "local_8",
                "locost",
                "--seeds",
                "1",
                "2",
                "--n-docs",
                "12",
                "--n-train",
                "200",
                "--trained-at",
                "abc1234",
                "--machine",
                "a toaster",
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "rep" / "results.json").read_text())
    res = results["variants"]["order"]
    assert len(docs) == 12 and res["locost"]["exact"] == 1.0 and res["local_8"]["exact"] == 0.5
    assert res["local_8"]["order_choice"] == {"right_animals": 1.0, "right_order_among_those": 0.5, "random_order": 0.5}
    assert res["local_8"]["slot_recall"] == 0.5 and res["locost"]["far_recall"] == 1.0
    assert res["locost"]["beats_control"] is True
    # the control's seeds disagree completely (0% and 100%): with seeds resampled its interval is [0, 1]
    assert res["local_8"]["exact_ci_seeds"] == [0.0, 1.0] and res["locost"]["beats_control_seeds"] is False
    # the position-only row, after the control: fitted on the same flags' train split, scored like a row
    assert list(res) == ["local_8", "position_only", "locost"]
    ref = res["position_only"]
    train = report.scored_documents(str(tmp_path / "outputs" / "order" / "data.json"), "train", 200)
    assert ref["rule"] == {str(n): r for n, r in fit_position_rule(train).items()}
    expected = [
        float(
            all(
                band(k["token_offset"], ref["rule"][str(len(d["keys"]))]["thresholds"]) == i
                for i, k in enumerate(d["keys"])
            )
        )
        for d in docs
    ]
    assert ref["exact"] == pytest.approx(sum(expected) / 12) and ref["exact_per_seed"] == [ref["exact"]]
    # where the run came from, and who scored it
    assert (results["trained_at"], results["machine"]) == ("abc1234", "a toaster")
    md = (tmp_path / "rep" / "results.md").read_text()
    assert "trained and decoded at commit abc1234 on a toaster" in md and "Scored by report.py at commit" in md
    assert "| position only: each arrival ranked by its own word offset (no model) |" in md
    # re-scoring keeps the run's stamp
    assert (
        report.main(
            [
                "--outputs",
                str(tmp_path / "outputs"),
                "--report-dir",
                str(tmp_path / "again"),
                "--variants",
                "order",
                "--rows",
                "local_8",
                "locost",
                "--seeds",
                "1",
                "2",
                "--n-docs",
                "12",
                "--n-train",
                "200",
                "--provenance-from",
                str(tmp_path / "rep" / "results.json"),
            ]
        )
        == 0
    )
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert {k: again[k] for k in ("trained_at", "machine", "command")} == {
        k: results[k] for k in ("trained_at", "machine", "command")
    }
    assert again["variants"] == results["variants"]
