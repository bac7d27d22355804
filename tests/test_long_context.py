"""examples/long_context: key-recall scoring, the tiny archs' init and the attention probe's rows (the whole
experiment runs in test_long_context_claim.py)."""

import json

import pytest

from lsg_text.synthetic import (
    FIELDS,
    SyntheticConfig,
    chance_recall,
    key_hits,
    make_split,
    parse_key_sentences,
    summary_from_facts,
)

from test_scripts import load_script


def test_key_hits_slot_by_slot_in_rank_order():
    refs = [
        dict(colour="red", animal="fox", city="Paris", weekday="Monday"),
        dict(colour="blue", animal="owl", city="Lima", weekday="Friday"),
    ]
    hyp = "The red fox visited Oslo on Monday. The blue owl visited Lima on Friday."
    assert key_hits(refs, hyp) == [
        dict(colour=True, animal=True, city=False, weekday=True),
        dict(colour=True, animal=True, city=True, weekday=True),
    ]
    # ranks matter: the same sentences swapped are misses; a missing sentence scores nothing
    swapped = "The blue owl visited Lima on Friday. The red fox visited Paris on Monday."
    assert sum(sum(h.values()) for h in key_hits(refs, swapped)) == 0
    assert key_hits(refs, "The red fox visited Paris on Monday.")[1] == dict.fromkeys(FIELDS, False)
    # any word in a slot parses (a wrong word is a miss, not an unparsed sentence)
    assert parse_key_sentences("The zzz fox visited Paris on Mondayy.") == [
        dict(colour="zzz", animal="fox", city="Paris", weekday="Mondayy")
    ]
    assert 0.08 < chance_recall() < 0.09


def test_the_reference_summary_recalls_everything():
    for ex in make_split("test", 20, seed=3, cfg=SyntheticConfig(min_tokens=200, max_tokens=400)):
        facts = [{f: k[f] for f in FIELDS} for k in ex["keys"]]
        assert ex["summary"] == summary_from_facts(facts)
        assert all(all(h.values()) for h in key_hits(ex["keys"], ex["summary"]))


