"""An LSTM language model that produces hidden states; a head turns them into a loss.

    ids [T, B] -> embedding [T, B, e] -> dropout -> LSTM (L layers) [T, B, d] -> dropout -> hidden [T, B, d]

The model never makes logits: any head of :mod:`sohsm.heads` built with
``in_features = hidden_size`` scores the hidden states, so the same model runs
with a full softmax, a two-level softmax or the self-organized one.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from sohsm.heads.base import Head
from sohsm.models.tying import tie_embedding

#: the recurrent state ``(h, c)``, each ``[layers, B, hidden_size]``
LSTMState = tuple[Tensor, Tensor]


class LSTMLanguageModel(nn.Module):
    """Embedding, dropout and a multi-layer LSTM: token ids in, hidden states out.

    The recurrent state is returned so that truncated back-propagation through
    time can carry it (detached) from one window to the next; see
    :func:`detach_state`.

    Args:
        vocab_size: number of word ids ``N``.
        emb_size: size ``e`` of a word embedding. Default: 512 (the paper's text8 model).
        hidden_size: size ``d`` of the LSTM state, the ``in_features`` of the head. Default: 512.
        layers: number of stacked LSTM layers. Default: 1.
        dropout: dropout on the embeddings, between LSTM layers and on the
            output hidden states. Default: 0.0.

    Shape:
        - input: ``[T, B]`` long word ids (time first, as :func:`sohsm.data.batchify` lays them out)
        - state: ``None`` (zeros) or ``(h, c)``, each ``[layers, B, hidden_size]``
        - returns ``(hidden [T, B, hidden_size], state)``

    Example::

        >>> import sohsm
        >>> ids = torch.randint(0, 1000, (21, 4))            # [T + 1, B]: 4 columns of text
        >>> model = LSTMLanguageModel(1000, emb_size=32, hidden_size=32)
        >>> head = sohsm.build_head("two_level_random", 32, 1000)
        >>> hidden, state = model(ids[:-1])                  # [T, B, 32]
        >>> loss = head(hidden, ids[1:]).loss                # the head flattens [T, B, d] to [T*B, d]
        >>> tuple(hidden.shape), tuple(state[0].shape)
        ((20, 4, 32), (1, 4, 32))
        >>> hidden, state = model(ids[-1:], detach_state(state))  # the next window goes on from there
    """

    def __init__(self, vocab_size: int, emb_size: int = 512, hidden_size: int = 512, layers: int = 1,
                 dropout: float = 0.0, init_range: float = 0.1) -> None:
        super().__init__()
        for name, value, low in (("vocab_size", vocab_size, 2), ("emb_size", emb_size, 1),
                                 ("hidden_size", hidden_size, 1), ("layers", layers, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if isinstance(init_range, bool) or not float(init_range) > 0:
            raise ValueError(f"init_range must be positive, got {init_range!r}")
        self.init_range = float(init_range)
        self.vocab_size, self.emb_size, self.hidden_size = vocab_size, emb_size, hidden_size
        self.layers, self.dropout_p = layers, float(dropout)
        self.embedding: nn.Module = nn.Embedding(vocab_size, emb_size)  # or, tied, the head's (tie_weights)
        self.dropout = nn.Dropout(self.dropout_p)
        self.lstm = nn.LSTM(emb_size, hidden_size, num_layers=layers,
                            dropout=self.dropout_p if layers > 1 else 0.0)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if isinstance(self.embedding, nn.Embedding):  # a tied embedding is the head's, re-drawn when tied
            self.init_embedding(self.embedding.weight)
        self.lstm.reset_parameters()

    def init_embedding(self, weight: Tensor) -> Tensor:
        """``U(-r, r)`` with ``r = init_range``: 0.1 is the word LM's usual start (Zaremba et al.; pytorch/examples),
        tied or not."""
        return nn.init.uniform_(weight, -self.init_range, self.init_range)

    def forward(self, input: Tensor, state: LSTMState | None = None) -> tuple[Tensor, LSTMState]:
        if not isinstance(input, Tensor) or input.dim() != 2 or input.dtype != torch.long:
            got = f"{tuple(input.shape)} {input.dtype}" if isinstance(input, Tensor) else type(input).__name__
            raise ValueError(f"input must be a [T, B] long tensor of word ids, got {got}")
        if state is not None:
            expected = (self.layers, input.size(1), self.hidden_size)
            if len(state) != 2 or any(tuple(s.shape) != expected for s in state):
                raise ValueError(f"state must be (h, c), each of shape {expected}, got "
                                 f"{[tuple(s.shape) for s in state]}")
        emb = self.dropout(self.embedding(input))  # [T, B, e]
        output, state = self.lstm(emb, state)  # [T, B, d]
        return self.dropout(output), state

    def lstm_parameters(self) -> list[nn.Parameter]:
        """The LSTM's own parameters (the ones the paper applies weight decay to)."""
        return list(self.lstm.parameters())

    def decayed_parameters(self) -> list[nn.Parameter]:
        """The parameters weight decay applies to (``optim.weight_decay``): the LSTM's, as in the paper."""
        return self.lstm_parameters()

    def tie_weights(self, head: Head) -> None:
        """Make the embedding the output word vectors of ``head`` (:mod:`sohsm.models.tying`): the head lends
        the embedding (``head.tied_embedding()``): a full softmax its weight; a two-level head its rows read
        through its layout, which follows its clusters; adaptive softmax its adaptive input.

        Raises:
            ValueError: the head has no word vectors to share, or ``emb_size != hidden_size``.
        """
        if self.emb_size != self.hidden_size:
            raise ValueError(f"weight tying needs emb_size == hidden_size, got {self.emb_size} and {self.hidden_size}")
        self.embedding = tie_embedding(self.embedding, head, init=self.init_embedding)

    def extra_repr(self) -> str:
        return f"dropout={self.dropout_p}"


def detach_state(state: tuple[Tensor, ...] | None) -> LSTMState | None:
    """Cut the graph behind a carried state (truncated BPTT); ``None`` stays ``None``."""
    return None if state is None else (state[0].detach(), state[1].detach())
