"""The whole pipeline through the real command lines, as a user runs it, in a temp dir:

JSONL -> scripts (parallel text, sentencepiece, preprocess) -> fairseq-train (ROUGE validation,
tensorboard) -> resume -> fairseq-generate -> ROUGE report -> lsg-fairseq-summarize on an input
longer than 1,024 tokens. No environment variable makes checkpoints loadable: the plugin does.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import BIN, DOCUMENTS, REPO_ROOT

SCRIPTS = os.path.join(REPO_ROOT, "scripts")
MAX_SRC = 2048

TINY = [
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--encoder-embed-dim",
    "32",
    "--decoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "64",
    "--decoder-ffn-embed-dim",
    "64",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
]


def run(cmd, cwd, **kw):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{cmd[0]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    work = tmp_path_factory.mktemp("e2e")
    py = sys.executable
    # 1. JSONL -> parallel text (a subset of SumPubMed; its documents are ~4K words)
    jsonl = work / "jsonl"
    jsonl.mkdir()
    for split, n in (("train", 16), ("valid", 4), ("test", 3)):
        with (
            open(os.path.join(DOCUMENTS, "sumpubmed", f"{split}.jsonl")) as f,
            open(jsonl / f"{split}.jsonl", "w") as g,
        ):
            for _, line in zip(range(n), f):
                g.write(line)
    run([py, f"{SCRIPTS}/jsonl_to_parallel.py", "--input-dir", jsonl, "--output-dir", work / "raw"], work)
    # 2. sentencepiece (trained offline on the training split) and encoding
    run(
        [
            py,
            f"{SCRIPTS}/spm_train.py",
            "--inputs",
            work / "raw/train.source",
            work / "raw/train.target",
            "--model-prefix",
            work / "spm/spm",
            "--vocab-size",
            "600",
            "--soft-vocab-limit",
        ],
        work,
    )
    for split in ("train", "valid", "test"):
        run(
            [
                py,
                f"{SCRIPTS}/spm_encode.py",
                "--model",
                work / "spm/spm.model",
                "--inputs",
                work / f"raw/{split}.source",
                work / f"raw/{split}.target",
                "--outputs",
                work / f"bpe/{split}.source",
                work / f"bpe/{split}.target",
            ],
            work,
        )
    # 3. binarize with the sentencepiece-consistent dictionary
    run(
        [
            "bash",
            f"{SCRIPTS}/preprocess.sh",
            "--trainpref",
            work / "bpe/train",
            "--validpref",
            work / "bpe/valid",
            "--testpref",
            work / "bpe/test",
            "--destdir",
            work / "bin",
            "--dict",
            work / "spm/dict.txt",
        ],
        work,
    )
    # 4. train a few updates with ROUGE validation and tensorboard
    train_cmd = [
        "fairseq-train",
        work / "bin",
        "--user-dir",
        os.path.join(REPO_ROOT, "lsg_fairseq"),
        "--task",
        "long_document_summarization",
        "--arch",
        "bart_base",
        *TINY,
        "--max-source-positions",
        str(MAX_SRC),
        "--max-target-positions",
        "512",
        "--truncate-target",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--max-tokens",
        "6000",
        "--required-batch-size-multiple",
        "1",
        "--max-update",
        "4",
        "--validate-interval-updates",
        "4",
        "--save-interval-updates",
        "4",
        "--eval-rouge",
        "--eval-rouge-bpe",
        "sentencepiece",
        "--eval-rouge-sentencepiece-model",
        work / "spm/spm.model",
        "--eval-rouge-args",
        '{"beam": 2, "max_len_b": 20, "no_repeat_ngram_size": 3}',
        "--best-checkpoint-metric",
        "rougeL",
        "--maximize-best-checkpoint-metric",
        "--tensorboard-logdir",
        work / "tb",
        "--save-dir",
        work / "ckpt",
        "--cpu",
        "--num-workers",
        "0",
        "--log-format",
        "simple",
        "--log-interval",
        "1",
        "--seed",
        "1",
    ]
    train_log = run(train_cmd, work)
    # 5. resume from checkpoint_last.pt (torch >= 2.6 weights_only loading, no env var)
    resume_cmd = [c if c != "4" else "6" for c in train_cmd]
    resume_log = run(resume_cmd, work)
    # 6. generate with beam search and score
    gen_log = run(
        [
            "fairseq-generate",
            work / "bin",
            "--user-dir",
            os.path.join(REPO_ROOT, "lsg_fairseq"),
            "--task",
            "long_document_summarization",
            "--path",
            work / "ckpt/checkpoint_best.pt",
            "--gen-subset",
            "test",
            "--beam",
            "3",
            "--max-len-b",
            "30",
            "--no-repeat-ngram-size",
            "3",
            "--max-source-positions",
            str(MAX_SRC),
            "--max-target-positions",
            "512",
            "--truncate-target",
            "--bpe",
            "sentencepiece",
            "--sentencepiece-model",
            work / "spm/spm.model",
            "--batch-size",
            "2",
            "--cpu",
        ],
        work,
    )
    (work / "gen.out").write_text(gen_log)
    rouge_out = run(
        [
            py,
            f"{SCRIPTS}/generate_to_rouge.py",
            "--generate-output",
            work / "gen.out",
            "--ref-file",
            work / "raw/test.target",
            "--output-dir",
            work / "eval",
        ],
        work,
    )
    return dict(work=work, train_log=train_log, resume_log=resume_log, gen_log=gen_log, rouge_out=rouge_out)


def test_training_log_has_truncation_count_and_rouge(pipeline):
    log = pipeline["train_log"]
    assert "[train] truncated" in log and "[valid] truncated" in log
    counts = [line for line in log.splitlines() if "[train] truncated" in line][0]
    assert "truncated 0 of" not in counts  # ~4K-word documents exceed 2,048 pieces
    valid_lines = [line for line in log.splitlines() if "| valid on" in line]
    assert valid_lines and all(f" {k} " in valid_lines[-1] for k in ("rouge1", "rouge2", "rougeL", "rougeLsum"))
    assert os.path.exists(pipeline["work"] / "ckpt/checkpoint_best.pt")
    events = [f for _, _, fs in os.walk(pipeline["work"] / "tb") for f in fs if f.startswith("events.out.tfevents")]
    assert events


def test_resume_continues_from_last_checkpoint(pipeline):
    log = pipeline["resume_log"]
    assert "checkpoint_last.pt (epoch" in log and "@ 4 updates)" in log  # loaded, weights_only-safe
    assert "num_updates 6" in log  # and trained on to the new --max-update


def test_generate_and_rouge_report(pipeline):
    work = pipeline["work"]
    assert sum(1 for line in pipeline["gen_log"].splitlines() if line.startswith("D-")) == 3
    report = json.loads((work / "eval/rouge.json").read_text())
    assert report["n"] == 3
    for k in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert 0.0 <= report[k] <= 100.0
    assert len((work / "eval/hyp.txt").read_text().splitlines()) == 3


def model_folder(work, tmp_path):
    """What lsg-fairseq-summarize and the hub read: model.pt, dict.txt, spm.model in one folder."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(work / "ckpt/checkpoint_best.pt", model_dir / "model.pt")
    shutil.copy(work / "spm/dict.txt", model_dir / "dict.txt")
    shutil.copy(work / "spm/spm.model", model_dir / "spm.model")
    return model_dir


