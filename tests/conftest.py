"""Shared fixtures: paths to the test data (tests/data), and a tiny word-level binarized summarization set."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the tests read lives in the repository (tests/data/README.md: conformance fixtures and
# document subsets, built from the full sets by scripts/make_test_data.py).
TEST_DATA = os.path.join(REPO_ROOT, "tests", "data")
FIXTURES = os.path.join(TEST_DATA, "fixtures")
DOCUMENTS = os.path.join(TEST_DATA, "documents")
# The full sets, where a checkout has them beside it: only tests/test_test_data.py looks there.
SHARED = os.path.join(REPO_ROOT, "..", "shared")
BIN = os.path.dirname(sys.executable)


def worker_threads(environ, cores: int):
    """Threads for each process of a ``pytest -n N`` run (``make test``: three workers): the cores
    shared among the N workers, at least one each; None outside a worker (torch's own default).
    Workers that each took every core oversubscribed them: the threads spun waiting for each other."""
    count = environ.get("PYTEST_XDIST_WORKER_COUNT")
    return max(1, cores // int(count)) if count else None


def pytest_configure(config):
    """A worker's share of the cores, for torch here and for every command a test starts
    (OMP_NUM_THREADS, which the example scripts also take as their THREADS default)."""
    threads = worker_threads(os.environ, len(os.sched_getaffinity(0)))
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)


def needs_compiled_layers():
    """Marks a test of the compiled encoder layers: they need a newer torch than the package's floor
    (``lsg_layers.torch_version``), so an older torch's run (scripts/torch_versions.sh) skips them.
    The pinned torch runs them."""
    from lsg_layers.torch_version import COMPILED_LAYERS_TORCH, at_least, spelled

    need = spelled(COMPILED_LAYERS_TORCH)
    return pytest.mark.skipif(not at_least(COMPILED_LAYERS_TORCH), reason=f"compiled layers need torch >= {need}")


def fairseq_cli(name: str) -> str:
    """Path of a fairseq console script of the running interpreter's environment."""
    return os.path.join(BIN, name)


@pytest.fixture(scope="module")
def single_thread():
    """Tiny tensors: one intra-op thread is far faster on a shared, oversubscribed CPU
    (modules opt in with ``pytestmark = pytest.mark.usefixtures("single_thread")``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def load_script(path: str, name: str, neighbours: bool = True):
    """A script of the repository (``path`` from its root) imported as module ``name``, as Python
    runs it: its folder first on sys.path (benchmarks/run.py imports report.py beside it). With
    ``neighbours=False`` the folder stays off sys.path: for a script that imports no neighbour and
    has one named like another folder's (three folders have a report.py)."""
    folder = os.path.dirname(os.path.join(REPO_ROOT, path))
    if neighbours and folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_test_data():
    """scripts/make_test_data.py as a module: the one home of tests/data's format."""
    return load_script("scripts/make_test_data.py", "make_test_data")


def locost_kernels():
    """fixtures/locost/kernels_layer0.npz with every array of the reference's file (L, kernel_raw,
    kernel_bidirectional, kernel_raw_fp64), the last two rebuilt bit for bit."""
    return make_test_data().read_kernels(os.path.join(FIXTURES, "locost", "kernels_layer0.npz"))


def edit_config(folder, **changes):
    """Apply ``changes`` to ``folder/config.json`` (an HF model folder's), in place."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(changes)
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def read_jsonl(path, limit=None):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line))
            if limit is not None and len(out) >= limit:
                break
    return out


def write_word_split(dest, split, examples):
    """One example per line, lower-cased whitespace words (no BPE needed)."""
    for side, key in (("source", "document"), ("target", "summary")):
        with open(os.path.join(dest, f"{split}.{side}"), "w", encoding="utf-8") as f:
            for ex in examples:
                f.write(" ".join(ex[key].lower().split()) + "\n")


@pytest.fixture(scope="session")
def word_data(tmp_path_factory):
    """SumPubMed (12 train / 4 valid documents), word-level, binarized with a joined dictionary."""
    root = tmp_path_factory.mktemp("word_data")
    raw, binarized = root / "raw", root / "bin"
    raw.mkdir()
    src = os.path.join(DOCUMENTS, "sumpubmed")
    write_word_split(raw, "train", read_jsonl(os.path.join(src, "train.jsonl"), 12))
    write_word_split(raw, "valid", read_jsonl(os.path.join(src, "valid.jsonl"), 4))
    subprocess.run(
        [
            fairseq_cli("fairseq-preprocess"),
            "--source-lang",
            "source",
            "--target-lang",
            "target",
            "--trainpref",
            str(raw / "train"),
            "--validpref",
            str(raw / "valid"),
            "--destdir",
            str(binarized),
            "--joined-dictionary",
            "--nwordssrc",
            "2000",
            "--workers",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    return binarized


# The smallest shape of fairseq's own encoder-decoder archs (bart_base, transformer: base-sized
# by default), as fairseq-train flags.
TINY_DIMS = (
    "--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 16 --decoder-embed-dim 16 "
    "--encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 --decoder-attention-heads 2"
).split()
# The smallest LSG-BART the command-line tests train (fairseq-train's model flags).
TINY_LSG_BART = (
    "--arch lsg_bart_tiny --encoder-embed-dim 16 --encoder-ffn-embed-dim 32 --decoder-embed-dim 16 "
    "--decoder-ffn-embed-dim 32 --encoder-layers 1 --decoder-layers 1 --block-size 16 --sparse-block-size 16"
).split()


# The smallest LOCOST the command-line tests train (fairseq-train's model flags).
TINY_LOCOST = (
    "--arch locost_tiny --d-model 16 --d-state 8 --d-ff 32 --d-kv 8 --encoder-layers 1 --decoder-layers 1"
).split()


# ---------------------------------------------------------------- tiny models on a toy vocabulary
TOY_VOCAB = 60  # <s> <pad> </s> <unk>, ids 4..58, then the task's <mask>
# lsg_bart_tiny's attention at toy lengths, every part of it in play: local blocks, norm-selected
# sparse keys, global tokens
TOY_LSG = "--block-size 8 --sparse-block-size 8 --sparsity-factor 2 --sparsity-type norm --num-global-tokens 2".split()


def write_toy_dict(folder) -> str:
    """An identity dict.txt (ids 4..TOY_VOCAB-2) in ``folder``: enough for the task to build models."""
    with open(os.path.join(folder, "dict.txt"), "w") as f:
        for i in range(4, TOY_VOCAB - 1):
            f.write(f"{i} 1\n")
    return str(folder)


def training_config(argv):
    """fairseq-train's flags as fairseq-train makes them a config (parse_args_and_arch -> omegaconf)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import lsg_fairseq  # noqa: F401  (registers the plugin's archs, task and optimizer)

    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), list(argv)))


