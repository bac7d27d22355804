"""lsg_text: the fairseq-free half of lsg-fairseq, what the data scripts in ``scripts/`` need.

Text and file handling without any model: JSONL and document readers, sentence splitting, ROUGE,
gap-sentence selection (numpy), offline tokenizer checks (sentencepiece, GPT-2 BPE files), the
synthetic data set, fairseq-generate output parsing, atomic writes, and the user-facing error
types and argparse range types that every command shares.

The rule: nothing here imports fairseq or torch (``tests/test_lsg_text.py`` checks it), so a
script that only prepares data starts in well under a second. fairseq datasets and everything
that registers models live in ``lsg_fairseq``, which imports from here, never the other way.
"""
