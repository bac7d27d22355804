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

    python examples/long_context/attention_probe.py CHECKPOINT DATA_BIN [--split valid] [-n 8]
"""

import argparse
import json
import math
import sys

import torch


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("data_bin")
    p.add_argument("--split", default="valid")
    p.add_argument("-n", type=int, default=8, help="documents to probe (default 8)")
    args = p.parse_args(argv)

    import lsg_fairseq  # noqa: F401
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [args.checkpoint], arg_overrides={"data": args.data_bin}
    )
    model = models[0].eval()
    task.load_dataset(args.split)
    ds = task.dataset(args.split)
    d = task.source_dictionary
    key_words = set()
    from lsg_text.synthetic import CHOICES

    for words in CHOICES.values():
        key_words |= {"\u2581" + w for w in words}
    key_ids = torch.tensor(sorted(d.index(w) for w in key_words if d.index(w) != d.unk()))
    visited = d.index("\u2581visited")

    mass, ent, n_pos = 0.0, 0.0, 0
    grad_norm = 0.0
    for i in range(min(args.n, len(ds))):
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
    out = {
        "mass_on_keys": mass / n_pos if n_pos else None,
        "entropy": ent / n_pos if n_pos else None,
        "uniform_entropy": math.log(src_len),
        "grad_to_encoder": grad_norm / max(args.n, 1),
        "fact_positions": n_pos,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
