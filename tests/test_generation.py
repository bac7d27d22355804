"""The task's generator: the CPU n-gram blocker (fairseq#5206) against a brute-force reference, and
the beam state it owns (fairseq#3893), restored after every call, an interrupted one included."""

import math
from argparse import Namespace

import pytest
import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock
from fairseq.sequence_generator import SequenceGenerator

from conftest import TINY_DIMS, TINY_LOCOST, TOY_LSG, build_task_and_model, toy_batch, write_toy_dict
from lsg_fairseq.generation import LongInputSequenceGenerator, NGramRepeatBlockFixed


def brute_force_banned(tokens, step, n):
    """For each row: tokens t such that (last n-1 generated tokens) + t already occurred."""
    banned = []
    for row in tokens.tolist():
        hist = row[: step + 1]
        out = set()
        if len(hist) >= n:
            prefix = hist[len(hist) - (n - 1) :] if n > 1 else []
            for i in range(len(hist) - n + 1):
                if hist[i : i + n - 1] == prefix:
                    out.add(hist[i + n - 1])
        banned.append(out)
    return banned


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("step", [0, 1, 2, 5, 11])
def test_fixed_blocker_equals_brute_force(n, step):
    g = torch.Generator().manual_seed(step * 10 + n)
    bsz, beam, vocab, max_len = 2, 3, 6, 16
    tokens = torch.full((bsz * beam, max_len + 2), 1)  # pad-filled buffer, as in SequenceGenerator
    tokens[:, : step + 1] = torch.randint(2, vocab, (bsz * beam, step + 1), generator=g)
    lprobs = torch.zeros(bsz * beam, vocab)
    out = NGramRepeatBlockFixed(n, use_extension=False)(tokens, lprobs, bsz, beam, step)
    for row, expected in zip(out, brute_force_banned(tokens, step, n)):
        got = {i for i, v in enumerate(row.tolist()) if v == -math.inf}
        assert got == expected


def test_stock_cpu_blocker_misses_repeats():
    """Documents the upstream bug the fixed blocker exists for: five identical tokens pass n=3."""
    tokens = torch.full((1, 10), 1)
    tokens[0, :5] = 7
    step = 4
    stock = NGramRepeatBlock(3, use_extension=False)(tokens, torch.zeros(1, 9), 1, 1, step)
    fixed = NGramRepeatBlockFixed(3, use_extension=False)(tokens, torch.zeros(1, 9), 1, 1, step)
    assert stock[0, 7] == 0.0
    assert fixed[0, 7] == -math.inf


# ---------------------------------------------------------------------------- the task's generator
TINY_ARCHS = {
    "bart": ["--arch", "bart_base", *TINY_DIMS, "--max-source-positions", "64", "--max-target-positions", "32"],
    "locost": [*TINY_LOCOST, "--max-target-positions", "32"],
    "lsg": ["--arch", "lsg_bart_tiny", *TINY_DIMS, *TOY_LSG, "--max-target-positions", "32"],  # 2 globals
}


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory):
    return write_toy_dict(tmp_path_factory.mktemp("generation_toy"))


def build(toy_dir, family):
    task, model = build_task_and_model([toy_dir, "--task", "long_document_summarization", *TINY_ARCHS[family]])
    return task, model.eval()


def beam_state(model):
    """Every instance attribute that set_beam_size may set, by module name."""
    return {
        (name, attr): module.__dict__[attr]
        for name, module in model.named_modules()
        for attr in ("beam_size", "reorder_encoder_out")
        if attr in module.__dict__
    }


def sample(n=3):
    src, lengths, _ = toy_batch(n=n, lengths=(45, 30, 20)[:n])
    return {"net_input": {"src_tokens": src, "src_lengths": lengths}}


def beam_seen(model):
    """What a generation call sees: the cross-attention beam (BART) / the encoder's (LOCOST)."""
    attn = getattr(model.decoder, "layers", None)
    return attn[0].encoder_attn.beam_size if attn is not None else model.encoder.beam_size


def test_stock_generator_leaves_the_beam_set(toy_dir):
    """fairseq#3893, the upstream bug: building a stock SequenceGenerator already changes BART."""
    task, model = build(toy_dir, "bart")
    SequenceGenerator([model], task.target_dictionary, beam_size=2)
    assert model.decoder.layers[0].encoder_attn.beam_size == 2
    assert "reorder_encoder_out" in model.encoder.__dict__  # the no-op, as an instance attribute


@pytest.mark.parametrize("family", ["bart", "locost"])
def test_task_generator_sets_the_beam_for_the_call_only(toy_dir, family):
    task, model = build(toy_dir, family)
    before = beam_state(model)
    gen = task.build_generator([model], Namespace(beam=2, max_len_b=5, no_repeat_ngram_size=2))
    assert isinstance(gen, LongInputSequenceGenerator)
    assert isinstance(gen.repeat_ngram_blocker, NGramRepeatBlockFixed)  # fairseq#5206
    assert beam_state(model) == before  # building it changed nothing
    seen = []
    model.decoder.embed_tokens.register_forward_hook(lambda *a: seen.append(beam_seen(model)))
    with torch.no_grad():
        hyps = task.inference_step(gen, [model], sample())
    assert len(hyps) == 3 and all(len(h) == 2 for h in hyps)
    assert seen and set(seen) == {2}  # beamable cross-attention while generating (one encoder row per source)
    assert beam_state(model) == before and beam_seen(model) == 1


