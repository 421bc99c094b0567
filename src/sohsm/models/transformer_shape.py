"""What sizes make a transformer, without torch: read by a config's checks (and ``--help``) and by the model."""
from __future__ import annotations

#: how a transformer knows where a token is: a learned vector per position added to the embedding
#: (GPT-2's), or rotary embeddings that turn queries and keys by the position (RoFormer's, Llama's)
POSITIONS = ("learned", "rotary")

#: the MLP's width over the model's (GPT-2's)
MLP_RATIO = 4


def check_sizes(hidden_size: int, attention_heads: int, positions: str) -> str | None:
    """Why these sizes cannot make a transformer, in one line, or ``None`` when they can.

    >>> check_sizes(256, 3, "learned")
    'hidden_size (256) must be a multiple of attention_heads (3): each head takes hidden_size / attention_heads'
    """
    if hidden_size % attention_heads:
        return (f"hidden_size ({hidden_size}) must be a multiple of attention_heads ({attention_heads}): "
                "each head takes hidden_size / attention_heads")
    if positions == "rotary" and (hidden_size // attention_heads) % 2:
        return (f"rotary positions need an even head size, got hidden_size / attention_heads = "
                f"{hidden_size // attention_heads}")
    return None
