#!/usr/bin/env python
"""Where does the decoder look when it writes a key fact? Cross-attention of a trained checkpoint.

For each document of a synthetic split, the reference summary is teacher-forced through the model;
at every target position that holds a key fact (colour, animal, city, weekday), the last decoder
layer's cross-attention (mean over heads) is read, and the script reports

* ``mass_on_keys``: the share of attention on the source pieces of the key sentences (uniform
  attention puts ~7 x keys / length there, 0.5% at 4K tokens; a model that retrieves puts most of
  it there);
* ``entropy``: the attention's entropy in nats (log(length) when uniform, 8.3 at 4K tokens);
* ``grad_to_encoder``: the norm of d loss / d encoder output summed over the batch, i.e. how much
  training signal reaches the encoder at all.

    python examples/long_context/attention_probe.py CHECKPOINT [CHECKPOINT ...] DATA_BIN [--split valid] [-n 8]
        [--out JSON [JSON ...]]

Several checkpoints are probed in one process: fairseq is imported once (its import is most of
the time a probe of a tiny model takes).
"""

import argparse
import json
import math
import sys

import torch

from lsg_text.argtypes import POSITIVE_INT


def probe(model, task, split: str, n: int) -> dict:
    """The three readings over the first ``n`` documents of ``split`` (see the module docstring)."""
    from lsg_text.synthetic import CHOICES

    task.load_dataset(split)
    ds = task.dataset(split)
    d = task.source_dictionary
    key_words = set()
    for words in CHOICES.values():
        key_words |= {"\u2581" + w for w in words}
    key_ids = torch.tensor(sorted(d.index(w) for w in key_words if d.index(w) != d.unk()))
    visited = d.index("\u2581visited")

    count = min(n, len(ds))
    if count == 0:
        raise ValueError(f"the {split} split is empty")
    mass, ent, n_pos = 0.0, 0.0, 0
    grad_norm = 0.0
    for i in range(count):
        sample = ds.collater([ds[i]])
        net = sample["net_input"]
        src = net["src_tokens"][0]
        # key sentences: the 7 pieces starting 3 before each "visited" ("The colour animal visited ...")
        in_key = torch.zeros_like(src, dtype=torch.bool)
        for j in (src == visited).nonzero().flatten().tolist():
            in_key[max(0, j - 3) : j + 4] = True
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        enc_out = enc["encoder_out"][0].detach().requires_grad_(True)  # a leaf: its .grad is kept
        enc["encoder_out"] = [enc_out]
        logits, extra = model.decoder(net["prev_output_tokens"], encoder_out=enc)
        lprobs = torch.log_softmax(logits.float(), dim=-1)
        loss = -lprobs.gather(-1, sample["target"].unsqueeze(-1)).sum()
        loss.backward()
        grad_norm += enc_out.grad.norm().item()
        if not extra.get("attn") or extra["attn"][0] is None:
            continue  # a decoder that does not return its cross-attention (LOCOST's T5 decoder)
        # (T, S): over the source tokens (LSG-BART's decoder leaves its global tokens out)
        attn = extra["attn"][0][0].detach()
        target = sample["target"][0]
        fact_pos = torch.isin(target, key_ids)
        for t in fact_pos.nonzero().flatten().tolist():
            a = attn[t]
            mass += a[in_key[: a.numel()]].sum().item()
            ent += -(a.clamp_min(1e-12) * a.clamp_min(1e-12).log()).sum().item()
            n_pos += 1
    src_len = src.numel()
    return {
        "mass_on_keys": mass / n_pos if n_pos else None,
        "entropy": ent / n_pos if n_pos else None,
        "uniform_entropy": math.log(src_len),
        "grad_to_encoder": grad_norm / count,
        "fact_positions": n_pos,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help="one or more, probed in one process")
    p.add_argument("data_bin")
    p.add_argument("--split", default="valid")
    p.add_argument("-n", type=POSITIVE_INT, default=8, help="documents to probe (default 8)")
    p.add_argument(
        "--out",
        nargs="+",
        metavar="JSON",
        help="a file per checkpoint, in order (default: one JSON line per checkpoint on stdout)",
    )
    args = p.parse_args(argv)
    if args.out and len(args.out) != len(args.checkpoints):
        p.error(f"--out: {len(args.out)} files for {len(args.checkpoints)} checkpoints")

    import lsg_fairseq  # noqa: F401
    from fairseq import checkpoint_utils

    failed = 0
    for k, path in enumerate(args.checkpoints):
        try:  # a probe that fails (a checkpoint it cannot read) leaves {} for that row and goes on
            models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
                [path], arg_overrides={"data": args.data_bin}
            )
            reading = probe(models[0].eval(), task, args.split, args.n)
        except Exception as e:  # one row's failure must not cost the others their reading
            print(f"attention_probe.py: {path}: {type(e).__name__}: {e}", file=sys.stderr)
            reading, failed = {}, failed + 1
        if args.out:
            with open(args.out[k], "w") as f:
                f.write(json.dumps(reading) + "\n")
        else:
            print(json.dumps(reading), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
