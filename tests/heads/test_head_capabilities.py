"""What a head says it can do, asked instead of its name or class: take a model's word vectors
(set_word_vectors, logits_are_linear), leave parameters without a gradient (skips_parameters), learn its
clusters (learns_clusters)."""
import pytest
import torch
import torch.nn.functional as F

from sohsm.heads import build_head, head_names, learns_clusters

D, N = 16, 40


def _counts() -> torch.Tensor:
    return torch.arange(N, 0, -1).double()


def test_a_full_softmax_given_a_linear_layers_weights_computes_that_layer_and_a_softmax_exactly():
    torch.manual_seed(0)
    head = build_head("full", D, N, bias=True).double()
    weight, bias = torch.randn(N, D, dtype=torch.float64), torch.randn(N, dtype=torch.float64)
    assert head.logits_are_linear
    head.set_word_vectors(weight, bias)
    hidden = torch.randn(5, D, dtype=torch.float64)
    torch.testing.assert_close(head.log_prob(hidden), F.log_softmax(hidden @ weight.T + bias, dim=-1),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["two_level_frequency", "self_organized"])
def test_a_two_level_head_given_word_vectors_reads_each_word_through_its_cluster_layout(name):
    torch.manual_seed(0)
    head = build_head(name, D, N, counts=_counts()).double()
    weight = torch.randn(N, D, dtype=torch.float64)
    clusters_before = head.cluster_weight.detach().clone()
    assert not head.logits_are_linear  # its scores are a product of two softmaxes, not one linear layer
    head.set_word_vectors(weight)
    torch.testing.assert_close(head.embed(torch.arange(N)), weight, rtol=0, atol=0)
    torch.testing.assert_close(head.cluster_weight, clusters_before, rtol=0, atol=0)


def test_word_vectors_of_the_wrong_shape_or_for_a_head_without_such_vectors_are_refused():
    with pytest.raises(ValueError, match=r"shape \(40, 15\) for a head of 40 words x 16 inputs"):
        build_head("full", D, N).set_word_vectors(torch.randn(N, D - 1))
    with pytest.raises(ValueError, match="AdaptiveSoftmax keeps no \\[N, d\\] word vectors"):
        build_head("adaptive", D, N, cutoffs=[10, 20]).set_word_vectors(torch.randn(N, D))
    with pytest.raises(ValueError, match="entries in bands"):
        build_head("two_level_frequency", D, N, counts=_counts(), div_value=2.0,
                   cutoffs=[10, 20]).set_word_vectors(torch.randn(N, D))


def test_only_adaptive_softmax_says_a_step_can_leave_its_parameters_without_a_gradient():
    """DDP searches for unused parameters only where a head says so; tests/heads/distributed.py trains every head
    under DDP with exactly that setting, so a head that skips parameters without saying so fails there."""
    skipping = [name for name in ("full", "adaptive", "two_level_frequency", "self_organized")
                if build_head(name, D, N, counts=_counts(), **({"cutoffs": [10, 20]} if name == "adaptive" else {}))
                .skips_parameters]
    assert skipping == ["adaptive"]


def test_the_heads_that_learn_their_clusters_are_the_self_organizing_ones():
    assert [name for name in head_names() if learns_clusters(name)] == ["self_organized"]
    with pytest.raises(ValueError, match=r"unknown head 'self_organised'; did you mean self_organized\?"):
        learns_clusters("self_organised")


def test_only_heads_that_read_words_through_their_own_layout_lend_an_embedding_that_calls_embed():
    from sohsm.heads.tying import HeadEmbedding

    with pytest.raises(TypeError, match="FullSoftmax has no embed\\(ids\\)"):  # it lends its parameter instead
        HeadEmbedding(build_head("full", D, N))
    with pytest.raises(ValueError, match="TreeSoftmax cannot embed words: "):
        build_head("tree", D, N).embed(torch.tensor([1, 2]))
    head = build_head("two_level_frequency", D, N, counts=_counts())
    ids = torch.tensor([[3, 0], [39, 7]])
    torch.testing.assert_close(HeadEmbedding(head)(ids), head.embed(ids), rtol=0, atol=0)
