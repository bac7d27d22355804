"""The benchmark's models and the one call each measurement times (``benchmarks/run.py``).

- :func:`make_dictionary`, :class:`_Task`: what fairseq's ``build_model`` reads from a task;
- :class:`ProjectionsOnly`: the ``linear`` row's stand-in for an encoder self-attention;
- :func:`build_hf_model`: HF transformers' own BART (SDPA) and LED of ``bart_base``'s sizes;
- :func:`make_step` / :func:`make_hf_step`: the call of one mode (``enc``, ``train``, ``gen``) on a
  seeded random input of one length, ``--batch`` sequences of it (1 unless asked).

Which fairseq arch and flags a benchmark row builds is the registry's (``run.build_model``).
"""

from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.data import Dictionary
from fairseq.sequence_generator import SequenceGenerator


def make_dictionary(size: int) -> Dictionary:
    d = Dictionary()  # <s>=0 <pad>=1 </s>=2 <unk>=3
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}")
    return d


class _Task:
    """What ``build_model`` reads from a task: the dictionaries."""

    def __init__(self, dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


class ProjectionsOnly(nn.Module):
    """Stands in for an encoder self-attention: the four projections, no attention at all."""

    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def forward(self, query, key=None, value=None, key_padding_mask=None, **unused):
        a = self.attn
        a.q_proj(query), a.k_proj(query)  # computed (and dropped) as any attention would
        return a.out_proj(a.v_proj(query)), None


def build_hf_model(arch: str, length: int, args):
    """HF transformers' own BART (SDPA) or LED of bart_base's sizes (tiny ones with --smoke)."""
    import transformers  # imported here: run.py must import (and run every other arch) without it

    sizes = dict(
        d_model=768,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=12,
        decoder_attention_heads=12,
        encoder_ffn_dim=3072,
        decoder_ffn_dim=3072,
        vocab_size=50265,
    )
    if args.smoke:
        sizes.update(
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            vocab_size=100,
        )
    if arch == "hf_bart":
        config = transformers.BartConfig(max_position_embeddings=max(length, 1024), **sizes)
        model = transformers.BartForConditionalGeneration._from_config(config, attn_implementation="sdpa")
    else:
        config = transformers.LEDConfig(
            max_encoder_position_embeddings=max(length, 16384),
            max_decoder_position_embeddings=1024,
            attention_window=args.attention_window,
            **sizes,
        )
        model = transformers.LEDForConditionalGeneration(config)
    return model, make_dictionary(sizes["vocab_size"])


def make_step(model, dictionary, mode, length, args, device):
    g = torch.Generator().manual_seed(0)
    n_special = dictionary.nspecial
    batch = args.batch  # sequences of one length: no padding
    src = torch.randint(n_special, len(dictionary), (batch, length), generator=g)
    if getattr(model, "prepend_bos", True):  # LOCOST: T5 sources have no <s>
        src[:, 0] = dictionary.bos()
    src[:, -1] = dictionary.eos()
    src = src.to(device)
    lengths = torch.full((batch,), length, device=device)
    if not hasattr(model, "encoder"):  # an HF model (hf_bart, hf_led)
        return make_hf_step(model, dictionary, mode, src, args, g)
    if mode == "enc":
        model.eval()

        def step():
            with torch.no_grad():
                return model.encoder(src, src_lengths=lengths)["encoder_out"][0]

        return step
    if mode == "train":
        model.train()
        tgt = torch.randint(n_special, len(dictionary), (batch, args.target_len), generator=g).to(device)
        tgt[:, -1] = dictionary.eos()
        prev = torch.cat([tgt[:, -1:], tgt[:, :-1]], dim=1)  # fairseq's shifted target (eos first)

        def step():
            logits, _ = model(src, lengths, prev)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))
            loss.backward()
            model.zero_grad(set_to_none=True)
            return loss

        return step
    if mode == "gen":
        # prepared as fairseq-generate and the hub prepare it: attention weights are asked of the
        # alignment (last) decoder layer only
        model.prepare_for_inference_(SimpleNamespace(generation=SimpleNamespace(beam=args.beam, print_alignment=False)))
        model.eval()
        generator = SequenceGenerator(
            [model], dictionary, beam_size=args.beam, max_len_a=0, max_len_b=args.new_tokens, min_len=args.new_tokens
        )
        sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}

        def step():
            hyps = generator.generate([model], sample)
            return sum(h[0]["tokens"].numel() - 1 for h in hyps)  # new tokens of each best hypothesis (eos dropped)

        return step
    raise ValueError(mode)


def make_hf_step(model, dictionary, mode, src, args, g):
    """``make_step`` for an HF model: the same input, LED with the first token global."""
    kwargs = {"input_ids": src, "attention_mask": torch.ones_like(src)}
    if "LED" in type(model).__name__:
        glob = torch.zeros_like(src)
        glob[:, 0] = 1
        kwargs["global_attention_mask"] = glob
    if mode == "enc":
        model.eval()

        def step():
            with torch.no_grad():
                return model.get_encoder()(**kwargs).last_hidden_state

        return step
    if mode == "train":
        model.train()
        tgt = torch.randint(dictionary.nspecial, len(dictionary), (src.size(0), args.target_len), generator=g)
        tgt = tgt.to(src.device)

        def step():
            logits = model(**kwargs, decoder_input_ids=tgt).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))
            loss.backward()
            model.zero_grad(set_to_none=True)
            return loss

        return step
    raise ValueError(f"{mode}: the HF archs run enc and train only")
