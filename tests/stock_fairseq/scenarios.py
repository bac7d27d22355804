"""Stock fairseq scenarios, run with or without ``import lsg_fairseq`` first; writes what happened as JSON.

    python tests/stock_fairseq/scenarios.py OUT.json [--plugin]

Each scenario is a stock fairseq workflow of fairseq 0.12's own test suite (named in its
docstring), on a tiny translation set; see README.md beside this file for why these were
written here instead of copied. ``tests/test_stock_fairseq.py`` runs this twice and compares.
Run from an empty folder: ``--restore-file x.pt`` must name a file that does not exist.
"""

import contextlib
import json
import logging
import os
import random
import sys
import tempfile

LANGS = ["--source-lang", "in", "--target-lang", "out"]
TINY = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "8", "--decoder-embed-dim", "8"]


def make_data(root: str) -> str:
    """Seeded random letter sentences (target = source reversed), binarized with one dictionary."""
    from fairseq import options
    from fairseq_cli import preprocess

    rng = random.Random(0)
    raw = os.path.join(root, "raw")
    os.makedirs(raw)
    for split, n in (("train", 24), ("valid", 8), ("test", 8)):
        lines = [" ".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(3, 12))) for _ in range(n)]
        with open(os.path.join(raw, f"{split}.in"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(raw, f"{split}.out"), "w") as f:
            f.write("\n".join(" ".join(reversed(line.split())) for line in lines) + "\n")
    data = os.path.join(root, "bin")
    args = options.get_preprocessing_parser().parse_args(
        [
            *LANGS,
            "--trainpref",
            f"{raw}/train",
            "--validpref",
            f"{raw}/valid",
            "--testpref",
            f"{raw}/test",
            "--destdir",
            data,
            "--joined-dictionary",
            "--workers",
            "1",
        ]
    )
    preprocess.main(args)
    return data


@contextlib.contextmanager
def json_logs():
    """Collect fairseq's ``--log-format json`` entries: {"train": [...], "valid": [...], ...}."""
    entries = {}

    class Collect(logging.Handler):
        def emit(self, record):
            if record.name in ("train", "valid", "train_inner"):
                entries.setdefault(record.name, []).append(json.loads(record.getMessage()))

    handler = Collect(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        yield entries
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def train(data, save_dir, flags):
    """fairseq-train as its cli_main runs it (call_main), for a tiny transformer; returns its logs."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train as train_cli

    argv = [
        data,
        "--task",
        "translation",
        *LANGS,
        "--arch",
        "transformer_iwslt_de_en",
        *TINY,
        "--optimizer",
        "nag",
        "--lr",
        "0.05",
        "--max-tokens",
        "500",
        "--max-epoch",
        "1",
        "--seed",
        "1",
        "--no-progress-bar",
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--num-workers",
        "0",
        "--distributed-world-size",
        "1",
        "--cpu",
        "--save-dir",
        save_dir,
        *flags,
    ]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    with json_logs() as logs:
        distributed_utils.call_main(cfg, train_cli.main)
    return logs


def losses(logs):
    return {
        "train_loss": logs["train"][-1]["train_loss"],
        "valid_loss": logs["valid"][-1]["valid_loss"],
        "num_updates": logs["train"][-1]["train_num_updates"],
    }


def activation_checkpointing(data, work):
    """test_binaries.py::TestActivationCheckpointing: --checkpoint-activations and
    --offload-activations leave the metrics unchanged; fairseq passes ``--restore-file x.pt``
    (no such file) there to mean "start fresh"."""
    flags = ["--restore-file", "x.pt", "--max-update", "2"]
    runs = {
        name: losses(train(data, os.path.join(work, name), flags + extra))
        for name, extra in (
            ("baseline", []),
            ("checkpointed", ["--checkpoint-activations"]),
            ("offloaded", ["--offload-activations"]),
        )
    }
    assert runs["checkpointed"] == runs["baseline"] == runs["offloaded"], runs
    return runs


def train_generate_resume(data, work):
    """test_binaries.py::TestTranslation::test_transformer (train, generate) and
    test_checkpoint_utils.py::test_load_model_ensemble_and_task; then the run resumes from
    checkpoint_last.pt for a second epoch (test_train.py's checkpoint restore)."""
    from fairseq import checkpoint_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import generate

    first = losses(train(data, work, []))
    files = sorted(os.listdir(work))
    argv = [
        data,
        *LANGS,
        "--path",
        os.path.join(work, "checkpoint_last.pt"),
        "--beam",
        "3",
        "--nbest",
        "2",
        "--max-len-b",
        "6",
        "--batch-size",
        "3",
        "--cpu",
        "--results-path",
        os.path.join(work, "gen"),
    ]
    generate.main(convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_generation_parser(), argv)))
    with open(os.path.join(work, "gen", "generate-test.txt")) as f:
        hypotheses = sorted(line.rstrip("\n") for line in f if line.startswith(("H-", "P-")))
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([os.path.join(work, "checkpoint_last.pt")])
    resumed = train(data, work, ["--max-epoch", "2"])
    return {
        "first": first,
        "files": files,
        "hypotheses": hypotheses,
        "seed": cfg.common.seed,
        "parameters": sum(p.numel() for p in models[0].parameters()),
        "resumed": {"epoch": resumed["train"][-1]["epoch"], **losses(resumed)},
    }


def bart_beam_state(data, work):
    """test_sequence_generator.py territory: what fairseq's own SequenceGenerator leaves on a stock
    BART (fairseq#3893: the beam size stays set, a later odd batch fails)."""
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.sequence_generator import SequenceGenerator

    argv = [
        data,
        "--task",
        "translation",
        *LANGS,
        "--arch",
        "bart_base",
        *TINY,
        "--encoder-attention-heads",
        "2",
        "--decoder-attention-heads",
        "2",
        "--encoder-ffn-embed-dim",
        "16",
        "--decoder-ffn-embed-dim",
        "16",
    ]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)
    model = task.build_model(cfg.model).eval()
    SequenceGenerator([model], task.target_dictionary, beam_size=2)
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 1], [6, 5, 2, 1]])
    prev = torch.tensor([[2, 5, 6], [2, 8, 9], [2, 6, 5]])
    try:
        with torch.no_grad():
            model(src, torch.tensor([4, 3, 3]), prev)
        forward = "ran"
    except Exception as e:  # noqa: BLE001  (the outcome is what is compared)
        forward = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return {"beam_size": model.decoder.layers[0].encoder_attn.beam_size, "odd_batch_forward": forward}


