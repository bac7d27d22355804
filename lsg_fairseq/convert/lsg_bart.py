"""The LSG-BART family, both ways: fairseq ``lsg_bart`` <-> the LSG-BART folder the LSG authors
publish (spec/lsg.md sections 1 and 6); also BART (HF or fairseq) -> ``lsg_bart``, initialised as
the reference converts (``lsg_init.py``). A BART-shaped family: BART's mapping (``bart.py``) plus
the LSG config fields and the global-token table.

Sources:

- HF LSG-BART folder (``base_model_prefix == "lsg"`` / LSG fields) -> ``lsg_bart`` with the folder's
  LSG settings (``--to bart`` is refused: it would drop the global tokens);
- HF BART folder with ``--to lsg_bart``, LSG options or ``--max-source-positions`` (the reference's
  conversion, spec/lsg.md section 6: global tokens from ordered positions + <s>/<mask> embeddings,
  position tables tiled to the new max length);
- a fairseq ``lsg_bart`` checkpoint (``model.pt`` or a folder holding one) -> ``lsg_bart`` with a
  longer ``--max-source-positions`` and/or more ``--num-global-tokens`` (warm start, e.g.
  4,096 -> 16,384), or other LSG settings;
- a fairseq ``bart`` checkpoint -> ``lsg_bart`` initialised exactly as from an HF BART folder.
"""

import logging
import os
import re

from lsg_fairseq.checkpoint_policy import model_arch
from lsg_fairseq.convert import common as C
from lsg_fairseq.convert.bart import BartFamily, is_bart_source, is_lsg_config
from lsg_fairseq.convert.fields import Field
from lsg_fairseq.convert.lsg_init import GLOBAL_POSITIONAL_STRIDE, INIT_SEED, init_global_embeddings, mask_id
from lsg_fairseq.convert.registry import NOT_ITS_SOURCE, BenchRow, register_family
from lsg_fairseq.models.lsg_bart import LSGBARTModel, lsg_architecture_defaults
from lsg_fairseq.tasks.long_document_summarization import LongDocumentSummarizationTask
from lsg_layers.modules.lsg_config import MAX_GLOBAL_TOKENS, SPARSITY_TYPES
from lsg_text.argtypes import BOOL_FLAG, NON_NEGATIVE_INT, POSITIVE_INT, OneOf

logger = logging.getLogger(__name__)

LSG_OPTION_NAMES = C.option_names(LSGBARTModel.add_lsg_args)  # the LSG flags' one home is the model
# the reference writes these as JSON booleans
LSG_BOOL_FIELDS = ("mask_first_token", "pass_global_tokens_to_decoder", "pool_with_global")
# The LSG config fields: the same names both ways; absent: the lsg_bart architecture's default
# each checked against its flag's declared range where an HF config brings it (fields.Field.kind)
LSG_KINDS = {**C.option_ranges(LSGBARTModel.add_lsg_args), "sparsity_type": OneOf(SPARSITY_TYPES)}
LSG_FIELDS = tuple(
    Field(k, k, None, to_hf=bool, kind=BOOL_FLAG) if k in LSG_BOOL_FIELDS else Field(k, k, None, kind=LSG_KINDS.get(k))
    for k in LSG_OPTION_NAMES
)
# What the LSG reference writes (spec/lsg.md section 1); the modeling file it names is the LSG
# authors' (lsg_converter/bart/modeling_lsg_bart.py), not shipped here.
LSG_AUTO_MAP = {
    "AutoConfig": "modeling_lsg_bart.LSGBartConfig",
    "AutoModel": "modeling_lsg_bart.LSGBartModel",
    "AutoModelForCausalLM": "modeling_lsg_bart.LSGBartForCausalLM",
    "AutoModelForQuestionAnswering": "modeling_lsg_bart.LSGBartForQuestionAnswering",
    "AutoModelForSeq2SeqLM": "modeling_lsg_bart.LSGBartForConditionalGeneration",
    "AutoModelForSequenceClassification": "modeling_lsg_bart.LSGBartForSequenceClassification",
}


