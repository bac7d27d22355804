"""Local-window BART, both ways: an HF BART folder with ``--to local_bart`` -> fairseq ``local_bart``
-> an HF folder of BART's weights whose config names ``LocalBartForConditionalGeneration`` and
holds the window (which converts back without ``--to``)."""

from lsg_fairseq.convert.bart import BartFamily, is_bart_source
from lsg_fairseq.convert.registry import BenchRow, register_family
from lsg_fairseq.models.local_bart import LocalBARTModel


@register_family
class LocalBartFamily(BartFamily):
    name = "local_bart"
    models = ("local_bart",)
    label = "local-window BART"
    hf_architecture = "LocalBartForConditionalGeneration"

    def detect(self, source):
        return source.model_type == "bart" and self.hf_architecture in source.hf_config.get("architectures", [])

    def can_convert(self, source):
        return self.detect(source) or source.hf_config is not None and is_bart_source(source)

    def add_args(self, parser):
        LocalBARTModel.add_local_args(parser.add_argument_group(f"{self.label} options"))

    def hf_values(self, config):
        return {"local_window": config.get("local_window")}  # None (a BART folder): the arch's default

    def hf_config_fields(self, checkpoint, config, hf):
        return dict(super().hf_config_fields(checkpoint, config, hf), local_window=int(checkpoint.get("local_window")))

    def benchmarks(self):
        def argv(length, settings):
            return [self.arch("tiny" if settings.smoke else "base"), "--max-source-positions", str(max(length, 1024))]

        return {"local_bart": BenchRow(argv)}  # BART's vocabulary, every mode, in --smoke's rows
