"""fairseq datasets used by the tasks: binarized-data checks, source truncation, on-the-fly GSG.

The fairseq-free text library they build on (sentences, ROUGE, GSG selection, file helpers) is
the sibling package ``lsg_text``.
"""
