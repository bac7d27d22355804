"""fairseq datasets used by the tasks: binarized-data checks, source truncation, a summarization
split's source/target pair, on-the-fly GSG.

The fairseq-free text library they build on (sentences, ROUGE, GSG selection, file helpers) is
the sibling package ``lsg_text``.
"""
