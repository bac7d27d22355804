"""A checkpoint whose vocabulary is not the run's dictionary, said in one line.

``fairseq-generate``, ``-interactive`` and ``-validate`` build the model from the dictionary of the
data folder on their command line, then load the checkpoint's weights into it. A data folder of
another vocabulary (another run's data-bin, a GSG corpus for a summarization checkpoint) ends in
torch's "size mismatch for encoder.embed_tokens.weight" traceback. ``fairseq-train``'s restore
says the same through :mod:`lsg_fairseq.checkpoint_policy`; the hub checks ``dict.txt`` first.
"""

from lsg_fairseq.checkpoint_io import CheckpointError

# the rows of these are the dictionary's symbols
VOCABULARY_KEYS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight")


class VocabularyCheckedLoad:
    """Mixin for a fairseq model: ``load_state_dict`` refuses a checkpoint of another vocabulary
    with a :class:`CheckpointError` naming both sizes; any other failure is left as it is."""

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as e:
            ours = self.state_dict()
            for key in VOCABULARY_KEYS:
                if key in state_dict and key in ours and state_dict[key].shape[0] != ours[key].shape[0]:
                    raise CheckpointError(
                        f"the checkpoint's vocabulary has {state_dict[key].shape[0]} symbols, the dictionary "
                        f"this run read has {ours[key].shape[0]} ({key}): give the data folder (its dict*.txt) "
                        "the model was trained or converted with"
                    ) from e
            raise