def persistent_save(data, work):
    """test_checkpoint_utils.py: torch_persistent_save writes a file torch.load reads back whole."""
    import torch
    from fairseq import checkpoint_utils

    os.makedirs(work)
    path = os.path.join(work, "checkpoint_last.pt")
    checkpoint_utils.torch_persistent_save({"model": {"w": torch.arange(6.0)}}, path)
    return {"files": sorted(os.listdir(work)), "w": torch.load(path)["model"]["w"].tolist()}


SCENARIOS = [activation_checkpointing, train_generate_resume, bart_beam_state, persistent_save]


def outcome(error: BaseException) -> str:
    detail = str(error).splitlines()[0] if str(error) else ""
    return f"{'failed' if isinstance(error, AssertionError) else 'error'}: {type(error).__name__}: {detail[:300]}"


def main(argv) -> None:
    out = os.path.abspath(argv[0])
    if "--plugin" in argv[1:]:
        import lsg_fairseq  # noqa: F401  (what this comparison is about)
    import torch

    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as root:
        data = make_data(root)
        for scenario in SCENARIOS:
            try:
                results[scenario.__name__] = {
                    "outcome": "passed",
                    **scenario(data, os.path.join(root, scenario.__name__)),
                }
            except BaseException as e:  # noqa: BLE001  (SystemExit too: a refusal printed as one line)
                if isinstance(e, KeyboardInterrupt):
                    raise
                results[scenario.__name__] = {"outcome": outcome(e).replace(root, "<tmp>")}
    with open(out, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
