"""A nanoGPT-style GPT whose ONNX export exercises the sp frontend.

The model is the usual decoder-only Transformer (token and position embeddings,
L pre-norm blocks of causal self-attention and a GELU MLP, a final LayerNorm
and a bias-free output layer). Several switches in `GPTConfig` change nothing
numerically (up to rounding) but change what torch writes into the ONNX graph,
so that the canonicalizer can be tested against every common export form:

    layernorm  "module": nn.LayerNorm (fused LayerNormalization at opset >= 17)
               "manual": written out by hand (always ReduceMean/Sub/Pow/...)
    gelu       "erf":    nn.GELU() (Div/Erf/Add/Mul/Mul)
               "tanh":   the tanh approximation written with torch.pow
    linear     "matmul": nn.Linear on 3D input (MatMul with Transpose + Add)
               "gemm":   flatten to [B*T, C] so that biased linears become Gemm
    mask       "buffer": a persistent bool tril buffer [1,1,S,S], sliced
               "trilu":  the mask built at run time with torch.tril (opset >= 14)
    scale      "div":    att / sqrt(hd)     "mul": att * (1 / sqrt(hd))
    tied       lm_head.weight is transformer.wte.weight

This file is a library; `export_gpt.py` is its command line.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import check_divisible, check_switches, num_params

LAYERNORM_FORMS = ("module", "manual")
GELU_FORMS = ("erf", "tanh")
LINEAR_FORMS = ("matmul", "gemm")
MASK_FORMS = ("buffer", "trilu")
SCALE_FORMS = ("div", "mul")


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.1
    layernorm: str = "module"
    gelu: str = "erf"
    linear: str = "matmul"
    mask: str = "buffer"
    scale: str = "div"
    tied: bool = True

    def __post_init__(self):
        check_switches(self, (("layernorm", LAYERNORM_FORMS), ("gelu", GELU_FORMS), ("linear", LINEAR_FORMS),
                              ("mask", MASK_FORMS), ("scale", SCALE_FORMS)))
        check_divisible(self, "n_embd", "n_head")


class ManualLayerNorm(nn.Module):
    """LayerNorm over the last dimension, written out so it always exports decomposed."""

    def __init__(self, ndim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class TanhGELU(nn.Module):
    """The tanh approximation of GELU, written with torch.pow so it exports as Pow/Tanh.

    (torch 1.13's own nn.GELU(approximate="tanh") exports x^3 as Mul(x, Mul(x, x)).)
    """

    def forward(self, x):
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


class Linear(nn.Linear):
    """nn.Linear that can flatten its input to 2D so that torch exports a Gemm."""

    def __init__(self, in_features, out_features, bias=True, flatten=False):
        super().__init__(in_features, out_features, bias=bias)
        self.flatten = flatten

    def forward(self, x):
        if not self.flatten:
            return super().forward(x)
        y = super().forward(x.reshape(-1, x.size(-1)))
        return y.reshape(x.size(0), x.size(1), self.out_features)


def make_layernorm(config):
    if config.layernorm == "manual":
        return ManualLayerNorm(config.n_embd)
    return nn.LayerNorm(config.n_embd)


def make_linear(config, in_features, out_features, bias=True):
    return Linear(in_features, out_features, bias=bias, flatten=config.linear == "gemm")


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = make_linear(config, config.n_embd, 3 * config.n_embd)
        self.c_proj = make_linear(config, config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.mask_form = config.mask
        self.scale_form = config.scale
        self.head_dim = config.n_embd // config.n_head
        if config.mask == "buffer":  # nanoGPT's name: state-dict key transformer.h.<i>.attn.bias
            tril = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
            self.register_buffer("bias", tril.view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        att = self.scaled(q @ k.transpose(-2, -1))
        att = att.masked_fill(self.masked_out(T), float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def scaled(self, att):
        if self.scale_form == "mul":
            return att * (1.0 / math.sqrt(self.head_dim))
        return att / math.sqrt(self.head_dim)

    def masked_out(self, T):
        """Bool [1, 1, T, T] (buffer) or [T, T] (trilu), True where a query must not see a key."""
        if self.mask_form == "buffer":
            return ~self.bias[:, :, :T, :T]
        return ~torch.ones(T, T, dtype=torch.bool).tril()


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = make_linear(config, config.n_embd, 4 * config.n_embd)
        self.gelu = TanhGELU() if config.gelu == "tanh" else nn.GELU()
        self.c_proj = make_linear(config, 4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_layernorm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_layernorm(config)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=make_layernorm(config),
        ))
        self.lm_head = make_linear(config, config.n_embd, config.vocab_size, bias=False)
        if config.tied:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self):
        """Trainable parameters, a tied embedding counted once, buffers not counted."""
        return num_params(self)

    def forward(self, idx):
        """Token ids [B, T] (int64) to logits [B, T, vocab]."""
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))
