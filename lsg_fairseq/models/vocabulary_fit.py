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
    with a :class:`CheckpointError` naming both sizes, and one whose tensors have other shapes than
    the model built (settings changed by ``--model-overrides``, e.g. a longer ``max_source_positions``:
    a traceback from fairseq-generate and -validate) naming the first such tensor."""

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as e:
            ours = self.state_dict()
            for key in VOCABULARY_KEYS:
                if key in state_dict and key in ours and state_dict[key].shape[0] != ours[key].shape[0]:
                    theirs, read = state_dict[key].shape[0], ours[key].shape[0]
                    # this plugin's tasks add <mask> to the data's dictionary; fairseq's own do not
                    task = (
                        "; or, one symbol apart, the run lacks the checkpoint's --task (e.g. --task "
                        "long_document_summarization: its tasks add <mask> to the dictionary)"
                        if theirs == read + 1
                        else ""
                    )
                    raise CheckpointError(
                        f"the checkpoint's vocabulary has {theirs} symbols, the dictionary this run read has "
                        f"{read} ({key}): give the data folder (its dict*.txt) the model was trained or converted "
                        f"with{task}"
                    ) from e
            # tensors missing or unexpected (another arch's checkpoint) are left to torch's message, which
            # fairseq-train's restore explains (checkpoint_policy)
            shapes = [k for k in state_dict if k in ours and state_dict[k].shape != ours[k].shape]
            if not shapes:
                raise
            key, more = shapes[0], len(shapes) - 1
            hint = ""
            if key == "encoder.embed_positions.weight":  # a longer input asked for: the table is extended offline
                from lsg_fairseq.checkpoint_policy import longer_positions_hint, model_arch

                # the cfg fairseq loads with (hydra's holds the arch as _name alone), else the model's args
                arch = model_arch(model_cfg if model_cfg is not None else getattr(self, "args", None))
                arch = arch or type(self).__name__
                hint = "; " + longer_positions_hint(arch, "CHECKPOINT", ours[key].shape[0] - 2)
            raise CheckpointError(
                f"{key} is {list(state_dict[key].shape)} in the checkpoint, {list(ours[key].shape)} in this model"
                f"{f' (and {more} more)' if more else ''}: the model built from the checkpoint's settings as changed "
                f"(--model-overrides, and fairseq-validate's own flags such as --max-target-positions, which it "
                f"applies to the model) does not fit its weights{hint}"
            ) from e
