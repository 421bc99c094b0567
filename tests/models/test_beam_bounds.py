"""Beam search's bounds: a beam wider than the vocabulary is cut to it, a batch too big is decoded in
pieces (same results), and a beam whose search cannot fit even one source is refused in one line."""
import pytest
import torch

from sohsm.heads import build_head
from sohsm.models import beam as beam_module
from sohsm.models.beam import BeamTooWide, available_memory_bytes, beam_memory_bytes, beam_search
from sohsm.models.seq2seq import AttentionSeq2Seq

N = 30  # output words; ids N and N + 1 are <pad> and <s>


def _setup(seed=0, batch=6):
    torch.manual_seed(seed)
    model = AttentionSeq2Seq(N + 2, pad_id=N, emb_size=8, hidden_size=8).eval()
    head = build_head("full", 8, N).eval()
    g = torch.Generator().manual_seed(seed + 1)
    lengths = torch.randint(2, 7, (batch,), generator=g)
    source = torch.full((int(lengths.max()), batch), N, dtype=torch.long)
    for b, n in enumerate(lengths.tolist()):
        source[:n, b] = torch.randint(2, N, (n,), generator=g)
    return model, head, source, lengths


KW = dict(bos_id=N + 1, eos_id=0, max_len=6)


def _same(a, b):
    assert [h.ids for h in a] == [h.ids for h in b] and [h.ended for h in a] == [h.ended for h in b]
    assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_a_beam_wider_than_the_vocabulary_is_cut_to_it():
    model, head, source, lengths = _setup()
    _same(beam_search(model, head, source, lengths, beam=10**9, **KW),
          beam_search(model, head, source, lengths, beam=N, **KW))
    _same(beam_search(model, head, source, lengths, beam=10**9, allow_eos=False, **KW),
          beam_search(model, head, source, lengths, beam=N - 1, allow_eos=False, **KW))


def test_a_batch_that_does_not_fit_is_decoded_in_pieces_with_the_same_results():
    model, head, source, lengths = _setup(batch=7)
    one = beam_memory_bytes(8, N, source.size(0), 8, KW["max_len"])
    whole = beam_search(model, head, source, lengths, beam=8, memory_limit=10 * one, **KW)
    pieces = beam_search(model, head, source, lengths, beam=8, memory_limit=2 * one + 1, **KW)
    _same(whole, pieces)


def test_a_beam_that_fits_no_source_is_refused_naming_the_widest_that_fits():
    model, head, source, lengths = _setup()
    limit = beam_memory_bytes(5, N, source.size(0), 8, KW["max_len"])
    with pytest.raises(BeamTooWide, match=r"^beam 1,000,000 \(cut to the vocabulary's 30 words\) needs about "
                                          r".* per source, more than the .* this search may use; "
                                          r"the widest that fits is 5$"):
        beam_search(model, head, source, lengths, beam=10**6, memory_limit=limit, **KW)
    assert issubclass(BeamTooWide, ValueError)  # bad input: callers that catch ValueError report it


def test_the_memory_at_hand_bounds_the_search_by_default(monkeypatch):
    model, head, source, lengths = _setup()
    monkeypatch.setattr(beam_module, "available_memory_bytes", lambda device: 2000)
    with pytest.raises(BeamTooWide, match="no beam fits"):
        beam_search(model, head, source, lengths, beam=20, **KW)


def test_the_estimate_grows_with_the_square_of_the_beam_and_the_memory_probe_answers():
    a, b = beam_memory_bytes(1000, 10_000, 40, 512, 30), beam_memory_bytes(2000, 10_000, 40, 512, 30)
    assert 2 * a < b < 4 * a
    available = available_memory_bytes("cpu")
    assert available is None or available > 0


@pytest.mark.parametrize("beam,max_len", [(0, 5), (True, 5), (2.5, 5), (3, 0)])
def test_bad_beam_arguments_name_the_argument(beam, max_len):
    model, head, source, lengths = _setup()
    name = "beam" if max_len else "max_len"
    with pytest.raises(ValueError, match=f"^{name} must be an integer >= 1"):
        beam_search(model, head, source, lengths, bos_id=N + 1, eos_id=0, beam=beam, max_len=max_len)
