"""fairseq-hydra-train: the plugin's models from a YAML config (examples/lsg_summarization/hydra/).

The committed example configs run through ``lsg-fairseq-hydra-train`` in a temp folder, with
overrides that make them tiny, then the checkpoint generates. Unit tests cover what makes the
hydra path differ from fairseq-train's: the model's own flags reaching its layers
(fairseq_fixes/hydra_model_flags.py), the task's and the model's position limits, LOCOST's
``ssm_lr`` without the base learning rate in the model config.
"""

import os
import subprocess

import pytest
from fairseq.models.transformer.transformer_config import TransformerConfig
from omegaconf import OmegaConf

import lsg_fairseq
from conftest import BIN, REPO_ROOT
from lsg_fairseq.fairseq_fixes._wrap import original
from lsg_fairseq.fairseq_fixes.run_hooks import TOO_LATE
from lsg_text.errors import ConfigError, MissingFileError

CONFIGS = os.path.join(REPO_ROOT, "examples", "lsg_summarization", "hydra")
# the example configs at test size: no GPU, no checkpoint to start from, no ROUGE (word-level data)
SMALL = [
    "++common.cpu=true",
    "common.log_interval=1",
    "checkpoint.finetune_from_model=null",
    "checkpoint.save_dir=ck",
    "checkpoint.best_checkpoint_metric=loss",
    "checkpoint.maximize_best_checkpoint_metric=false",
    "task.eval_rouge=false",
    "optimization.update_freq=[1]",
    "++optimization.max_update=2",
    "++dataset.num_workers=0",
]
LSG = [
    "common.fp16=false",
    "model._name=lsg_bart_tiny",
    "model.block_size=16",
    "task.max_target_positions=256",
    "model.max_target_positions=256",
]


def command(folder, name, *args):
    """The console script ``name`` of this environment run in ``folder``."""
    return subprocess.run([os.path.join(BIN, name), *args], cwd=folder, capture_output=True, text=True)


def hydra_train(folder, config, *overrides):
    return command(folder, "lsg-fairseq-hydra-train", "--config-dir", CONFIGS, "--config-name", config, *overrides)


@pytest.fixture
def run_folder(word_data, tmp_path):
    """A folder whose ``data-bin`` (the configs' relative task.data) is the word-level data."""
    os.symlink(word_data, tmp_path / "data-bin")
    return tmp_path


