"""Phi (phi-1, phi-1.5) written the way HuggingFace transformers (~4.37, modeling_phi.py) writes it.

What matters is the ONNX graph a user gets when exporting `transformers.PhiForCausalLM` (eager
attention): the module tree and parameter names (`model.layers.0.self_attn.q_proj.weight`, ...) and the
tensor operations of every forward are HF's:

  - embed_tokens, embed_dropout, no position table, final_layernorm, an untied `lm_head` Linear WITH
    bias, the logits cast by `.float()`;
  - PhiDecoderLayer: one LayerNorm `input_layernorm` read by both blocks, resid_dropout after each,
    `attn_outputs + feed_forward_hidden_states + residual` (the parallel residual with one norm: sp's
    gpt-j family);
  - PhiAttention: separate q_proj, k_proj, v_proj and dense, all WITH bias (no qk_layernorm, as many
    key/value heads as heads), each viewed to [b, s, heads, d] and transposed to [b, heads, s, d];
    rotary on the first `int(partial_rotary_factor * head_dim)` dims (PhiRotaryEmbedding: Llama's
    cos/sin cache, sliced to the sequence and looked up by position ids), rotate_half, the rest
    passed through and concatenated back; `matmul(q.to(float32), k.to(float32).transpose(2, 3)) /
    math.sqrt(head_dim)`, the additive causal mask, softmax in float32, dropout, matmul by v;
  - PhiMLP: fc1 -> gelu_new (NewGELUActivation, tanh) -> fc2, with biases;
  - the causal mask of `_prepare_4d_causal_attention_mask` without an attention mask
    (AttentionMaskConverter.to_causal_4d, i.e. `_make_causal_mask`: full(finfo.min), zeroed on and
    below the diagonal, expanded to [b, 1, s, s]).

Only what a training export needs is kept: no past key/values, no attention_mask input (4.37 merges
it into the causal mask by masked_fill, a form not covered here), no loss inside the model, and
forward returns the logits. `upcast_dtype` is HF's float32 (the scores' upcast, softmax's dtype, the
logits' `.float()`); the float64 reference model of the tests sets it to float64 (set_upcast_dtype).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from common import PreTrainedModel, check_divisible

# export_family.py's --rotary-pct: partial_rotary_factor (phi-1 and phi-1.5: 0.5).
ROTARY_PCTS = ("0.5", "0.25", "1.0")


@dataclass
class PhiConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0
    attention_dropout: float = 0.0
    hidden_act: str = "gelu_new"
    max_position_embeddings: int = 64
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.5

    def __post_init__(self):
        check_divisible(self, "hidden_size", "num_attention_heads")
        if int(self.partial_rotary_factor * (self.hidden_size // self.num_attention_heads)) % 2:
            raise ValueError("rotary embeddings need an even number of rotary dims")

    @property
    def num_key_value_heads(self):
        return self.num_attention_heads


class NewGELUActivation(nn.Module):
    """transformers.activations.NewGELUActivation (ACT2FN["gelu_new"])."""

    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


def _make_causal_mask(input_ids_shape, dtype, device, past_key_values_length=0):
    """AttentionMaskConverter._make_causal_mask (4.37), without a sliding window."""
    bsz, tgt_len = input_ids_shape
    # HF's full() takes the default dtype, float32: the same graph, but the float64 reference's finfo.min
    # would overflow it, so the mask is made in its own dtype.
    mask = torch.full((tgt_len, tgt_len), torch.finfo(dtype).min, device=device, dtype=dtype)
    mask_cond = torch.arange(mask.size(-1), device=device)
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)

    mask = mask.to(dtype)

    if past_key_values_length > 0:
        mask = torch.cat([torch.zeros(tgt_len, past_key_values_length, dtype=dtype, device=device), mask], dim=-1)

    return mask[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len + past_key_values_length)


class PhiRotaryEmbedding(nn.Module):
    def __init__(self, dim, max_position_embeddings=2048, base=10000, device=None):
        super().__init__()

        self.dim = dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2).float().to(device) / self.dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

        # Build here to make `torch.jit.trace` work.
        self._set_cos_sin_cache(
            seq_len=max_position_embeddings, device=self.inv_freq.device, dtype=torch.get_default_dtype()
        )

    def _set_cos_sin_cache(self, seq_len, device, dtype):
        self.max_seq_len_cached = seq_len
        t = torch.arange(self.max_seq_len_cached, device=device, dtype=self.inv_freq.dtype)

        freqs = torch.outer(t, self.inv_freq)
        # Different from paper, but it uses a different permutation in order to obtain the same calculation
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin_cached", emb.sin().to(dtype), persistent=False)

    def forward(self, x, seq_len=None):
        # x: [bs, num_attention_heads, seq_len, head_size]
        if seq_len > self.max_seq_len_cached:
            raise ValueError(f"seq_len {seq_len} > max_position_embeddings {self.max_seq_len_cached}")

        return (
            self.cos_cached[:seq_len].to(dtype=x.dtype),
            self.sin_cached[:seq_len].to(dtype=x.dtype),
        )


def rotate_half(x):
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim=1):
    cos = cos[position_ids].unsqueeze(unsqueeze_dim)
    sin = sin[position_ids].unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class PhiMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.activation_fn = NewGELUActivation()  # ACT2FN[config.hidden_act], "gelu_new"
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states):
        hidden_states = self.fc1(hidden_states)
        hidden_states = self.activation_fn(hidden_states)
        hidden_states = self.fc2(hidden_states)
        return hidden_states


class PhiAttention(nn.Module):
    """Multi-headed attention from 'Attention Is All You Need' paper"""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.attention_dropout = config.attention_dropout
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.hidden_size // self.num_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.max_position_embeddings = config.max_position_embeddings
        self.rope_theta = config.rope_theta
        self.partial_rotary_factor = config.partial_rotary_factor
        self.is_causal = True

        self.q_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(self.hidden_size, self.num_key_value_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(self.hidden_size, self.num_key_value_heads * self.head_dim, bias=True)
        self.dense = nn.Linear(self.num_heads * self.head_dim, self.hidden_size, bias=True)
        self.rotary_emb = PhiRotaryEmbedding(
            int(self.partial_rotary_factor * self.head_dim),
            max_position_embeddings=self.max_position_embeddings,
            base=self.rope_theta,
        )
        self.upcast_dtype = torch.float32

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

        # Partial rotary embedding
        query_rot, query_pass = (
            query_states[..., : self.rotary_emb.dim],
            query_states[..., self.rotary_emb.dim :],
        )
        key_rot, key_pass = (
            key_states[..., : self.rotary_emb.dim],
            key_states[..., self.rotary_emb.dim :],
        )
        # [batch_size, seq_length, num_heads, head_dim // config.partial_rotary_factor]
        query_rot, key_rot = apply_rotary_pos_emb(query_rot, key_rot, cos, sin, position_ids)

        # [batch_size, seq_length, num_heads, head_dim]
        query_states = torch.cat((query_rot, query_pass), dim=-1)
        key_states = torch.cat((key_rot, key_pass), dim=-1)

        # (repeat_kv is the identity: as many key/value heads as heads.)

        # Queries and keys upcast to fp32 is required by Phi-2 to avoid overflow
        attn_weights = torch.matmul(
            query_states.to(self.upcast_dtype), key_states.to(self.upcast_dtype).transpose(2, 3)
        ) / math.sqrt(self.head_dim)

        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask

        # upcast attention to fp32
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=self.upcast_dtype).to(value_states.dtype)
        attn_weights = nn.functional.dropout(attn_weights, p=self.attention_dropout, training=self.training)

        attn_output = torch.matmul(attn_weights, value_states)

        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(bsz, q_len, self.hidden_size)

        attn_output = self.dense(attn_output)
        return attn_output


class PhiDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = PhiAttention(config)
        self.mlp = PhiMLP(config)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        residual = hidden_states

        hidden_states = self.input_layernorm(hidden_states)

        # Self Attention
        attn_outputs = self.self_attn(hidden_states, attention_mask=attention_mask, position_ids=position_ids)
        attn_outputs = self.resid_dropout(attn_outputs)

        feed_forward_hidden_states = self.resid_dropout(self.mlp(hidden_states))
        hidden_states = attn_outputs + feed_forward_hidden_states + residual
        return hidden_states


class PhiPreTrainedModel(PreTrainedModel):
    """HF's PhiPreTrainedModel._init_weights is models/common.py's PreTrainedModel._init_weights."""


class PhiModel(PhiPreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_dropout = nn.Dropout(config.embd_pdrop)
        self.layers = nn.ModuleList([PhiDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids, position_ids=None):
        batch_size, seq_length = input_ids.shape[:2]
        past_key_values_length = 0

        if position_ids is None:
            device = input_ids.device
            position_ids = torch.arange(
                past_key_values_length, seq_length + past_key_values_length, dtype=torch.long, device=device
            )
            position_ids = position_ids.unsqueeze(0)

        inputs_embeds = self.embed_tokens(input_ids)
        inputs_embeds = self.embed_dropout(inputs_embeds)

        # 4d mask is passed through the layers (_prepare_4d_causal_attention_mask, no attention_mask)
        attention_mask = _make_causal_mask((batch_size, seq_length), inputs_embeds.dtype, inputs_embeds.device,
                                           past_key_values_length)

        hidden_states = inputs_embeds
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, attention_mask=attention_mask, position_ids=position_ids)

        hidden_states = self.final_layernorm(hidden_states)
        return hidden_states


class PhiForCausalLM(PhiPreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = PhiModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.logits_dtype = torch.float32
        self.apply(self._init_weights)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_upcast_dtype(self, dtype):
        """HF upcasts the scores and softmax to float32; a float64 reference model upcasts to float64."""
        self.logits_dtype = dtype
        for layer in self.model.layers:
            layer.self_attn.upcast_dtype = dtype

    def forward(self, input_ids, position_ids=None):
        """Token ids [B, T] (int64), optionally position_ids [B, T], to logits."""
        hidden_states = self.model(input_ids, position_ids=position_ids)
        logits = self.lm_head(hidden_states)
        return logits.to(self.logits_dtype)  # HF: logits.float()
