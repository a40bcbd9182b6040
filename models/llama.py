"""Llama written the way HuggingFace transformers (~4.30/4.31, modeling_llama.py) writes it.

What matters is the ONNX graph a user gets when exporting `transformers.LlamaForCausalLM`: the module
tree and parameter names (`model.layers.0.self_attn.q_proj.weight`, ...) and the tensor operations
of every forward are HF's:

  - embed_tokens, no position table, no dropout anywhere, untied bias-free lm_head, and
    `logits.float()` at the end as 4.30 does;
  - LlamaDecoderLayer: input_layernorm (LlamaRMSNorm) -> self_attn -> residual ->
    post_attention_layernorm -> mlp -> residual;
  - LlamaAttention: separate bias-free q_proj/k_proj/v_proj/o_proj, grouped-query attention
    (num_key_value_heads divides num_attention_heads) with `repeat_kv`
    (x[:, :, None, :, :].expand(...).reshape(...)), rotary embeddings on q and k, scores
    `/ math.sqrt(head_dim)` plus an additive causal mask, softmax upcast to float32
    (`softmax(w, dim=-1, dtype=torch.float32).to(query_states.dtype)`);
  - LlamaRotaryEmbedding: inv_freq (a persistent buffer in 4.30 that forward does not read),
    cos_cached/sin_cached [1, 1, max_pos, head_dim] (persistent=False buffers, which torch inlines
    into the ONNX graph as Constants), sliced to seq_len in forward;
  - LlamaMLP: `down_proj(act_fn(gate_proj(x)) * up_proj(x))`.

Switches (like models/gpt.py's GPTConfig), all but `rope` numerically equal up to rounding (with
positions 0..T-1 and an all-ones attention mask), different in ONNX. `rope` "interleaved" rotates
other pairs of dimensions (2i, 2i+1 instead of i, i + d/2): another model with the same weights.

    rmsnorm      "hf":   HF's LlamaRMSNorm (`.to(float32)`, pow(2).mean, `* torch.rsqrt(var + eps)`,
                         `self.weight * hidden_states.to(input_dtype)`)
                 "div":  `x / torch.sqrt(torch.mean(x * x, -1, keepdim=True) + eps) * w`
    silu         "module": nn.SiLU (HF's ACT2FN["silu"], F.silu)    "manual": `x * torch.sigmoid(x)`
    rope         "half": rotate_half (Llama, NeoX)
                 "interleaved": GPT-J's rotate_every_two (`x[..., ::2]`, `x[..., 1::2]`,
                         `torch.stack((-x2, x1), dim=-1).flatten(-2)`) with the half-size tables
                         repeat_interleave'd to head_dim in forward, as GPT-J does
    rope_tables  "position_ids": HF's `cos[position_ids].unsqueeze(1)`, position_ids a forward
                         input [B, T]
                 "sliced": `cos[:, :, :seq_len]` broadcast over the batch, positions implicit
    mask         "finfo": HF's `_make_causal_mask` (full(finfo.min), masked_fill_ to 0 on and below
                         the diagonal, expanded to [B, 1, T, T])
                 "triu": `torch.full((s, s), float("-inf")).triu(1)` (Trilu, opset >= 14)
                 "tril": each attention masks its own scores, as GPT's do:
                         `w.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), finfo.min)`
                         (ConstantOfShape, Trilu, Not, Where; opset >= 14). The other two forms
                         reach the graph as an [s, s] float constant (64 GiB at s = 131072); this
                         one is built from its shape, so the file stays small at any length
    attention_mask  "none": no padding mask (only the causal one)
                 "input": an attention_mask input [B, T] (1 = keep), HF's `_expand_mask` added to
                         the causal mask
                 "ones": HF's own default when none is given: `torch.ones((B, T), dtype=bool)`
                         built inside forward, then `_expand_mask` as for "input"

`upcast_dtype` is torch.float32 as in HF; the float64 reference model of the tests sets it to
float64 (set_upcast_dtype) so that its "upcasts" do not round to float32.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from common import PreTrainedModel, check_divisible, check_switches

RMSNORM_FORMS = ("hf", "div")
SILU_FORMS = ("module", "manual")
ROPE_FORMS = ("half", "interleaved")
ROPE_TABLE_FORMS = ("position_ids", "sliced")
MASK_FORMS = ("finfo", "triu", "tril")
ATTENTION_MASK_FORMS = ("none", "input", "ones")


@dataclass
class LlamaConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 172
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 64
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    rope_theta: float = 10000.0
    pad_token_id: int = None
    tie_word_embeddings: bool = False
    rmsnorm: str = "hf"
    silu: str = "module"
    rope: str = "half"
    rope_tables: str = "position_ids"
    mask: str = "finfo"
    attention_mask: str = "none"

    def __post_init__(self):
        check_switches(self, (("rmsnorm", RMSNORM_FORMS), ("silu", SILU_FORMS), ("rope", ROPE_FORMS),
                              ("rope_tables", ROPE_TABLE_FORMS), ("mask", MASK_FORMS),
                              ("attention_mask", ATTENTION_MASK_FORMS)))
        check_divisible(self, "hidden_size", "num_attention_heads")
        check_divisible(self, "num_attention_heads", "num_key_value_heads")
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError("rotary embeddings need an even head size")


# Copied from transformers.models.bart.modeling_bart._make_causal_mask
def _make_causal_mask(input_ids_shape, dtype, device, past_key_values_length=0):
    """
    Make causal mask used for bi-directional self-attention.
    """
    bsz, tgt_len = input_ids_shape
    mask = torch.full((tgt_len, tgt_len), torch.tensor(torch.finfo(dtype).min, device=device), device=device)
    mask_cond = torch.arange(mask.size(-1), device=device)
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    mask = mask.to(dtype)

    if past_key_values_length > 0:
        mask = torch.cat([torch.zeros(tgt_len, past_key_values_length, dtype=dtype, device=device), mask], dim=-1)
    return mask[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len + past_key_values_length)


def _make_triu_causal_mask(input_ids_shape, dtype, device):
    """The other common form: -inf above the diagonal, built with triu (ONNX Trilu, opset >= 14)."""
    bsz, tgt_len = input_ids_shape
    mask = torch.full((tgt_len, tgt_len), float("-inf"), device=device).triu(1)
    return mask.to(dtype)[None, None, :, :]


# Copied from transformers.models.bart.modeling_bart._expand_mask
def _expand_mask(mask, dtype, tgt_len=None):
    """
    Expands attention_mask from `[bsz, seq_len]` to `[bsz, 1, tgt_seq_len, src_seq_len]`.
    """
    bsz, src_len = mask.size()
    tgt_len = tgt_len if tgt_len is not None else src_len

    expanded_mask = mask[:, None, None, :].expand(bsz, 1, tgt_len, src_len).to(dtype)

    inverted_mask = 1.0 - expanded_mask

    return inverted_mask.masked_fill(inverted_mask.to(torch.bool), torch.finfo(dtype).min)


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6, form="hf"):
        """
        LlamaRMSNorm is equivalent to T5LayerNorm
        """
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
        self.form = form
        self.upcast_dtype = torch.float32

    def forward(self, hidden_states):
        if self.form == "div":
            x = hidden_states
            return x / torch.sqrt(torch.mean(x * x, -1, keepdim=True) + self.variance_epsilon) * self.weight
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(self.upcast_dtype)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRotaryEmbedding(torch.nn.Module):
    def __init__(self, dim, max_position_embeddings=2048, base=10000, device=None, interleaved=False):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float().to(device) / dim))
        self.register_buffer("inv_freq", inv_freq)

        # Build here to make `torch.jit.trace` work.
        self.max_seq_len_cached = max_position_embeddings
        t = torch.arange(self.max_seq_len_cached, device=self.inv_freq.device, dtype=self.inv_freq.dtype)
        freqs = torch.einsum("i,j->ij", t, self.inv_freq)
        if interleaved:
            # GPT-J keeps the half-size tables and repeat_interleaves them in forward
            emb = freqs
        else:
            # Different from paper, but it uses a different permutation in order to obtain the same calculation
            emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos()[None, None, :, :], persistent=False)
        self.register_buffer("sin_cached", emb.sin()[None, None, :, :], persistent=False)

    def forward(self, x, seq_len=None):
        # x: [bs, num_attention_heads, seq_len, head_size]
        if seq_len > self.max_seq_len_cached:
            raise ValueError(f"sequence length {seq_len} > max_position_embeddings {self.max_seq_len_cached}")
        return (
            self.cos_cached[:, :, :seq_len, ...].to(dtype=x.dtype),
            self.sin_cached[:, :, :seq_len, ...].to(dtype=x.dtype),
        )


def rotate_half(x):
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x):
    """GPT-J's rotation of adjacent pairs."""
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)  # in einsum notation: rearrange(x, '... d j -> ... (d j)')


