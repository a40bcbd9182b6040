"""GPT-J written the way HuggingFace transformers (~4.31, modeling_gptj.py) writes it.

What matters is the ONNX graph a user gets when exporting `transformers.GPTJForCausalLM`: the module
tree and parameter names (`transformer.h.0.attn.q_proj.weight`, ...) and the tensor operations of
every forward are HF's:

  - wte, drop, no position table, ln_f, an untied `lm_head` Linear WITH bias;
  - GPTJBlock: one LayerNorm `ln_1` read by both blocks, `attn_output + feed_forward_hidden_states +
    residual` (the parallel residual with one norm: sp's gpt-j family);
  - GPTJAttention: separate q_proj, k_proj, v_proj and out_proj, all without bias; q and k viewed to
    [b, s, heads, d] and NOT permuted yet (`_split_heads(..., rotary=True)`), v permuted to
    [b, heads, s, d]; the sinusoid table `embed_positions` ([max_positions, rotary_dim], sin | cos,
    a plain attribute, so traced as a constant) repeated over the batch of position ids, gathered
    (`torch.gather(embed_positions, 1, position_ids.unsqueeze(-1).repeat(1, 1, rotary_dim))`) and
    split into sin and cos; rotary on the first rotary_dim dims of each head with
    `rotate_every_two` (interleaved pairs) and the tables `repeat_interleave`d by 2 on
    [b, s, 1, rotary_dim / 2], the rest passed through and concatenated back; only then q and k
    permuted to [b, heads, s, d];
  - _attn: q and k cast to float32, `matmul(q, kᵀ)`, the bool causal `bias` buffer (persistent=False)
    applied by `torch.where(causal_mask, w, finfo.min)`, THEN divided by `scale_attn` (sqrt(head_dim));
    an optional additive attention mask, softmax, attn_dropout, matmul by v;
  - GPTJMLP: fc_in -> gelu_new (NewGELUActivation, tanh) -> fc_out (with biases) -> dropout;
  - optionally an attention_mask input [B, T] (1 = keep), turned into the additive
    `(1.0 - mask[:, None, None, :]) * finfo.min` of GPTJModel.forward.

Only what a training export needs is kept: no past key/values, no head mask, no loss inside the
model, and forward returns the logits (`.to(torch.float32)` as HF's). `upcast_dtype` and `logits_dtype` are
HF's float32 (`query.to(torch.float32)`, the logits' cast); the float64 reference model of the tests sets
them to float64 (set_upcast_dtype) so that they do not round to float32.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from common import PreTrainedModel, check_divisible

# export_family.py's --rotary-pct: rotary_dim = head size x pct (GPT-J-6B: 64 of 256).
ROTARY_PCTS = ("0.25", "0.5", "1.0")


@dataclass
class GPTJConfig:
    vocab_size: int = 256
    n_positions: int = 64
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    rotary_dim: int = 8
    n_inner: int = None
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0
    attn_pdrop: float = 0.0
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False

    def __post_init__(self):
        check_divisible(self, "n_embd", "n_head")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.n_embd // self.n_head:
            raise ValueError(f"rotary_dim {self.rotary_dim} must be even and at most the head size "
                             f"{self.n_embd // self.n_head}")

    @property
    def hidden_size(self):
        return self.n_embd

    @property
    def num_attention_heads(self):
        return self.n_head

    @property
    def max_position_embeddings(self):
        return self.n_positions


class NewGELUActivation(nn.Module):
    """transformers.activations.NewGELUActivation (ACT2FN["gelu_new"])."""

    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


def create_sinusoidal_positions(num_pos: int, dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2) / dim))
    sinusoid_inp = torch.einsum("i , j -> i j", torch.arange(num_pos, dtype=torch.float), inv_freq).float()
    return torch.cat((torch.sin(sinusoid_inp), torch.cos(sinusoid_inp)), dim=1)


def get_embed_positions(embed_positions, position_ids):
    return embed_positions.to(position_ids.device).repeat(position_ids.shape[0], 1, 1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)  # in einsum notation: rearrange(x, '... d j -> ... (d j)')


def apply_rotary_pos_emb(tensor: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
    return (tensor * cos) + (rotate_every_two(tensor) * sin)


class GPTJAttention(nn.Module):
    def __init__(self, config):
        super().__init__()

        max_positions = config.max_position_embeddings
        self.register_buffer(
            "bias",
            torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)).view(
                1, 1, max_positions, max_positions
            ),
            persistent=False,
        )
        self.register_buffer("masked_bias", torch.tensor(-1e9), persistent=False)

        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

        self.embed_dim = config.hidden_size
        self.num_attention_heads = config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_attention_heads
        if self.head_dim * self.num_attention_heads != self.embed_dim:
            raise ValueError(
                f"embed_dim must be divisible by num_attention_heads (got `embed_dim`: {self.embed_dim} and"
                f" `num_attention_heads`: {self.num_attention_heads})."
            )
        self.scale_attn = torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32)).to(torch.get_default_dtype())

        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.rotary_dim = config.rotary_dim
        pos_embd_dim = self.rotary_dim or self.embed_dim
        self.embed_positions = create_sinusoidal_positions(max_positions, pos_embd_dim)
        self.upcast_dtype = torch.float32

    def _split_heads(self, tensor, num_attention_heads, attn_head_size, rotary):
        """
        Splits hidden dim into attn_head_size and num_attention_heads
        """
        new_shape = tensor.size()[:-1] + (num_attention_heads, attn_head_size)
        tensor = tensor.view(new_shape)
        if rotary:
            return tensor
        if len(tensor.shape) == 5:
            return tensor.permute(0, 1, 3, 2, 4)  # (batch, blocks, head, block_length, head_features)
        elif len(tensor.shape) == 4:
            return tensor.permute(0, 2, 1, 3)  # (batch, head, seq_length, head_features)
        else:
            raise ValueError(f"Input tensor rank should be one of [4, 5], but is: {len(tensor.shape)}")

    def _merge_heads(self, tensor, num_attention_heads, attn_head_size):
        """
        Merges attn_head_size dim and num_attn_heads dim into hidden dim
        """
        if len(tensor.shape) == 5:
            tensor = tensor.permute(0, 1, 3, 2, 4).contiguous()
        elif len(tensor.shape) == 4:
            tensor = tensor.permute(0, 2, 1, 3).contiguous()
        else:
            raise ValueError(f"Input tensor rank should be one of [4, 5], but is: {len(tensor.shape)}")
        new_shape = tensor.size()[:-2] + (num_attention_heads * attn_head_size,)
        return tensor.view(new_shape)

    def _attn(self, query, key, value, attention_mask=None):
        # compute causal mask from causal mask buffer
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length]

        # Keep the attention weights computation in fp32 to avoid overflow issues
        query = query.to(self.upcast_dtype)
        key = key.to(self.upcast_dtype)

        attn_weights = torch.matmul(query, key.transpose(-1, -2))

        mask_value = torch.finfo(attn_weights.dtype).min
        # Need to be a tensor, otherwise we get error: `RuntimeError: expected scalar type float but found double`.
        # Need to be on the same device, otherwise `RuntimeError: ..., x and y to be on the same device`
        mask_value = torch.tensor(mask_value, dtype=attn_weights.dtype).to(attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)

        attn_weights = attn_weights / self.scale_attn

        if attention_mask is not None:
            # Apply the attention mask
            attn_weights = attn_weights + attention_mask

        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.to(value.dtype)
        attn_weights = self.attn_dropout(attn_weights)

        attn_output = torch.matmul(attn_weights, value)

        return attn_output, attn_weights

    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        query = self.q_proj(hidden_states)
        key = self.k_proj(hidden_states)
        value = self.v_proj(hidden_states)

        query = self._split_heads(query, self.num_attention_heads, self.head_dim, True)
        key = self._split_heads(key, self.num_attention_heads, self.head_dim, True)
        value = self._split_heads(value, self.num_attention_heads, self.head_dim, False)

        # HF takes this branch under torch.jit.is_tracing(), which torch.onnx.export is.
        embed_positions = get_embed_positions(self.embed_positions, position_ids)

        repeated_position_ids = position_ids.unsqueeze(-1).repeat(1, 1, embed_positions.shape[-1])
        sincos = torch.gather(embed_positions, 1, repeated_position_ids)
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)

        if self.rotary_dim is not None:
            k_rot = key[:, :, :, : self.rotary_dim]
            k_pass = key[:, :, :, self.rotary_dim :]

            q_rot = query[:, :, :, : self.rotary_dim]
            q_pass = query[:, :, :, self.rotary_dim :]

            k_rot = apply_rotary_pos_emb(k_rot, sin, cos)
            q_rot = apply_rotary_pos_emb(q_rot, sin, cos)

            key = torch.cat([k_rot, k_pass], dim=-1)
            query = torch.cat([q_rot, q_pass], dim=-1)
        else:
            key = apply_rotary_pos_emb(key, sin, cos)
            query = apply_rotary_pos_emb(query, sin, cos)

        key = key.permute(0, 2, 1, 3)
        query = query.permute(0, 2, 1, 3)

        # compute self-attention: V x Softmax(QK^T)
        attn_output, attn_weights = self._attn(query, key, value, attention_mask)

        attn_output = self._merge_heads(attn_output, self.num_attention_heads, self.head_dim)
        attn_output = self.out_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)
        return attn_output


class GPTJMLP(nn.Module):
    def __init__(self, intermediate_size, config):  # in MLP: intermediate_size= 4 * embed_dim
        super().__init__()
        embed_dim = config.n_embd

        self.fc_in = nn.Linear(embed_dim, intermediate_size)
        self.fc_out = nn.Linear(intermediate_size, embed_dim)

        self.act = NewGELUActivation()  # ACT2FN[config.activation_function], "gelu_new"
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states):
        hidden_states = self.fc_in(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.fc_out(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class GPTJBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        inner_dim = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = GPTJAttention(config)
        self.mlp = GPTJMLP(inner_dim, config)

    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_output = self.attn(hidden_states, attention_mask=attention_mask, position_ids=position_ids)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = attn_output + feed_forward_hidden_states + residual
        return hidden_states


class GPTJPreTrainedModel(PreTrainedModel):
    """HF's GPTJPreTrainedModel._init_weights is models/common.py's PreTrainedModel._init_weights."""


class GPTJModel(GPTJPreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_dim = config.n_embd
        self.vocab_size = config.vocab_size
        self.wte = nn.Embedding(config.vocab_size, self.embed_dim)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([GPTJBlock(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(self.embed_dim, eps=config.layer_norm_epsilon)

    @property
    def dtype(self):
        return self.wte.weight.dtype

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        input_shape = input_ids.size()
        input_ids = input_ids.view(-1, input_shape[-1])
        batch_size = input_ids.shape[0]
        device = input_ids.device
        past_length = 0

        if position_ids is not None:
            position_ids = position_ids.view(-1, input_shape[-1]).long()
        else:
            position_ids = torch.arange(past_length, input_shape[-1] + past_length, dtype=torch.long, device=device)
            position_ids = position_ids.unsqueeze(0).view(-1, input_shape[-1])

        # Attention mask.
        if attention_mask is not None:
            if batch_size <= 0:
                raise ValueError("batch_size has to be defined and > 0")
            attention_mask = attention_mask.view(batch_size, -1)
            attention_mask = attention_mask[:, None, None, :]
            attention_mask = attention_mask.to(dtype=self.dtype)  # fp16 compatibility
            attention_mask = (1.0 - attention_mask) * torch.finfo(self.dtype).min

        inputs_embeds = self.wte(input_ids)
        hidden_states = inputs_embeds
        hidden_states = self.drop(hidden_states)

        for block in self.h:
            hidden_states = block(hidden_states, attention_mask=attention_mask, position_ids=position_ids)

        hidden_states = self.ln_f(hidden_states)
        return hidden_states


class GPTJForCausalLM(GPTJPreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = GPTJModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size)
        self.logits_dtype = torch.float32
        self.apply(self._init_weights)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def set_upcast_dtype(self, dtype):
        """HF computes the scores in float32; a float64 reference model computes them in float64."""
        self.logits_dtype = dtype
        for block in self.transformer.h:
            block.attn.upcast_dtype = dtype

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        """Token ids [B, T] (int64), optionally attention_mask [B, T] and position_ids [B, T], to logits."""
        hidden_states = self.transformer(input_ids, attention_mask=attention_mask, position_ids=position_ids)
        # make sure sampling in fp16 works correctly and compute loss in fp32
        return self.lm_head(hidden_states).to(self.logits_dtype)
