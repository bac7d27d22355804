"""Under ``fairseq-hydra-train``, a legacy (argparse) model's own flags reach its layers.

fairseq 0.12 builds a legacy transformer's layers from ``TransformerConfig.from_namespace(args)``,
which copies the fields it declares and then every other attribute of ``args`` (``vars(args)``):
on an argparse namespace, the model's own flags. ``fairseq-hydra-train`` hands models a
``DictConfig`` instead, whose ``vars()`` are OmegaConf's internals, not its keys: every flag a
legacy model adds to BART's is lost, and the build fails (``AttributeError: invalid argument
num_global_tokens``) or, for a flag read with a default, silently uses the default. The wrapper
reads a ``DictConfig``'s keys as the namespace it stands for; a namespace, or a config already
built, is passed on untouched.

One key of fairseq-train's flat namespace that is not the model's is read by BART itself:
``args.task`` (the task's name, in ``upgrade_state_dict_named``, when a checkpoint is loaded). A
hydra model config has none, so a BART trained with fairseq-hydra-train could not be loaded
(``AttributeError: invalid argument task``); it reads as None here (not ``multilingual_denoising``,
the one task that method looks for). fairseq's own models under hydra read their declared fields
as before, and their BART checkpoints load.
"""

from argparse import Namespace

from fairseq.models.transformer.transformer_config import TransformerConfig
from omegaconf import OmegaConf

from lsg_fairseq.fairseq_fixes._wrap import wrap


def _keys_of_configs(original):
    def from_namespace(cls, args):
        if OmegaConf.is_config(args):
            args = Namespace(**{"task": None, **OmegaConf.to_container(args, resolve=True)})
        return original(cls, args)

    return from_namespace


def install() -> None:
    wrap(TransformerConfig, "from_namespace", _keys_of_configs)