def is_lsg_source(source) -> bool:
    """An HF LSG-BART folder or a fairseq ``lsg_bart`` checkpoint."""
    if source.hf_config is not None:
        return source.model_type == "bart" and is_lsg_config(source.hf_config)
    return source.model == "lsg_bart"


@register_family
class LSGBartFamily(BartFamily):
    """fairseq ``lsg_bart`` <-> the LSG authors' LSG-BART folder; BART -> ``lsg_bart``."""

    name = "lsg_bart"
    models = ("lsg_bart",)
    label = "LSG-BART"
    option_label = "LSG"
    hf_architecture = "LSGBartForConditionalGeneration"
    fields = BartFamily.fields + LSG_FIELDS
    encoder_keys = re.compile(r"encoder\.global_embeddings\.weight")
    required_keys = ("encoder.global_embeddings.weight",)

    def refusal(self, source, options):
        """Its own sources; a BART source with ``--to lsg_bart``, or with LSG options or a new
        ``--max-source-positions`` (the reference's conversion)."""
        if is_lsg_source(source):
            return None
        asked = options.get("to") == self.name or set(options) & (set(LSG_OPTION_NAMES) | {"max_source_positions"})
        return None if is_bart_source(source) and asked else NOT_ITS_SOURCE

    def add_args(self, parser):
        LSGBARTModel.add_lsg_args(
            parser.add_argument_group(
                f"{self.option_label} options (default: the source's settings, else the reference's)"
            )
        )
        init = parser.add_argument_group("BART -> LSG initialisation (as the reference's converter)")
        init.add_argument(
            "--global-positional-stride",
            type=POSITIVE_INT,
            metavar="N",
            help=f"position stride of the global-token init (default {GLOBAL_POSITIONAL_STRIDE})",
        )
        init.add_argument(
            "--seed", type=NON_NEGATIVE_INT, help=f"seed of the random parts of the init (default {INIT_SEED})"
        )

    def convert(
        self,
        source,
        out,
        max_source_positions=None,
        max_target_positions=None,
        global_positional_stride=GLOBAL_POSITIONAL_STRIDE,
        seed=INIT_SEED,
        **options,
    ):
        init = dict(stride=global_positional_stride, seed=seed)
        return super().convert(source, out, max_source_positions, max_target_positions, init, **options)

    def hf_lengths(self, source, sd, max_source_positions, max_target_positions):
        """An LSG source's own lengths unless given; a BART source's: the architecture's encoder
        length, and the decoder table tiled to it too, as the reference does (fairseq_notes 3.6)."""
        config, src = source.hf_config, source.path
        own = is_lsg_source(source)
        enc_pos, dec_pos = sd["encoder.embed_positions.weight"], sd["decoder.embed_positions.weight"]
        P = enc_pos.size(0) - 2
        if own and config.get("max_position_embeddings", P) != P:
            raise C.ConversionError(
                f"{src}: encoder position table has {enc_pos.size(0)} rows but max_position_embeddings "
                f"is {config.get('max_position_embeddings')} (expected rows = max + 2)"
            )
        M = int(max_source_positions or (P if own else C.arch_defaults(self.arch_for(config)).max_source_positions))
        T = int(max_target_positions or (dec_pos.size(0) - 2 if own else M))
        return M, T

    def hf_encoder(self, source, values, sd, options, init):
        """The LSG settings (the reference's ``None`` sparsity type, no sparse keys, becomes
        ``"none"`` here, the one place it is translated) and the global-token table: the source's,
        or initialised from a BART source's positions and embeddings."""
        config, src = source.hf_config, source.path
        # null is a setting for sparsity_type only (no sparse keys); for the others the reference has
        # no meaning for it, and taking the architecture's default would build a model it never had
        nulls = [k for k in LSG_OPTION_NAMES if k != "sparsity_type" and k in config and config[k] is None]
        if nulls:
            raise C.ConversionError(
                f"{src}/config.json: {', '.join(nulls)} null; give a value, or remove the field for lsg_bart's default"
            )
        if not C.config_flag(config, "adaptive", src, True):
            logger.warning("adaptive=False in the HF config; lsg-fairseq always pads adaptively")
        if "sparsity_type" in config and str(config["sparsity_type"]).lower() == "none":
            values["sparsity_type"] = "none"
        if is_lsg_source(source):
            if "encoder.global_embeddings.weight" not in sd:
                raise C.ConversionError(f"{src}: LSG config but no model.encoder.global_embeddings.weight")
        else:
            sd["encoder.global_embeddings.weight"] = init_global_embeddings(
                sd["encoder.embed_positions.weight"],
                sd["encoder.embed_tokens.weight"],
                config.get("bos_token_id", 0),
                mask_id(src, C.read_hf_vocab(src), config["vocab_size"]),
                **init,
            )
        glob = sd["encoder.global_embeddings.weight"]
        if glob.shape != (MAX_GLOBAL_TOKENS, config["d_model"]):
            raise C.ConversionError(
                f"{src}: global_embeddings has shape {tuple(glob.shape)}, expected "
                f"({MAX_GLOBAL_TOKENS}, {config['d_model']})"
            )

    def new_encoder(self, model_args, sd, src_dir, **init):
        """A fairseq BART checkpoint -> lsg_bart: same sizes (bart_large -> lsg_bart_large), every LSG
        option not given the architecture's, global tokens initialised exactly as from an HF folder."""
        from fairseq.models import ARCH_MODEL_NAME_REGISTRY

        arch = "lsg_" + model_arch(model_args)
        model_args.arch = arch if ARCH_MODEL_NAME_REGISTRY.get(arch) == self.name else self.arch("large")
        model_args._name = model_args.arch  # fairseq builds legacy models by `_name`
        lsg_architecture_defaults(model_args)
        # the dictionary as the task builds it: <mask> appended, as on every model row count
        d = LongDocumentSummarizationTask.load_dictionary(os.path.join(src_dir, "dict.txt"))
        sd["encoder.global_embeddings.weight"] = init_global_embeddings(
            sd["encoder.embed_positions.weight"], sd["encoder.embed_tokens.weight"], d.bos(), d.index("<mask>"), **init
        )

    def hf_config_fields(self, checkpoint, config, hf):
        fields = super().hf_config_fields(checkpoint, config, hf)
        fields.update(adaptive=True, auto_map=dict(LSG_AUTO_MAP), base_model_prefix="lsg")
        return fields

    # Plot colours of the sparsity types: norm (run.py's --main-lsg) distinct, the others muted.
    BENCH_COLORS = {
        "norm": "tab:blue",
        "pooling": "tab:cyan",
        "stride": "tab:olive",
        "block_stride": "tab:pink",
        "lsh": "tab:brown",
        "bos_pooling": "steelblue",
        "none": "lightskyblue",
    }
    SMOKE_TYPES = ("norm", "pooling")  # the types run.py --smoke runs by default

    def benchmarks(self):
        """``lsg_<type>``: one row per sparsity type (the settings' block sizes, factor and global
        tokens), each a variant: run.py's --main-lsg runs every mode, the others fewer."""

        def row(sparsity_type):
            def argv(length, settings):
                return [
                    self.arch("tiny" if settings.smoke else "base"),
                    "--max-source-positions",
                    str(max(length, 1024)),
                    "--block-size",
                    str(settings.block_size),
                    "--sparse-block-size",
                    str(settings.sparse_block_size),
                    "--sparsity-factor",
                    str(settings.sparsity_factor),
                    "--sparsity-type",
                    sparsity_type,
                    "--num-global-tokens",
                    str(settings.num_global_tokens),
                ]

            return BenchRow(
                argv, variant=True, smoke=sparsity_type in self.SMOKE_TYPES, color=self.BENCH_COLORS.get(sparsity_type)
            )

        return {f"lsg_{t}": row(t) for t in SPARSITY_TYPES}