def test_key_recall_script_bins_and_positions(tmp_path):
    examples = list(make_split("test", 6, seed=4, cfg=SyntheticConfig(min_tokens=300, max_tokens=2500)))
    jsonl = tmp_path / "test.jsonl"
    jsonl.write_text("".join(json.dumps(ex) + "\n" for ex in examples))
    # example 0 right, example 1 absent, the others get the first key's sentence only
    lines = [f"D-0\t-0.1\t{examples[0]['summary']}"]
    for i, ex in enumerate(examples[2:], start=2):
        k = ex["keys"][0]
        lines.append(f"D-{i}\t-0.1\tThe {k['colour']} {k['animal']} visited {k['city']} on {k['weekday']}.")
    gen = tmp_path / "gen.out"
    gen.write_text("\n".join(lines) + "\n")
    out = tmp_path / "recall.json"
    mod = load_script("key_recall.py")
    assert (
        mod.main(
            [
                "--jsonl",
                str(jsonl),
                "--generate-output",
                str(gen),
                "--bin-size",
                "500",
                "--beyond",
                "1000",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rep = json.loads(out.read_text())
    keys = [(k["token_offset"], i, r) for i, ex in enumerate(examples) for r, k in enumerate(ex["keys"])]
    hit = [(off, i == 0 or (i >= 2 and r == 0)) for off, i, r in keys]
    assert rep["keys"] == len(keys)
    assert rep["recall"] == pytest.approx(sum(h for _, h in hit) / len(hit))
    far = [h for off, h in hit if off >= 1000]
    assert rep["keys_beyond"] == len(far)
    assert rep["recall_beyond"] == pytest.approx(sum(far) / len(far))
    for b in rep["bins"]:
        inside = [h for off, h in hit if b["start"] <= off < b["end"]]
        assert b["facts"] == 4 * len(inside) and b["recall"] == pytest.approx(sum(inside) / len(inside))


def test_key_recall_refuses_a_file_without_keys(tmp_path, capsys):
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text(json.dumps({"document": "a b", "summary": "c"}) + "\n")
    gen = tmp_path / "gen.out"
    gen.write_text("D-0\t-1\tThe red fox visited Paris on Monday.\n")
    assert load_script("key_recall.py").main(["--jsonl", str(jsonl), "--generate-output", str(gen)]) == 2
    assert "no 'keys' list" in capsys.readouterr().err


def test_key_recall_refuses_a_negative_beyond(capsys):
    # a negative position would count every key as "beyond" and report it as such
    with pytest.raises(SystemExit) as e:
        load_script("key_recall.py").main(["--jsonl", "x", "--generate-output", "y", "--beyond", "-1"])
    assert e.value.code == 2
    assert "--beyond" in capsys.readouterr().err


def _build(folder, arch, *extra):
    from conftest import build_task_and_model, write_toy_dict

    argv = [write_toy_dict(folder), "--task", "long_document_summarization", "--arch", arch, *extra]
    return build_task_and_model(argv)[1]


@pytest.mark.parametrize("arch", ["bart_tiny", "lsg_bart_tiny", "led_tiny"])
def test_tiny_archs_start_from_fan_in_weights(tmp_path, arch):
    # BART's N(0, 0.02) at d = 64 stalls learning to use the encoder (examples/long_context/README.md)
    model = _build(tmp_path, arch)
    q = model.decoder.layers[0].encoder_attn.q_proj.weight
    emb = model.encoder.embed_tokens.weight
    assert abs(q.std().item() - 64**-0.5) < 0.01, q.std()
    assert abs(emb[4:].std().item() - 64**-0.5) < 0.01
    fc2 = model.encoder.layers[0].fc2.weight  # fan_in 256
    assert abs(fc2.std().item() - 256**-0.5) < 0.005
    bert = _build(tmp_path, arch, "--weight-init", "bert")
    assert abs(bert.decoder.layers[0].encoder_attn.q_proj.weight.std().item() - 0.02) < 0.002


def test_attention_probe_gives_each_checkpoint_its_own_file(tmp_path, capsys):
    """Several checkpoints in one process (run.sh's probe_queued): a checkpoint that cannot be read
    leaves {} in its own file, names itself, and the others still run; --out must match in number."""
    from conftest import load_script as load

    probe = load("examples/long_context/attention_probe.py", "attention_probe")
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    with pytest.raises(SystemExit) as e:
        probe.main([str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), str(tmp_path), "--out", str(outs[0])])
    assert e.value.code == 2 and "--out: 1 files for 2 checkpoints" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # nothing probed: every reading would be 0 / 0
        probe.main([str(tmp_path / "a.pt"), str(tmp_path), "-n", "0"])
    assert e.value.code == 2 and "must be an integer >= 1" in capsys.readouterr().err
    argv = [str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), str(tmp_path), "--out", *map(str, outs)]
    assert probe.main(argv) == 1
    err = capsys.readouterr().err
    assert all(f"attention_probe.py: {tmp_path / name}: " in err for name in ("a.pt", "b.pt")), err
    assert [json.loads(o.read_text()) for o in outs] == [{}, {}]


def test_report_refuses_an_out_with_no_evaluation(tmp_path, capsys):
    """report.py with a mistyped --out (run.sh's output folder): one usage line, and --report-dir (by
    default the committed results beside it) untouched; it wrote an all-n/a report there, exit 0."""
    from conftest import load_script as load_repo_script

    report = load_repo_script("examples/long_context/report.py", "long_context_report", neighbours=False)
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    (report_dir / "results.md").write_text("the committed table\n")
    (tmp_path / "out" / "eval" / "lsg_norm").mkdir(parents=True)  # a row of another --archs
    for out in (tmp_path / "nowhere", tmp_path / "out"):
        with pytest.raises(SystemExit) as exit_:
            report.main(["--out", str(out), "--report-dir", str(report_dir), "--archs", "bart_1024"])
        assert exit_.value.code == 2
        assert f"error: --out {out}: no evaluation of run.sh there" in capsys.readouterr().err
    assert [p.name for p in report_dir.iterdir()] == ["results.md"]
    assert (report_dir / "results.md").read_text() == "the committed table\n"


def test_summary_names_what_its_out_lacks(tmp_path, capsys):
    """summary.py (make demo's last words) on an OUT that is not a finished run.sh OUT, or with a row
    the report lacks: one line naming the file or flag (they were FileNotFoundError and KeyError
    tracebacks)."""
    from conftest import load_script as load_repo_script

    summary = load_repo_script("examples/long_context/summary.py", "long_context_summary", neighbours=False)
    out = tmp_path / "out"
    (out / "report").mkdir(parents=True)

    def refusal(*argv):
        assert summary.main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("summary.py: error: ") and err.count("\n") == 1, err
        return err

    results = out / "report" / "results.json"
    assert f"OUT (not a finished run.sh OUT?): file not found: {results}" in refusal(out)
    results.write_text("{not json")
    assert f"{results}: not a report.py results.json" in refusal(out)
    results.write_text(json.dumps({"rows": [{"name": "lsg_norm"}, {"name": "bart_1024"}]}))
    assert f"--model lsg_nrom: no such row in {results} (rows there: lsg_norm, bart_1024)" in refusal(
        out, "--model", "lsg_nrom"
    )
    assert f"OUT (no test split): file not found: {out / 'long' / 'jsonl' / 'test.jsonl'}" in refusal(out)
    (out / "long" / "jsonl").mkdir(parents=True)
    (out / "long" / "jsonl" / "test.jsonl").write_text("")
    assert "OUT (no evaluation of lsg_norm): file not found" in refusal(out)
