"""A decoder-only transformer language model that produces hidden states; a head turns them into a loss.

    ids [T, B] -> embedding [T, B, d] (+ learned positions) -> dropout
               -> L pre-LayerNorm blocks:  x + attention(LN(x)),  x + MLP(LN(x))   (causal; rotary on q, k if chosen)
               -> LayerNorm -> hidden [T, B, d]

Written with torch's own parts: :func:`torch.nn.functional.scaled_dot_product_attention`
with ``is_causal=True`` (a GPU takes its flash kernel), :class:`torch.nn.LayerNorm`,
a GELU MLP four times as wide as the model, dropout on the embeddings, the attention
weights and each residual branch. As :class:`~sohsm.models.LSTMLanguageModel`, it never
makes logits: any head of :mod:`sohsm.heads` built with ``in_features = hidden_size``
scores the hidden states. It takes and returns what the LSTM model does, ``(hidden,
state)``, so the same training, evaluation and decoding code runs either model; a
transformer carries nothing from one window to the next, so its state is always ``None``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sohsm.heads.base import Head
from sohsm.models.transformer_shape import MLP_RATIO, POSITIONS, check_sizes  # noqa: F401  (exported here too)
from sohsm.models.tying import tie_embedding


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention over ``[B, T, d]`` with the causal mask, by ``scaled_dot_product_attention``."""

    def __init__(self, hidden_size: int, attention_heads: int, dropout: float, rotary: bool) -> None:
        super().__init__()
        self.heads, self.head_size, self.rotary = attention_heads, hidden_size // attention_heads, rotary
        self.dropout_p = dropout
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_size).permute(2, 0, 3, 1, 4)  # each [B, h, T, d/h]
        if self.rotary:
            cos, sin = rotary_angles(t, self.head_size, x.device)
            q, k = rotate(q, cos, sin).to(v.dtype), rotate(k, cos, sin).to(v.dtype)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p if self.training else 0.0,
                                           is_causal=True)  # [B, h, T, d/h]
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A pre-LayerNorm transformer block: ``x + attention(LN(x))``, then ``x + MLP(LN(x))``."""

    def __init__(self, hidden_size: int, attention_heads: int, dropout: float, rotary: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size)
        self.attention = CausalSelfAttention(hidden_size, attention_heads, dropout, rotary)
        self.norm2 = nn.LayerNorm(hidden_size)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, MLP_RATIO * hidden_size), nn.GELU(),
                                 nn.Linear(MLP_RATIO * hidden_size, hidden_size))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.dropout(self.attention(self.norm1(x)))
        return x + self.dropout(self.mlp(self.norm2(x)))


def rotary_angles(length: int, head_size: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(cos, sin)``, each ``[length, head_size]``, of the rotary embedding (base 10000, halves rotated)."""
    inverse = 1.0 / 10000 ** (torch.arange(0, head_size, 2, device=device, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inverse)  # [T, d/2]
    angles = torch.cat([angles, angles], dim=-1)  # [T, d]
    return angles.cos(), angles.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x [..., T, d]`` turned by the rotary angles (the first and second halves of each vector form pairs)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class TransformerLM(nn.Module):
    """Embedding, positions and a stack of causal pre-LayerNorm blocks: token ids in, hidden states out.

    Each call reads its window on its own (no state is carried), as a decoder-only
    transformer is trained: token ``t`` sees tokens ``0 .. t`` of its window.

    Args:
        vocab_size: number of word ids ``N``.
        hidden_size: the model's width ``d`` (embedding, blocks), the ``in_features`` of the head. Default: 512.
        layers: number of blocks. Default: 4.
        attention_heads: heads of each attention; must divide ``hidden_size``. Default: 8.
        context: the longest window (``bptt`` of a run); learned positions have that many vectors. Default: 128.
        dropout: on the embeddings, the attention weights and each residual branch. Default: 0.0.
        positions: ``"learned"`` (GPT-2's) or ``"rotary"``. Default: ``"learned"``.
        batch_first: ids ``[B, T]`` and hidden ``[B, T, d]`` instead of time first (as ``nn.Transformer``).
            Default: ``False``, the layout of :func:`sohsm.data.batchify` and of the LSTM model.

    Shape:
        - input: ``[T, B]`` long word ids (``[B, T]`` with ``batch_first``), ``T <= context`` for learned positions
        - state: ``None`` (the LSTM model's argument; a transformer carries none)
        - returns ``(hidden [T, B, hidden_size], None)`` (``[B, T, hidden_size]`` with ``batch_first``)

    Example::

        >>> import sohsm
        >>> ids = torch.randint(0, 1000, (21, 4))            # [T + 1, B]: 4 columns of text
        >>> model = TransformerLM(1000, hidden_size=32, layers=2, attention_heads=4, context=20)
        >>> head = sohsm.build_head("two_level_random", 32, 1000)
        >>> hidden, _ = model(ids[:-1])                      # [T, B, 32]
        >>> loss = head(hidden, ids[1:]).loss                # the head flattens [T, B, d] to [T*B, d]
        >>> tuple(hidden.shape)
        (20, 4, 32)
    """

    def __init__(self, vocab_size: int, hidden_size: int = 512, layers: int = 4, attention_heads: int = 8,
                 context: int = 128, dropout: float = 0.0, positions: str = "learned",
                 batch_first: bool = False) -> None:
        super().__init__()
        for name, value, low in (("vocab_size", vocab_size, 2), ("hidden_size", hidden_size, 1), ("layers", layers, 1),
                                 ("attention_heads", attention_heads, 1), ("context", context, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, got {positions!r}")
        problem = check_sizes(hidden_size, attention_heads, positions)
        if problem:
            raise ValueError(problem)
        self.vocab_size, self.hidden_size, self.layers = vocab_size, hidden_size, layers
        self.attention_heads, self.context, self.positions = attention_heads, context, positions
        self.dropout_p, self.batch_first = float(dropout), batch_first
        self.embedding: nn.Module = nn.Embedding(vocab_size, hidden_size)  # or, tied, the head's (tie_weights)
        self.position_embedding = nn.Embedding(context, hidden_size) if positions == "learned" else None
        self.dropout = nn.Dropout(self.dropout_p)
        self.blocks = nn.ModuleList(Block(hidden_size, attention_heads, self.dropout_p, positions == "rotary")
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(hidden_size)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation: normal(0, 0.02), zero biases, the residual projections scaled by 1/sqrt(2L)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        for block in self.blocks:
            assert isinstance(block, Block)  # (a ModuleList of them)
            for projection in (block.attention.out, block.mlp[2]):
                assert isinstance(projection, nn.Linear)  # the residual projections
                nn.init.normal_(projection.weight, std=0.02 / math.sqrt(2 * self.layers))

    def forward(self, input: Tensor, state: None = None) -> tuple[Tensor, None]:
        if not isinstance(input, Tensor) or input.dim() != 2 or input.dtype != torch.long:
            got = f"{tuple(input.shape)} {input.dtype}" if isinstance(input, Tensor) else type(input).__name__
            layout = "[B, T]" if self.batch_first else "[T, B]"
            raise ValueError(f"input must be a {layout} long tensor of word ids, got {got}")
        if state is not None:
            raise ValueError("a transformer carries no state from one window to the next: pass state=None")
        ids = input if self.batch_first else input.t()  # [B, T]
        length = ids.size(1)
        if self.position_embedding is not None and length > self.context:
            raise ValueError(f"a window of {length} tokens is longer than the {self.context} learned positions "
                             "(context)")
        x = self.embedding(ids)  # [B, T, d]
        if self.position_embedding is not None:
            x = x + self.position_embedding(torch.arange(length, device=ids.device))
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x)
        hidden = self.norm(x)  # [B, T, d]
        return (hidden if self.batch_first else hidden.transpose(0, 1)), None

    def decayed_parameters(self) -> list[Tensor]:
        """The weights of the blocks' linear maps: the parameters weight decay applies to (embeddings,
        positions, LayerNorms and biases are left out, as GPT-2 and nanoGPT leave them)."""
        return [m.weight for block in self.blocks for m in block.modules() if isinstance(m, nn.Linear)]

    @staticmethod
    def init_embedding(weight: Tensor) -> Tensor:
        """``N(0, 0.02)``, GPT-2's start for its word embedding, which its output layer shares."""
        return nn.init.normal_(weight, std=0.02)

    def tie_weights(self, head: Head) -> None:
        """Make the embedding the output word vectors of ``head`` (as :meth:`LSTMLanguageModel.tie_weights` does).

        Raises:
            ValueError: the head has no word vectors to share, or they are not ``hidden_size`` wide.
        """
        self.embedding = tie_embedding(self.embedding, head, init=self.init_embedding)

    def extra_repr(self) -> str:
        return (f"context={self.context}, positions={self.positions!r}, attention_heads={self.attention_heads}, "
                f"dropout={self.dropout_p}, batch_first={self.batch_first}")
