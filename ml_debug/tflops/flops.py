"""The arithmetic of `mldebug tflops`: pure functions, no torch.

Two formulas, both per iteration of the whole job:

- parameter count (the seed handbook's, and torchtitan's with the attention term): a token costs
  2N FLOPs forward and 4N backward, so 6N per token; full activation recomputation runs the
  forward twice, 8N ("hardware" FLOPs). With the depth, width and sequence length known, the
  attention scores and values add 12 * L * h * s per token (8 * L * h * s more when recomputed).
- Megatron-LM's Equation 3 (Narayanan et al. 2021, section 5.1), for a GPT shape (4h MLP, no
  GQA): 72 * B * s * L * h^2 * (1 + s/(6h) + V/(12 L h)) without recomputation and
  96 * B * s * L * h^2 * (1 + s/(6h) + V/(16 L h)) with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ml_debug.core.errors import UsageError

SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(word: str) -> float:
    """'52B', '1.3b', '7e9', '124M' -> a number of parameters."""
    text = word.strip().upper().replace("_", "")
    unit = text[-1:] if text[-1:] in SUFFIXES and text[-1:] else ""
    try:
        value = float(text[: len(text) - len(unit)]) * SUFFIXES[unit]
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > 1e15:
        raise UsageError(f"--params {word!r} is not a parameter count",
                         "give a positive number, with K, M, B or T: e.g. --params 52B or --params 124M")
    return value


@dataclass(frozen=True)
class Shape:
    """What the formulas need to know of the model."""

    params: float
    """Parameters that do matrix work per token (the embedding table excluded where known)."""
    layers: int | None = None
    hidden: int | None = None
    vocab: int | None = None
    gpt_like: bool = False
    """A 4h MLP with as many key/value heads as query heads: Megatron's Equation 3 holds exactly."""
    source: str = "--params"


def _int(cfg: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def shape_from_hf_config(cfg: dict[str, Any], source: str) -> Shape:
    """A Hugging Face `config.json` (Llama, Mistral, Qwen, GPT-2/NeoX style keys) -> its Shape.

    Counted: per layer the q, k, v and output projections (k and v with the key/value heads), the
    MLP (three matrices when gated, as Llama's SiLU MLP, else two), and the output layer
    (the LM head does matrix work per token even when tied to the embedding)."""
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _int(cfg, "vocab_size", "padded_vocab_size")
    missing = [name for name, v in (("hidden_size", hidden), ("num_hidden_layers", layers), ("vocab_size", vocab))
               if v is None]
    if missing:
        raise UsageError(f"{source}: no {', '.join(missing)} in the model's config",
                         "give a Hugging Face config.json of a decoder model, or --params N")
    assert hidden and layers and vocab
    heads = _int(cfg, "num_attention_heads", "n_head") or 1
    kv_heads = _int(cfg, "num_key_value_heads", "multi_query_group_num") or heads
    head_dim = _int(cfg, "head_dim") or hidden // heads
    ffn = _int(cfg, "intermediate_size", "n_inner", "ffn_hidden_size") or 4 * hidden
    model_type = str(cfg.get("model_type", ""))
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "")))
    gated = model_type in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mixtral") or "silu" in act \
        or "swiglu" in act
    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    mlp = (3 if gated else 2) * hidden * ffn
    params = layers * (attn + mlp) + hidden * vocab
    gpt_like = not gated and kv_heads == heads and ffn == 4 * hidden and heads * head_dim == hidden
    return Shape(float(params), layers, hidden, vocab, gpt_like, source)


@dataclass(frozen=True)
class Flops:
    """FLOPs of one iteration of the whole job, and how they were counted."""

    model: float
    hardware: float
    formula: str
    """The formula in words and symbols, as the output prints it."""


def per_iteration(shape: Shape, tokens: float, seq_len: int | None, recompute: bool, megatron: bool) -> Flops:
    """Model and hardware FLOPs of one iteration that processes ``tokens`` tokens in all."""
    if megatron:
        if not (shape.layers and shape.hidden and shape.vocab and seq_len):
            raise UsageError("--formula megatron needs the depth, width, vocabulary and sequence length",
                             "give --hf-config config.json and --seq-len (or use --formula params)")
        L, h, V, s = shape.layers, shape.hidden, shape.vocab, seq_len
        batch = tokens / s
        model = 72 * batch * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
        hardware = 96 * batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
        text = ("Megatron-LM Eq. 3: 72*B*s*L*h^2*(1 + s/6h + V/12Lh) (model), "
                "96*B*s*L*h^2*(1 + s/6h + V/16Lh) (with recomputation)")
        return Flops(model, hardware if recompute else model, text)
    n = shape.params
    attn = 12 * shape.layers * shape.hidden * seq_len if shape.layers and shape.hidden and seq_len else 0.0
    model = tokens * (6 * n + attn)
    hardware = tokens * (8 * n + attn * 4 / 3) if recompute else model
    text = "6*N per token" + (" + 12*L*h*s attention" if attn else "")
    if recompute:
        text += "; hardware 8*N" + (" + 16*L*h*s" if attn else "") + " (forward recomputed)"
    return Flops(model, hardware, text)
