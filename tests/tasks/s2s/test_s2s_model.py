"""The encoder-decoder and its decoding: padding changes no loss, beam 1 is greedy, beam scores add up."""
import pytest
import torch

from sohsm.data.pairs import make_batch
from sohsm.data.vocab import Vocabulary
from sohsm.heads import build_head
from sohsm.models.beam import beam_search, greedy_decode
from sohsm.models.seq2seq import AttentionSeq2Seq
from sohsm.tasks.s2s import target_rows

N = 40  # output words; ids N and N + 1 are <pad> and <s>


def _vocab() -> Vocabulary:
    words = ["<eos>", "<unk>"] + [f"w{i}" for i in range(N - 2)]
    return Vocabulary(words, list(range(N, 0, -1)))


def _setup(head_name="self_organized", seed=0):
    torch.manual_seed(seed)
    vocab = _vocab()
    model = AttentionSeq2Seq(N + 2, pad_id=N, emb_size=16, hidden_size=16).eval()
    head = build_head(head_name, 16, N, counts=torch.from_numpy(vocab.counts.copy())).eval()
    return vocab, model, head


def _pairs(generator, count, low=3, high=9):
    lengths = torch.randint(low, high, (count, 2), generator=generator)
    sources = [torch.randint(2, N, (int(a),), generator=generator).numpy() for a, _ in lengths]
    targets = [torch.randint(2, N, (int(b),), generator=generator).numpy() for _, b in lengths]
    return sources, targets


@torch.no_grad()
def test_padding_changes_no_loss():
    """Each pair's summed log-probability is the same alone as padded in a batch with longer pairs."""
    vocab, model, head = _setup()
    sources, targets = _pairs(torch.Generator().manual_seed(1), 6)
    sources[0], targets[0] = sources[0][:2], targets[0][:1]  # the shortest: the most padding in the batch
    batch = make_batch(sources, targets, vocab)
    hidden, target = target_rows(model, batch, N)
    assert target.numel() == sum(len(t) + 1 for t in targets) and not bool((target == N).any())
    real = batch.target_out != N  # [T, B]
    per_row = torch.zeros(real.shape).masked_scatter(real, head(hidden, target).output)  # back to [T, B]
    for i in range(len(sources)):
        alone = head(*target_rows(model, make_batch([sources[i]], [targets[i]], vocab), N)).output.sum()
        assert float(per_row[:, i].sum()) == pytest.approx(float(alone), abs=1e-4)


@pytest.mark.filterwarnings("ignore:SelfOrganizedSoftmax is training without an attached optimizer")
def test_padding_reaches_no_cluster_statistic():
    vocab, model, head = _setup()
    head.train()
    sources, targets = _pairs(torch.Generator().manual_seed(2), 4)
    hidden, target = target_rows(model, make_batch(sources, targets, vocab), N)
    before = head.q.clone()
    head(hidden, target)
    changed = (head.q != before).any(dim=1).nonzero().reshape(-1)
    assert set(changed.tolist()) <= set(target.tolist())


@pytest.mark.parametrize("head_name", ["full", "self_organized", "two_level_frequency"])
@pytest.mark.parametrize("allow_eos", [True, False])
def test_beam_of_one_is_greedy(head_name, allow_eos):
    vocab, model, head = _setup(head_name)
    sources, _ = _pairs(torch.Generator().manual_seed(3), 5)
    batch = make_batch(sources, None, vocab)
    kw = dict(bos_id=N + 1, eos_id=vocab.eos_id, max_len=8, allow_eos=allow_eos)
    beams = beam_search(model, head, batch.source, batch.source_lengths, beam=1, **kw)
    greedy = greedy_decode(model, head, batch.source, batch.source_lengths, **kw)
    assert [h.ids for h in beams] == [h.ids for h in greedy]
    assert [h.ended for h in beams] == [h.ended for h in greedy]
    assert [h.score for h in beams] == pytest.approx([h.score for h in greedy], abs=1e-4)
    if not allow_eos:
        assert all(len(h.ids) == 8 and vocab.eos_id not in h.ids for h in beams)


@pytest.mark.parametrize("head_name", ["full", "self_organized"])
@torch.no_grad()
def test_a_beam_score_is_the_sum_of_its_token_log_probs(head_name):
    """Teacher-forcing each hypothesis (and </s> when it ended) gives back its beam score."""
    vocab, model, head = _setup(head_name, seed=4)
    sources, _ = _pairs(torch.Generator().manual_seed(5), 6)
    batch = make_batch(sources, None, vocab)
    found = beam_search(model, head, batch.source, batch.source_lengths, bos_id=N + 1, eos_id=vocab.eos_id,
                        beam=5, max_len=6)
    for source, hypothesis in zip(sources, found):
        words = torch.tensor(hypothesis.ids, dtype=torch.long)
        target_out = torch.cat([words, torch.tensor([vocab.eos_id])]) if hypothesis.ended else words
        target_in = torch.cat([torch.tensor([N + 1]), words])[: target_out.numel()]
        hidden = model(torch.from_numpy(source)[:, None], torch.tensor([len(source)]), target_in[:, None])
        expected = head(hidden[:, 0], target_out).output.sum()
        assert hypothesis.score == pytest.approx(float(expected), abs=1e-4)


def test_a_wider_beam_never_scores_worse_than_greedy_on_ended_hypotheses():
    vocab, model, head = _setup("full", seed=6)
    sources, _ = _pairs(torch.Generator().manual_seed(7), 8)
    batch = make_batch(sources, None, vocab)
    kw = dict(bos_id=N + 1, eos_id=vocab.eos_id, max_len=10)
    one = beam_search(model, head, batch.source, batch.source_lengths, beam=1, **kw)
    five = beam_search(model, head, batch.source, batch.source_lengths, beam=5, **kw)
    for a, b in zip(one, five):
        if a.ended and b.ended:
            assert b.score >= a.score - 1e-5