def apply_rotary_pos_emb(q, k, cos, sin, position_ids):
    # The first two dimensions of cos and sin are always 1, so we can `squeeze` them.
    cos = cos.squeeze(1).squeeze(0)  # [seq_len, dim]
    sin = sin.squeeze(1).squeeze(0)  # [seq_len, dim]
    cos = cos[position_ids].unsqueeze(1)  # [bs, 1, seq_len, dim]
    sin = sin[position_ids].unsqueeze(1)  # [bs, 1, seq_len, dim]
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def apply_rotary_pos_emb_sliced(q, k, cos, sin, rotate=rotate_half):
    """The tables already sliced to [1, 1, seq_len, dim]: position t of every row uses row t."""
    q_embed = (q * cos) + (rotate(q) * sin)
    k_embed = (k * cos) + (rotate(k) * sin)
    return q_embed, k_embed


def apply_rotary_pos_emb_interleaved(q, k, cos, sin, position_ids):
    """GPT-J's form on [bs, heads, seq, dim] states: half-size tables repeat_interleave'd to dim."""
    if position_ids is not None:
        cos = cos.squeeze(1).squeeze(0)[position_ids].unsqueeze(1)  # [bs, 1, seq_len, dim / 2]
        sin = sin.squeeze(1).squeeze(0)[position_ids].unsqueeze(1)
    # dim 3 as GPT-J writes it: torch 1.13's opset-13 repeat_interleave symbolic does `dim += rank` in
    # place on a negative dim's constant, which the JIT shares, so every other -1 in the graph (e.g. the
    # view(-1, seq_length) of position_ids) silently becomes 3 in the ONNX file
    cos = torch.repeat_interleave(cos, 2, 3)  # [.., seq_len, dim / 2] -> [.., seq_len, dim]
    sin = torch.repeat_interleave(sin, 2, 3)
    q_embed = (q * cos) + (rotate_every_two(q) * sin)
    k_embed = (k * cos) + (rotate_every_two(k) * sin)
    return q_embed, k_embed


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, silu="module"):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.act_fn = nn.SiLU() if silu == "module" else ManualSiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class ManualSiLU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