def test_lsg_config_trains_and_its_checkpoint_generates(run_folder):
    r = hydra_train(run_folder, "lsg_bart_base_4096", *SMALL, *LSG, "++task.truncate_target=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run_folder / "ck" / "checkpoint_last.pt").is_file()  # ck: relative to the folder run in
    # the plugin named in the config: fairseq's processes per GPU import it from there
    assert f"'user_dir': '{lsg_fairseq.user_dir()}'" in r.stdout + r.stderr
    assert "num_updates 2" in r.stdout + r.stderr
    # hydra's notices about fairseq's use of hydra (fairseq's and torch's own warnings stay)
    assert "version_base" not in r.stderr and "ConfigStore" not in r.stderr and "package header" not in r.stderr
    assert TOO_LATE not in r.stdout + r.stderr
    gen = command(
        run_folder,
        "lsg-fairseq-generate",
        *"data-bin --path ck/checkpoint_last.pt --gen-subset valid --beam 2 --max-len-b 5 --batch-size 2 --cpu".split(),
        *"--max-source-positions 4096 --max-target-positions 256 --truncate-target".split(),
    )
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert sum(line.startswith("H-") for line in gen.stdout.splitlines()) == 4
    # the recipe's next step, a warm start at a longer length, reads the hydra checkpoint (its cfg.model
    # names the arch by _name alone)
    (run_folder / "ck" / "dict.txt").symlink_to(run_folder / "data-bin" / "dict.source.txt")
    conv = command(run_folder, "lsg-fairseq-convert", "ck/checkpoint_last.pt", "warm", "--max-source-positions", "8192")
    assert conv.returncode == 0, conv.stderr[-3000:]
    assert (run_folder / "warm" / "model.pt").is_file()
    export = command(run_folder, "lsg-fairseq-export", "ck/checkpoint_last.pt", "hf")
    assert export.returncode == 0, export.stderr[-3000:]
    assert (run_folder / "hf" / "config.json").is_file() and (run_folder / "hf" / "model.safetensors").is_file()


def test_locost_config_keeps_the_ssm_group_under_bf16(run_folder):
    """bf16 needs no common.tpu=false here (fairseq's bf16-means-TPU bug is in its argparse path);
    the SSM group gets ssm_lr / lr = 0.004 / 5e-4 and no weight decay."""
    ssm = ["++model.ssm_lr=0.004", "++model.lr=${optimization.lr}", "++model.optimizer=${optimizer._name}"]
    r = hydra_train(run_folder, "locost_base", *SMALL, "model._name=locost_tiny", "optimizer.weight_decay=0.1", *ssm)
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert "grouped_adam: group ssm: 10 tensors, lr x8.0, weight decay 0.0" in log
    assert "grouped_adam: group default:" in log and "weight decay 0.1" in log
    assert "'bf16': True" in log and "num_updates 2" in log


@pytest.mark.parametrize(
    "override,line",
    [
        (  # checked with the run (call_main)
            "task.max_source_positions=1024",
            "task.max_source_positions 1024 and model.max_source_positions 4096 (arch lsg_bart_tiny) differ: "
            "fairseq-hydra-train keeps them apart (fairseq-train sets both with one flag); set both to the length "
            "to train at",
        ),
        (  # a check fairseq-train shares, in the config's keys (fairseq: a traceback once the data is loaded)
            "optimization.update_freq=[0]",
            "optimization.update_freq 0: must be an integer >= 1",
        ),
        (  # checked with the config, before fairseq completes it (add_defaults): else ignored, no word
            "++model.sparsity_typ=norm",
            "model.sparsity_typ: not a setting of model lsg_bart_tiny; did you mean sparsity_type?",
        ),
        (  # the data folder as the config names it (it read "--data", a flag no command has)
            "task.data=nope",
            "data directory 'nope' does not exist (task.data)",
        ),
        (  # fairseq-hydra-train enters the CUDA profiler before fairseq-train's main: checked with the config
            "common.profile=true",
            "common.profile: fairseq runs the command under the CUDA profiler with it (NVTX ranges for Nsight "
            "Systems), and here common.cpu is given; drop it",
        ),
        (  # checked at the first training log (fairseq: a KeyError after the first epoch)
            "checkpoint.best_checkpoint_metric=rouge",
            "checkpoint.best_checkpoint_metric rouge: not a metric of this run (its criterion and task log loss, "
            "ppl, bsz, wpb, wps); refused at the first training log, before any checkpoint",
        ),
    ],
)
def test_a_refused_config_is_one_line_and_trains_nothing(run_folder, override, line):
    r = hydra_train(run_folder, "lsg_bart_base_4096", *SMALL, *LSG, "++task.truncate_target=true", override)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == f"lsg-fairseq-hydra-train: error: {line}"
    assert "Traceback" not in r.stderr and not list(run_folder.glob("ck/*.pt"))


@pytest.mark.parametrize(
    "group,key,expected",
    [
        (
            "model",
            "sparsity_typ",
            "model.sparsity_typ: not a setting of model lsg_bart_tiny; did you mean sparsity_type?",
        ),
        ("task", "trunkate_target", "task.trunkate_target: not a setting of task long_document_summarization; did you"),
        ("optimizer", "weigth_decay", "optimizer.weigth_decay: not a setting of optimizer adam; did you mean weight_d"),
        ("lr_scheduler", "zzz", "lr_scheduler.zzz: not a setting of lr_scheduler fixed"),
    ],
)
def test_a_key_that_is_no_setting_is_named(group, key, expected):
    """fairseq's own: a legacy model ignores it without a word; the others end in omegaconf's
    ConfigKeyError traceback when fairseq builds them."""
    _check_one_change(group, key, 1, expected)


@pytest.mark.parametrize(
    "key,value,expected",
    [  # what argparse says of the same flag in fairseq-train; hydra's YAML types them past it
        ("block_size", "abc", "model.block_size abc: must be an integer >= 1, got 'abc'"),
        ("block_size", 0, "model.block_size 0: must be an integer >= 1, got '0'"),
        ("sparsity_type", "foo", "model.sparsity_type foo: must be one of none, norm, pooling, stride,"),
        ("attention_dropout", "x", "model.attention_dropout x: must be a number"),
        ("pass_global_tokens_to_decoder", "maybe", "model.pass_global_tokens_to_decoder maybe: expected true/false"),
    ],
)
def test_a_model_value_its_flag_would_refuse_is_named(key, value, expected):
    """fairseq's own: a TypeError deep in the model for block_size abc, a traceback for an unknown
    sparsity type (the ranges the build checks, block_size 0 among them, say it in fairseq-train's
    flag names)."""
    _check_one_change("model", key, value, expected)


def _check_one_change(group, key, value, expected):
    """A config that passes, then the same with ``group.key = value``: refused with ``expected``."""
    from lsg_fairseq.tasks.hydra_config import check_hydra_keys

    cfg = {
        "model": {"_name": "lsg_bart_tiny", "block_size": 16, "lr": [1e-3]},  # lr: FLAT_KEYS_READ
        "task": {"_name": "long_document_summarization", "data": "x", "truncate_target": True},
        "optimizer": {"_name": "adam", "weight_decay": 0.1},
        "lr_scheduler": {"_name": "fixed"},
        "criterion": "cross_entropy",  # a bare name: nothing to check
    }
    check_hydra_keys(OmegaConf.create(cfg))
    cfg[group] = {**cfg[group], key: value}
    with pytest.raises(ConfigError) as e:
        check_hydra_keys(OmegaConf.create(cfg))
    assert str(e.value).startswith(expected)


def test_plain_fairseq_hydra_train_builds_the_models_too(run_folder):
    """Through common.user_dir alone: the model builds (the model flags fix is installed when fairseq
    imports the plugin, before the model is built), and a warning names the command with the checks."""
    from lsg_fairseq import user_dir

    r = command(
        run_folder,
        "fairseq-hydra-train",
        *("--config-dir", CONFIGS, "--config-name", "lsg_bart_base_4096", *SMALL, *LSG),
        *("++task.truncate_target=true", f"++common.user_dir={user_dir()}", "hydra.job.chdir=false"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run_folder / "ck" / "checkpoint_last.pt").is_file()
    assert TOO_LATE in r.stdout + r.stderr  # hydra logs to stdout


# ----------------------------------------------------------------------------- the pieces
def test_from_namespace_reads_a_dictconfigs_keys():
    """fairseq's own from_namespace copies ``vars()`` of a DictConfig (OmegaConf's internals): the
    legacy model's flags are lost (LSG-BART's build: AttributeError: invalid argument
    num_global_tokens)."""
    model = OmegaConf.create({"_name": "lsg_bart_tiny", "num_global_tokens": 3, "encoder_layers": 2})
    stock = original(TransformerConfig, "from_namespace")(model)
    with pytest.raises(AttributeError, match="invalid argument num_global_tokens"):
        stock.num_global_tokens
    ours = TransformerConfig.from_namespace(model)
    assert ours.num_global_tokens == 3 and ours.encoder.layers == 2
    assert ours.task is None  # BART reads it when loading a checkpoint: fairseq-train's has the task name
    built = TransformerConfig.from_namespace(ours)
    assert built is ours  # a config already built passes untouched


@pytest.mark.parametrize(
    "model,task,problem",
    [
        (
            {"_name": "lsg_bart_base"},
            (1024, 1024),
            "task.max_source_positions 1024 and model.max_source_positions 4096",
        ),
        ({"_name": "led_tiny", "max_source_positions": 512}, (512, 1024), "model.max_target_positions 256"),
        ({"_name": "lsg_bart_base", "max_source_positions": 16384}, (16384, 1024), None),
        ({"_name": "transformer"}, (1024, 1024), None),  # fairseq's own: its arch agrees
    ],
)
def test_hydra_positions_agree(model, task, problem):
    from lsg_fairseq.tasks.hydra_config import check_hydra_positions

    cfg = OmegaConf.create({"model": model, "task": {"max_source_positions": task[0], "max_target_positions": task[1]}})
    if problem is None:
        check_hydra_positions(cfg)
    else:
        with pytest.raises(ConfigError, match=problem.replace(".", r"\.")):
            check_hydra_positions(cfg)


def test_locost_ssm_lr_names_what_a_hydra_model_config_lacks():
    import lsg_fairseq  # noqa: F401
    from lsg_fairseq.models.locost import LOCOSTModel

    with pytest.raises(ConfigError, match=r"add to it: lr: \$\{optimization.lr\} and optimizer: "):
        LOCOSTModel._ssm_lr_scale(OmegaConf.create({"ssm_lr": 0.004}))
    resolved = OmegaConf.create({"ssm_lr": 0.004, "lr": [0.001], "optimizer": "grouped_adam"})
    assert LOCOSTModel._ssm_lr_scale(resolved) == pytest.approx(4.0)  # lr a ListConfig
    assert LOCOSTModel._ssm_lr_scale(OmegaConf.create({})) == 1.0  # no ssm_lr: nothing needed


@pytest.mark.parametrize(
    "argv,message",
    [
        ([], "--config-name is required: the YAML config to train with (e.g. --config-dir"),
        (["--config-name", "lsg_bart_base_4096"], "--config-dir is required: the folder of lsg_bart_base_4096.yaml"),
        (["--config-dir", "nowhere", "-cn", "x"], "--config-dir nowhere: no such folder"),
        (
            ["--config-dir", CONFIGS, "--config-name=lsg_bart_base"],
            f"--config-name lsg_bart_base: no lsg_bart_base.yaml in {CONFIGS} (configs there: locost_base, "
            "lsg_bart_base_4096)",
        ),
    ],
)
def test_a_config_that_is_not_there_is_named(argv, message):
    """fairseq-hydra-train's own: fairseq's empty defaults run, then an AssertionError about the
    batch size (hydra finds the schema fairseq stores under any config name)."""
    from lsg_fairseq.cli.fairseq_wrappers import check_hydra_config

    with pytest.raises(ConfigError if "required" in message else MissingFileError) as e:
        check_hydra_config(argv)
    assert str(e.value).startswith(message)
    check_hydra_config(["--config-dir", CONFIGS, "--config-name", "locost_base.yaml"])  # the file's name works
    check_hydra_config(["--help"])


@pytest.mark.parametrize(
    "content, where",
    [
        (b"garbage: [unclosed\n", "(line 2, column 1: expected ',' or ']', but got '<stream end>')"),
        (b"a: 1\n\tb: 2\n", "(line 2, column 1: found character '\\t' that cannot start any token)"),
        (b"\xff\xfe", "('utf-8' codec can't decode byte 0xff in position 0"),
    ],
    ids=["unclosed", "tab", "not_utf8"],
)
def test_a_config_that_is_not_yaml_is_one_line(tmp_path, capsys, monkeypatch, content, where):
    """hydra printed its whole traceback (a ScannerError through compose) for these."""
    from lsg_fairseq.cli.fairseq_wrappers import hydra_train

    (tmp_path / "bad.yaml").write_bytes(content)
    monkeypatch.setattr("sys.argv", ["lsg-fairseq-hydra-train"])
    with pytest.raises(SystemExit) as e:
        hydra_train(["--config-dir", str(tmp_path), "--config-name", "bad"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(
        f"lsg-fairseq-hydra-train: error: --config-name bad: {tmp_path}/bad.yaml is not valid YAML {where}"
    )


def test_paths_from_the_folder_run_in_except_for_a_sweep():
    """A sweep's jobs keep a folder each (hydra's default): with the current folder for all of them,
    a relative checkpoint.save_dir would be one for every job, each resuming the last one's."""
    from lsg_fairseq.cli.fairseq_wrappers import hydra_argv

    base = ["--config-dir", CONFIGS, "--config-name", "lsg_bart_base_4096"]
    assert hydra_argv(base, "/p") == [*base, "hydra.job.chdir=false", "++common.user_dir=/p"]
    assert hydra_argv([*base, "-m", "optimization.lr=[1e-4],[3e-4]"], "/p")[-1] == "++common.user_dir=/p"
    assert "hydra.job.chdir=false" not in hydra_argv([*base, "--multirun"], "/p")
    given = [*base, "hydra.job.chdir=true", "common.user_dir=/mine"]
    assert hydra_argv(given, "/p") == given


def test_a_flag_in_a_message_becomes_the_config_key():
    """The checks fairseq-hydra-train shares with fairseq-train name the flags; under hydra the
    message names the keys (the first group holding one: lr is optimization's), a legacy model's
    by its flags, a chosen component by its group's _name; what no group holds stays."""
    from fairseq.dataclass.configs import FairseqConfig

    from lsg_fairseq.tasks.hydra_config import in_config_keys, in_hydra_terms

    cfg = OmegaConf.structured(FairseqConfig)
    cfg.model = {"_name": "lsg_bart_tiny"}  # a legacy model's group: only what the YAML gives
    cfg.task = {"_name": "long_document_summarization", "eval_rouge": False}
    cfg.lr_scheduler = {"_name": "fixed", "warmup_updates": 0, "lr": [0.1]}
    message = "--update-freq 0: x; --block-size 0; lower --lr (--lr-scheduler fixed --warmup-updates N), --arch"
    expected = (
        "optimization.update_freq 0: x; model.block_size 0; lower optimization.lr (lr_scheduler._name fixed "
        "lr_scheduler.warmup_updates N), model._name"
    )
    assert in_config_keys(message, cfg) == expected
    assert in_config_keys("--eval-rouge, --no-such-flag; see fairseq-train --help", cfg) == (
        "task.eval_rouge, --no-such-flag; see fairseq-train --help"
    )
    error = ConfigError(message)  # this process runs no hydra job: fairseq-train's flags stay
    assert in_hydra_terms(error, cfg) is error and str(error) == message