def test_summarize_command_reads_past_1024_tokens(pipeline, tmp_path):
    work = pipeline["work"]
    model_dir = model_folder(work, tmp_path)
    docs = (work / "raw/test.source").read_text().splitlines()[:2]
    (tmp_path / "docs.txt").write_text("\n".join(docs) + "\n")
    out = run(
        [
            os.path.join(BIN, "lsg-fairseq-summarize"),
            model_dir,
            "--input-lines",
            tmp_path / "docs.txt",
            "--output",
            tmp_path / "sum.txt",
            "--beam",
            "2",
            "--max-len-b",
            "10",
        ],
        tmp_path,
    )
    summaries = (tmp_path / "sum.txt").read_text().splitlines()
    assert len(summaries) == 2 and all(s.strip() for s in summaries)
    assert "[2/2]" in out

    # The hub keeps max_source_positions (2,048 here), not fairseq's min(source, target) - 2.
    sys.path.insert(0, REPO_ROOT)
    from lsg_fairseq.models.hub import from_pretrained

    hub = from_pretrained(str(model_dir))
    tokens = hub.encode(docs[0])
    assert len(tokens) == MAX_SRC
    assert (
        tokens[0].item() == hub.task.source_dictionary.bos() and tokens[-1].item() == hub.task.source_dictionary.eos()
    )
    first, second = hub.sample(docs[:1], beam=2, max_len_b=5), hub.sample(docs[:1], beam=1, max_len_b=5)
    assert len(first) == len(second) == 1  # beam 2 then beam 1 used to crash (fairseq#3893)


def test_hub_ignores_training_batch_limits_and_takes_max_source_positions(pipeline, tmp_path):
    """The checkpoint's --max-tokens must not cap inference batches; --max-source-positions can shrink."""
    work = pipeline["work"]
    model_dir = model_folder(work, tmp_path)
    from lsg_fairseq.models.hub import from_pretrained

    import torch

    state = torch.load(model_dir / "model.pt", weights_only=False)
    state["cfg"]["dataset"]["max_tokens"] = 100  # as if trained with --max-tokens 100
    torch.save(state, model_dir / "model.pt")
    doc = (work / "raw/test.source").read_text().splitlines()[0]
    hub = from_pretrained(str(model_dir))
    assert len(hub.encode(doc)) == MAX_SRC > 100
    assert len(hub.sample([doc], beam=1, max_len_b=3)) == 1  # used to fail: lengths exceed max_tokens

    (tmp_path / "doc.txt").write_text(doc + "\n")
    run(
        [
            os.path.join(BIN, "lsg-fairseq-summarize"),
            model_dir,
            "--output",
            tmp_path / "s.txt",
            "--beam",
            "1",
            "--max-len-b",
            "3",
            "--max-source-positions",
            "512",
            tmp_path / "doc.txt",  # a FILE after the options (argparse's parse_args refused it)
        ],
        tmp_path,
    )
    assert len((tmp_path / "s.txt").read_text().splitlines()) == 1
    hub.set_max_source_positions(512)
    assert len(hub.encode(doc)) == 512
    with pytest.raises(ValueError, match="position table holds 2048") as e:
        hub.set_max_source_positions(4096)  # BART-family: needs lsg-fairseq-convert first
    # the command names the file the hub read (it said MODEL_DIR/model.pt; checkpoint_policy.longer_positions_hint)
    assert f"`lsg-fairseq-convert {model_dir / 'model.pt'} OUT_DIR " in str(e.value), e.value