def repeat_kv(hidden_states, n_rep):
    """
    This is the equivalent of torch.repeat_interleave(x, dim=1, repeats=n_rep). The hidden states go from (batch,
    num_key_value_heads, seqlen, head_dim) to (batch, num_attention_heads, seqlen, head_dim)
    """
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class LlamaAttention(nn.Module):
    """Multi-headed attention from 'Attention Is All You Need' paper"""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.hidden_size // self.num_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.max_position_embeddings = config.max_position_embeddings
        self.rope = config.rope
        self.rope_tables = config.rope_tables
        self.mask = config.mask
        self.upcast_dtype = torch.float32

        self.q_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(self.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(self.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, self.hidden_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(self.head_dim, max_position_embeddings=self.max_position_embeddings,
                                               base=config.rope_theta, interleaved=config.rope == "interleaved")

    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        bsz, q_len, _ = hidden_states.size()

        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)

        query_states = query_states.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = key_states.view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        value_states = value_states.view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)

        kv_seq_len = key_states.shape[-2]
        cos, sin = self.rotary_emb(value_states, seq_len=kv_seq_len)
        if self.rope == "interleaved":
            query_states, key_states = apply_rotary_pos_emb_interleaved(
                query_states, key_states, cos, sin, position_ids if self.rope_tables == "position_ids" else None)
        elif self.rope_tables == "position_ids":
            query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin, position_ids)
        else:
            query_states, key_states = apply_rotary_pos_emb_sliced(query_states, key_states, cos, sin)

        # repeat k/v heads if n_kv_heads < n_heads
        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)

        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)

        if self.mask == "tril":
            causal = torch.ones(q_len, kv_seq_len, dtype=torch.bool, device=attn_weights.device).tril()
            attn_weights = attn_weights.masked_fill(~causal, torch.finfo(attn_weights.dtype).min)

        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask

        # upcast attention to fp32
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=self.upcast_dtype).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)

        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(bsz, q_len, self.hidden_size)

        attn_output = self.o_proj(attn_output)
        return attn_output


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.self_attn = LlamaAttention(config=config)
        self.mlp = LlamaMLP(hidden_size=self.hidden_size, intermediate_size=config.intermediate_size,
                            silu=config.silu)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps, form=config.rmsnorm)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps,
                                                     form=config.rmsnorm)

    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        residual = hidden_states

        hidden_states = self.input_layernorm(hidden_states)

        # Self Attention
        hidden_states = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                       position_ids=position_ids)
        hidden_states = residual + hidden_states

        # Fully Connected
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class LlamaPreTrainedModel(PreTrainedModel):
    """HF's LlamaPreTrainedModel._init_weights is models/common.py's PreTrainedModel._init_weights (the
    model has no nn.LayerNorm, so only its nn.Linear and nn.Embedding branches apply)."""


    def set_upcast_dtype(self, dtype):
        """HF upcasts RMSNorm and softmax to float32; a float64 reference model upcasts to float64."""
        for m in self.modules():
            if hasattr(m, "upcast_dtype"):
                m.upcast_dtype = dtype
        return self


