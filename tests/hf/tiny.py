"""Tiny Hugging Face causal language models built from configs (nothing is downloaded), for the tests of sohsm.hf.

GPT-2 ties its output embedding to its input embedding by default, Llama does not: the two cover both ways
:func:`sohsm.hf.use_head` gives a model its head. No dropout, so that two runs of the same batches agree.
"""
from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB = 50
WIDTH = 16


def gpt2(vocab: int = VOCAB, seed: int = 0, **options) -> GPT2LMHeadModel:
    """A 2-layer GPT-2 (tied), ``WIDTH`` wide, no end-of-sequence token (so ``generate`` runs its length)."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_embd=WIDTH, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, **options)
    return GPT2LMHeadModel(config)


def llama(vocab: int = VOCAB, seed: int = 0, **options) -> LlamaForCausalLM:
    """A 2-layer Llama (untied), ``WIDTH`` wide, no end-of-sequence token."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=WIDTH, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None, **options)
    return LlamaForCausalLM(config)


MODELS = {"gpt2": gpt2, "llama": llama}


def counts(vocab: int = VOCAB) -> torch.Tensor:
    """Zipf-like token counts, most frequent first."""
    return (1000 / torch.arange(1, vocab + 1)).round().long() + 1


def token_ids(rows: int = 3, length: int = 12, vocab: int = VOCAB, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))