def build_from_flags(argv, seed=0):
    """fairseq's own path (parse_args_and_arch -> omegaconf -> task -> model), seeded weights:
    ``(cfg, task, model)``, for the tests that also build the criterion or optimizer from ``cfg``."""
    from fairseq import tasks

    cfg = training_config(argv)
    task = tasks.setup_task(cfg.task)
    import torch

    torch.manual_seed(seed)
    return cfg, task, task.build_model(cfg.model)


def build_task_and_model(argv, seed=0):
    """``build_from_flags`` without the config."""
    return build_from_flags(argv, seed)[1:]


def toy_batch(n=2, L=45, lengths=(45, 30), seed=1):
    """Right-padded ``<s> ... </s>`` sources and decoder inputs starting with ``</s>``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, TOY_VOCAB - 1, (n, L), generator=g)
    src[:, 0] = 0  # <s>
    for i, length in enumerate(lengths):
        src[i, length - 1] = 2  # </s>
        src[i, length:] = 1  # right padding
    prev = torch.randint(4, TOY_VOCAB - 1, (n, 7), generator=g)
    prev[:, 0] = 2
    return src, torch.tensor(lengths), prev


@pytest.fixture(params=["cpu", "whole"])
def layer_path(request, monkeypatch):
    """Run a test on both paths of every layer that has two (``lsg_layers.modules.paths``): the CPU
    fast paths (strided key windows of the LSG and Longformer attentions, S4D's decay groups and
    channel chunks) and the whole-tensor paths a GPU runs (gathered keys, one batched FFT), forced
    on CPU for every instance by the class default."""
    from lsg_layers.modules.paths import PathChoice

    monkeypatch.setattr(PathChoice, "path", request.param)
    return request.param


@pytest.fixture
def fsynced(monkeypatch):
    """The base names of the files ``os.fsync`` is called on, in order (fsync still runs)."""
    names = []
    real_fsync = os.fsync

    def spy(fd):
        names.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return names


def pytest_collection_modifyitems(items):
    """Tests marked ``long`` run first: with ``make test``'s workers, each file goes to a worker as
    one frees up, and the longest file started last would finish alone (``make test``
    keeps this order with ``--no-loadscope-reorder``: tests/test_suite_order.py)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture
def encoder_dtypes(monkeypatch):
    """The dtype of the long-input encoder's weights at each of its calls in the test (a list)."""
    from lsg_fairseq.models.custom_encoder import LongInputEncoder

    seen = []
    forward = LongInputEncoder.forward

    def spy(self, *args, **kwargs):
        seen.append(self.embed_tokens.weight.dtype)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(LongInputEncoder, "forward", spy)
    return seen
