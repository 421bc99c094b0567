"""An attention encoder-decoder that makes hidden states for a head (the paper's headline model, §5).

    source [S, B] -> embedding -> LSTM encoder -> states E [S, B, d]          (packed: padding never read)
    target_in [T, B] -> embedding -> LSTM decoder (starts from the encoder's last state) -> h [T, B, d]
    attention: a = softmax_s(h_t . W E_s) over the real source words; c_t = sum_s a_s E_s
    hidden [T, B, d] = tanh(W_o [c_t; h_t])                                    -> any head

Luong et al.'s (2015) global attention with the "general" score. The decoder
does not feed the previous attention back in, so teacher-forced training runs
the decoder LSTM over the whole title at once; :meth:`AttentionSeq2Seq.step`
runs one step of the same computation for beam search.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from sohsm.models.lstm_lm import LSTMState


class Encoded(NamedTuple):
    """The encoder's output for a batch.

    Attributes:
        states: ``[S, B, d]`` encoder states (zeros past each source's end).
        mask: ``[S, B]`` true at real source words.
        keys: ``[S, B, d]`` the states projected by the attention's ``W``.
        final: ``(h, c)`` after each source's last word, each ``[1, B, d]``.
    """

    states: Tensor
    mask: Tensor
    keys: Tensor
    final: LSTMState

    def repeat(self, k: int) -> Encoded:
        """Each source ``k`` times in a row (for ``k`` beams): batch ``B`` becomes ``B * k``."""
        return Encoded(self.states.repeat_interleave(k, 1), self.mask.repeat_interleave(k, 1),
                       self.keys.repeat_interleave(k, 1),
                       (self.final[0].repeat_interleave(k, 1), self.final[1].repeat_interleave(k, 1)))


class AttentionSeq2Seq(nn.Module):
    """One-layer LSTM encoder and decoder with global attention; hidden states out, never logits.

    Args:
        vocab_size: rows of the shared embedding (the output words plus ``<pad>`` and ``<s>``).
        pad_id: the padding id (its embedding stays zero and is never updated).
        emb_size: word embedding size. Default: 512 (the paper's).
        hidden_size: LSTM size ``d`` = the head's ``in_features``. Default: 512 (the paper's).

    Shape:
        - source: ``[S, B]`` ids, padded with ``pad_id`` after each source's end
        - source_lengths: ``[B]`` words per source (at least 1)
        - target_in: ``[T, B]`` decoder inputs (``<s>`` then the title)
        - returns ``hidden [T, B, hidden_size]``

    Example::

        >>> model = AttentionSeq2Seq(100, pad_id=98, emb_size=16, hidden_size=16)
        >>> source = torch.tensor([[5, 6], [7, 98]])                     # [S=2, B=2]
        >>> hidden = model(source, torch.tensor([2, 1]), torch.tensor([[99, 99], [8, 9]]))
        >>> tuple(hidden.shape)
        (2, 2, 16)
    """

    def __init__(self, vocab_size: int, pad_id: int, emb_size: int = 512, hidden_size: int = 512) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("emb_size", emb_size), ("hidden_size", hidden_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id must be in [0, {vocab_size}), got {pad_id}")
        self.vocab_size, self.pad_id, self.emb_size, self.hidden_size = vocab_size, pad_id, emb_size, hidden_size
        self.embedding = nn.Embedding(vocab_size, emb_size, padding_idx=pad_id)
        self.encoder = nn.LSTM(emb_size, hidden_size)
        self.decoder = nn.LSTM(emb_size, hidden_size)
        self.attention = nn.Linear(hidden_size, hidden_size, bias=False)
        self.output = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        with torch.no_grad():
            self.embedding.weight[self.pad_id].zero_()
        for module in (self.encoder, self.decoder, self.attention, self.output):
            module.reset_parameters()

    def lstm_parameters(self) -> list[nn.Parameter]:
        """The encoder's and decoder's LSTM parameters (those weight decay applies to, as in the LM)."""
        return list(self.encoder.parameters()) + list(self.decoder.parameters())

    def decayed_parameters(self) -> list[nn.Parameter]:
        """The parameters weight decay applies to (``optim.weight_decay``): the LSTMs'."""
        return self.lstm_parameters()

    # -- encoder ------------------------------------------------------------------------
    def encode(self, source: Tensor, source_lengths: Tensor) -> Encoded:
        """Run the encoder over a padded batch of sources."""
        if source.dim() != 2 or source.dtype != torch.long:
            raise ValueError(f"source must be a [S, B] long tensor, got {tuple(source.shape)} {source.dtype}")
        if source_lengths.shape != (source.size(1),) or bool((source_lengths < 1).any()):
            raise ValueError(f"source_lengths must be [B] = [{source.size(1)}] positive lengths, "
                             f"got {tuple(source_lengths.shape)}")
        packed = pack_padded_sequence(self.embedding(source), source_lengths.cpu(), enforce_sorted=False)
        output, final = self.encoder(packed)
        states, _ = pad_packed_sequence(output, total_length=source.size(0))  # [S, B, d]
        mask = torch.arange(source.size(0), device=source.device)[:, None] < source_lengths.to(source.device)[None]
        return Encoded(states, mask, self.attention(states), final)

    # -- decoder ------------------------------------------------------------------------
    def attend(self, decoded: Tensor, encoded: Encoded) -> Tensor:
        """``tanh(W_o [c; h])`` for decoder outputs ``decoded [T, B, d]`` -> ``[T, B, d]``."""
        scores = torch.einsum("tbd,sbd->bts", decoded, encoded.keys)  # [B, T, S]
        scores = scores.masked_fill(~encoded.mask.t()[:, None, :], float("-inf"))
        weights = scores.softmax(dim=-1)
        context = torch.einsum("bts,sbd->tbd", weights, encoded.states)  # [T, B, d]
        return torch.tanh(self.output(torch.cat([context, decoded], dim=-1)))

    def decode(self, target_in: Tensor, encoded: Encoded, state: LSTMState | None = None) -> tuple[Tensor, LSTMState]:
        """Decoder hidden states for inputs ``target_in [T, B]``, from ``state`` (default: the encoder's last)."""
        decoded, state = self.decoder(self.embedding(target_in), encoded.final if state is None else state)
        return self.attend(decoded, encoded), state

    def forward(self, source: Tensor, source_lengths: Tensor, target_in: Tensor) -> Tensor:
        hidden, _ = self.decode(target_in, self.encode(source, source_lengths))
        return hidden

    def step(self, previous: Tensor, encoded: Encoded, state: LSTMState | None) -> tuple[Tensor, LSTMState]:
        """One decoder step: previous words ``[B]`` -> ``(hidden [B, d], state)``."""
        hidden, state = self.decode(previous[None], encoded, state)
        return hidden[0], state
