"""Average context vectors: the mean hidden state before each word, against a one-pass dense computation."""
from __future__ import annotations

import torch

from sohsm.data import batchify
from sohsm.models import LSTMLanguageModel
from sohsm.tasks.lm.context import average_context_vectors

N, D = 30, 8


def test_average_context_vectors_match_dense_reference():
    torch.manual_seed(0)
    model = LSTMLanguageModel(N, emb_size=D, hidden_size=D, dropout=0.5)
    ids = torch.randint(0, N - 3, (301,))  # the last 3 words never occur
    vectors, counts = average_context_vectors(model, ids, N, batch_size=4, bptt=7)
    assert model.training  # restored
    with torch.no_grad():
        model.eval()
        data = batchify(ids, 4)
        hidden, _ = model(data[:-1])  # all windows at once: the same as carrying the state
        hidden, target = hidden.reshape(-1, D).double(), data[1:].reshape(-1)
    assert torch.equal(counts, torch.bincount(target, minlength=N))
    for w in range(N):
        expected = hidden[target == w].mean(0) if counts[w] else hidden.mean(0)
        torch.testing.assert_close(vectors[w].double(), expected, rtol=0, atol=1e-5)
    partial, partial_counts = average_context_vectors(model, ids, N, batch_size=4, bptt=7, max_tokens=20)
    assert 20 <= int(partial_counts.sum()) < int(counts.sum())