class LlamaModel(LlamaPreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size

        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps, form=config.rmsnorm)

    # Copied from transformers.models.bart.modeling_bart.BartDecoder._prepare_decoder_attention_mask
    def _prepare_decoder_attention_mask(self, attention_mask, input_shape, inputs_embeds, past_key_values_length):
        # create causal mask
        # [bsz, seq_len] -> [bsz, 1, tgt_seq_len, src_seq_len]
        combined_attention_mask = None
        if input_shape[-1] > 1 and self.config.mask != "tril":  # "tril": each attention masks its scores
            if self.config.mask == "triu":
                combined_attention_mask = _make_triu_causal_mask(input_shape, inputs_embeds.dtype,
                                                                 device=inputs_embeds.device)
            else:
                combined_attention_mask = _make_causal_mask(
                    input_shape,
                    inputs_embeds.dtype,
                    device=inputs_embeds.device,
                    past_key_values_length=past_key_values_length,
                )

        if attention_mask is not None:
            # [bsz, seq_len] -> [bsz, 1, tgt_seq_len, src_seq_len]
            expanded_attn_mask = _expand_mask(attention_mask, inputs_embeds.dtype, tgt_len=input_shape[-1]).to(
                inputs_embeds.device
            )
            combined_attention_mask = (
                expanded_attn_mask if combined_attention_mask is None else expanded_attn_mask + combined_attention_mask
            )

        return combined_attention_mask

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        batch_size, seq_length = input_ids.shape
        seq_length_with_past = seq_length
        past_key_values_length = 0

        if self.config.rope_tables == "position_ids":
            if position_ids is None:
                device = input_ids.device
                position_ids = torch.arange(
                    past_key_values_length, seq_length + past_key_values_length, dtype=torch.long, device=device
                )
                position_ids = position_ids.unsqueeze(0).view(-1, seq_length)
            else:
                position_ids = position_ids.view(-1, seq_length).long()

        inputs_embeds = self.embed_tokens(input_ids)
        # embed positions
        if attention_mask is None and self.config.attention_mask == "ones":
            attention_mask = torch.ones(
                (batch_size, seq_length_with_past), dtype=torch.bool, device=inputs_embeds.device
            )
        attention_mask = self._prepare_decoder_attention_mask(
            attention_mask, (batch_size, seq_length), inputs_embeds, past_key_values_length
        )

        hidden_states = inputs_embeds

        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, attention_mask=attention_mask, position_ids=position_ids)

        hidden_states = self.norm(hidden_states)
        return hidden_states


class LlamaForCausalLM(LlamaPreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.upcast_dtype = torch.float32
        self.apply(self._init_weights)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        """Token ids [B, T] (int64), optionally attention_mask [B, T] and position_ids [B, T], to logits."""
        hidden_states = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        logits = self.lm_head(hidden_states)
        logits = logits.float() if self.upcast_dtype == torch.float32 else logits.to(self.upcast_dtype)
        return logits
