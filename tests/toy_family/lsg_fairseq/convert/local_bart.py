"""Local-window BART, both ways: an HF BART folder with ``--to local_bart`` -> fairseq ``local_bart``
-> an HF folder of BART's weights whose config names ``LocalBartForConditionalGeneration`` and
holds the window (which converts back without ``--to``)."""

from lsg_fairseq.convert.bart import BartFamily, is_bart_source
from lsg_fairseq.convert.fields import Field
from lsg_fairseq.convert.registry import NOT_ITS_SOURCE, BenchRow, register_family
from lsg_fairseq.models.local_bart import LocalBARTModel


@register_family
class LocalBartFamily(BartFamily):
    name = "local_bart"
    models = ("local_bart",)
    label = "local-window BART"
    hf_architecture = "LocalBartForConditionalGeneration"
    # its config row, both ways (absent from a BART folder: the arch's default)
    fields = BartFamily.fields + (Field("local_window", "local_window", None, to_hf=int),)

    def refusal(self, source, options):
        if source.model_type == "bart" and self.hf_architecture in source.hf_config.get("architectures", []):
            return None  # its own HF folder
        asked = options.get("to") == self.name and source.hf_config is not None
        return None if asked and is_bart_source(source) else NOT_ITS_SOURCE

    def add_args(self, parser):
        LocalBARTModel.add_local_args(parser.add_argument_group(f"{self.label} options"))

    def benchmarks(self):
        def argv(length, settings):
            return [self.arch("tiny" if settings.smoke else "base"), "--max-source-positions", str(max(length, 1024))]

        return {"local_bart": BenchRow(argv)}  # BART's vocabulary, every mode, in --smoke's rows