@pytest.mark.parametrize("family", ["bart", "locost"])
def test_beam_state_restored_after_an_exception_in_generation(toy_dir, family):
    task, model = build(toy_dir, family)
    model.set_beam_size(3)  # whatever the caller had set is what comes back, not a default
    before = beam_state(model)
    gen = task.build_generator([model], Namespace(beam=2, max_len_b=5))
    calls = []

    def fail_on_third_call(*_):
        calls.append(beam_seen(model))
        if len(calls) == 3:
            raise RuntimeError("interrupted mid-generation")

    model.decoder.embed_tokens.register_forward_hook(fail_on_third_call)
    with pytest.raises(RuntimeError, match="interrupted mid-generation"), torch.no_grad():
        task.inference_step(gen, [model], sample())
    assert calls == [2, 2, 2]  # it failed while the generator's beam was set
    assert beam_state(model) == before and beam_seen(model) == 3


# ------------------------------------------------------- the attention generation returns, and ensembles
def hypo_attention(task, models, s):
    gen = task.build_generator(models, Namespace(beam=2, max_len_b=5))
    with torch.no_grad():
        return [h["attention"] for hyps in task.inference_step(gen, models, s) for h in hyps]


def test_lsg_attention_covers_the_source_tokens_only(toy_dir):
    """LSG's decoder attends to its 2 global tokens too; the attention it returns (fairseq's source x
    target alignment) leaves their columns out: column j is source token j, padding gets none."""
    task, model = build(toy_dir, "lsg")
    assert model.encoder.num_global_tokens == 2
    s = sample()  # rows of 45, 30 and 20 tokens, right-padded to 45
    lengths = s["net_input"]["src_lengths"].repeat_interleave(2)  # two hypotheses per row
    for attn, length in zip(hypo_attention(task, [model], s), lengths.tolist()):
        assert attn.shape[0] == 45
        assert (attn[:length] > 0).all() and (attn[length:] == 0).all()


def test_an_ensemble_of_lsg_and_bart(toy_dir):
    """fairseq's EnsembleModel adds its members' attentions: (2 + 45) and 45 columns failed with a size
    mismatch (LSG-BART with LED or BART, or two LSG-BARTs with different numbers of global tokens)."""
    task, lsg = build(toy_dir, "lsg")
    _, bart = build(toy_dir, "bart")
    s = sample()
    lengths = s["net_input"]["src_lengths"].repeat_interleave(2)
    for attn, length in zip(hypo_attention(task, [lsg, bart], s), lengths.tolist()):
        assert attn.shape[0] == 45 and (attn[length:] == 0).all()


# ------------------------------------------------------- cross-attention steps as one SDPA call
# the families whose decoder is the plugin's (LongSourceDecoder); `bart` is fairseq's own
FUSED_STEP_ARCHS = {
    "lsg": TINY_ARCHS["lsg"],
    "led": ["--arch", "led_tiny", *TINY_DIMS, "--attention-window", "8", "--max-target-positions", "32"],
}


@pytest.mark.parametrize("family", sorted(FUSED_STEP_ARCHS))
@pytest.mark.parametrize("beam", [1, 3])
def test_fused_cross_attention_steps_generate_what_fairseqs_path_does(toy_dir, family, beam, monkeypatch):
    """Decoding steps past the first take one SDPA call over the cached source keys in every layer
    that returns no weights (``fairseq-generate`` and the hub ask the last layer only,
    ``make_generation_fast_``): the same hypotheses, scores and alignment as fairseq's path in every
    layer (a model fresh from the build asks every layer for weights), float32, padded sources, a
    source's hypotheses folded onto its one cached row (beam 3) or not (greedy)."""
    from lsg_fairseq.models.cross_attention import LongSourceCrossAttention

    task, model = build_task_and_model(
        [toy_dir, "--task", "long_document_summarization", *FUSED_STEP_ARCHS[family], "--decoder-layers", "3"]
    )
    model.eval()
    fused_steps = []
    step = LongSourceCrossAttention._fused_step
    monkeypatch.setattr(
        LongSourceCrossAttention, "_fused_step", lambda self, *a: fused_steps.append(1) or step(self, *a)
    )

    def generate():
        gen = task.build_generator([model], Namespace(beam=beam, max_len_b=8, min_len=8))
        with torch.no_grad():
            return task.inference_step(gen, [model], sample())

    reference = generate()
    assert not fused_steps  # every layer asked for weights: fairseq's path throughout
    for layer in model.decoder.layers:
        layer.need_attn = False  # what make_generation_fast_(need_attn=False) sets
    fused = generate()
    assert len(fused_steps) == 2 * 8  # the two layers below the alignment layer, at each step past the first
    for ref_hyps, hyps in zip(reference, fused):
        assert [h["tokens"].tolist() for h in hyps] == [h["tokens"].tolist() for h in ref_hyps]
        for h, r in zip(hyps, ref_hyps):
            assert abs(h["score"] - r["score"]) < 1e-5 and torch.allclose(h["attention"], r["attention"], atol=1e-5)
