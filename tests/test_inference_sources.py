"""Sources typed at generation time (fairseq-interactive, the hub, lsg-fairseq-summarize) reach the
model as a binarized split's would: truncated with eos kept, ``<s>`` first where the model takes it,
padded on the right (lsg_fairseq.data.summarization_pairs.inference_sources)."""

import os

import pytest
import torch
from fairseq.data import data_utils

from conftest import TINY_LOCOST, TINY_LSG_BART, TOY_LSG, TOY_VOCAB, build_task_and_model, write_toy_dict

pytestmark = pytest.mark.usefixtures("single_thread")


def _task(data, *arch, max_source=40):
    task, model = build_task_and_model(
        [str(data), "--task", "long_document_summarization", *arch, "--max-source-positions", str(max_source)]
        + ["--max-target-positions", "32", "--cpu"]
    )
    return task, model.eval()


@pytest.mark.parametrize("arch", [TINY_LSG_BART, TINY_LOCOST], ids=["lsg_bart", "locost"])
def test_typed_sources_equal_the_binarized_splits(word_data, arch):
    """The valid split's sources, passed as fairseq-interactive passes lines (tokens + eos) and as
    the hub encodes them (``<s>`` first where the model takes it), give the items the split itself gives: the same
    truncation (most of these documents are longer than 40 tokens) and the same ``<s>`` (LSG-BART
    takes it, LOCOST does not)."""
    task, _ = _task(word_data, *arch)
    task.load_dataset("valid")
    split = task.dataset("valid")
    raw = data_utils.load_indexed_dataset(os.path.join(word_data, "valid.source-target.source"), task.src_dict)
    typed = [raw[i] for i in range(len(raw))]
    assert any(t.numel() > 40 for t in typed)  # truncation in play
    # the hub's encode puts <s> first where the model takes it (LongInputHubInterface.encode)
    hub_style = [torch.cat([t.new_tensor([task.src_dict.bos()]), t]) for t in typed] if task.prepend_bos else typed
    for sources in (typed, hub_style):
        made = task.build_dataset_for_inference(sources, torch.tensor([t.numel() for t in sources]))
        for i in range(len(split)):
            assert torch.equal(made[i]["source"], split[i]["source"]), i
    assert (split[0]["source"][0] == task.src_dict.bos()) == (arch is TINY_LSG_BART)


def test_a_batch_of_uneven_documents_encodes_each_as_alone(tmp_path):
    """LSG aligns its blocks from position 0: a left-padded short document (TranslationTask's
    default, so fairseq-interactive's and the hub's before) is read shifted. Batched with a longer
    one, each document's encoder states (at its own tokens) must equal its states alone, and the
    generated hypotheses too."""
    toy = write_toy_dict(tmp_path)
    task, model = _task(toy, *TINY_LSG_BART, *TOY_LSG, max_source=128)
    g = torch.Generator().manual_seed(3)
    # the short one is longer than a query block's local window (3 blocks of 8), so a shift changes
    # which of its tokens each block sees
    docs = [torch.cat([torch.randint(4, TOY_VOCAB - 1, (n,), generator=g), torch.tensor([2])]) for n in (100, 45)]
    generator = task.build_generator([model], type("Args", (), {"beam": 2, "max_len_b": 6})())

    def run(batch_docs):
        made = task.build_dataset_for_inference(batch_docs, torch.tensor([d.numel() for d in batch_docs]))
        sample = made.collater([made[i] for i in range(len(made))])
        net = sample["net_input"]
        with torch.no_grad():
            enc = model.encoder(net["src_tokens"], net["src_lengths"])
            out = task.inference_step(generator, [model], sample)
        states, pad = enc["encoder_out"][0].transpose(0, 1), enc["encoder_padding_mask"][0]
        by_id = {int(i): (states[row][~pad[row]], out[row][0]["tokens"].tolist()) for row, i in enumerate(sample["id"])}
        return [by_id[i] for i in range(len(batch_docs))]

    together = run(docs)
    for i, doc in enumerate(docs):
        (alone_states, alone_tokens), (states, tokens) = run([doc])[0], together[i]
        torch.testing.assert_close(states, alone_states, atol=1e-5, rtol=1e-5)
        assert tokens == alone_tokens
