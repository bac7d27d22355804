"""benchmarks/attention_floor.py: its kernel call scores every query once, its command runs end to
end on a tiny length (its plumbing, not its speed), and a length it would score in part is refused."""

import json

import pytest
import torch

from conftest import load_script

pytestmark = pytest.mark.usefixtures("single_thread")

floor = load_script("benchmarks/attention_floor.py", "attention_floor")


@pytest.mark.parametrize("tokens,keys,per_block", [(512, 161, 32), (512, 65, 256), (1024, 641, 128)])
def test_a_kernel_call_scores_every_query_once_against_its_keys(monkeypatch, tokens, keys, per_block):
    seen = []

    def fake(q, k, v, scale):
        assert q.shape[0] == k.shape[0] == v.shape[0] and k.shape[2] == keys  # a key block per query block
        assert q.shape[1:] == (12, per_block, 64) and scale == 64**-0.5
        seen.append(q.shape[0] * per_block)
        return torch.empty(0)

    monkeypatch.setattr(floor, "FLASH", fake)
    # a buffer of 3 key blocks: the call must loop over chunks, the last one short where it divides unevenly
    floor.kernel_call(tokens, keys, per_block, buffer_elems=3 * keys * 12 * 64)()
    assert sum(seen) == tokens and max(seen) <= 3 * per_block


def test_the_command_writes_its_table_and_json(tmp_path):
    out = tmp_path / "floor"
    floor.main(
        ["--lengths", "256", "--rounds", "1", "--block-size", "32", "--sparse-block-size", "32"]
        + ["--attention-window", "64", "--threads", "1", "--out", str(out)]
    )
    result = json.loads((tmp_path / "floor.json").read_text())
    (row,) = result["results"]
    assert row["length"] == 256 and row["linear_s"] > 0 and row["gemm_gflops"] > 0
    assert row["archs"]["lsg_norm"]["keys_per_query"] == 1 + 2 * 32 + 3 * 32
    assert row["archs"]["led"]["keys_per_query"] == 65
    for a in row["archs"].values():
        assert a["floor_ratio_kernel"] > 1 and a["floor_ratio_products_at_gemm_rate"] > 1
    md = (tmp_path / "floor.md").read_text()
    assert "--lengths 256" in md and "| 256 | lsg_norm | 161 |" in md and "| 256 | led | 65 |" in md


@pytest.mark.parametrize("lengths", [["300"], ["256", "384"], ["0"]])
def test_a_length_it_would_score_in_part_is_refused(tmp_path, capsys, lengths):
    with pytest.raises(SystemExit):
        floor.main(["--lengths", *lengths, "--block-size", "128", "--out", str(tmp_path / "floor")])
    assert "--lengths" in capsys.readouterr().err and not list(tmp_path.iterdir())
