"""GPT-2 written the way HuggingFace transformers (~4.30, modeling_gpt2.py) writes it.

The point of this file is not another GPT (models/gpt.py is ours) but the ONNX graph a user gets
when exporting `transformers.GPT2LMHeadModel`: the module tree, the parameter names (so the state
dict and the ONNX initializers read `transformer.h.0.attn.c_attn.weight`, ...) and the tensor
operations of every forward are HF's, as of transformers 4.30:

  - Conv1D layers: weight [in, out], forward `torch.addmm(bias, x.view(-1, x.size(-1)), weight)`
    then a view back to [B, T, out] (exports as Reshape -> Gemm -> Reshape);
  - c_attn gives q/k/v by `.split(split_size, dim=2)`, heads by `_split_heads` (view + permute
    (0, 2, 1, 3)) and `_merge_heads` (permute + contiguous + view);
  - the `bias` buffer, a bool tril [1, 1, n_positions, n_positions] (persistent in 4.30, so an
    initializer named `transformer.h.<i>.attn.bias`), sliced to [.., k-q:k, :k] and used as
    `torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)` with
    `mask_value = torch.full([], torch.finfo(dtype).min)`; also 4.30's unused `masked_bias` buffer;
  - scores divided by `torch.full([], value.size(-1) ** 0.5)`;
  - `position_ids = torch.arange(past_length, T + past_length)` built inside forward when not given
    (the usual case), or a forward input;
  - NewGELUActivation (the tanh form with torch.pow(x, 3.0)), or the other `activation_function`s
    of HF's ACT2FN: "gelu" (nn.GELU, erf), "relu" (nn.ReLU), "silu" (nn.SiLU);
    ln_f, a bias-free lm_head tied to wte;
  - dropouts attn_pdrop (on the attention probabilities), resid_pdrop (after c_proj, twice per
    layer) and embd_pdrop (after the embeddings);
  - optionally an attention_mask input [B, T] (1 = keep), turned into the additive
    `(1.0 - mask[:, None, None, :]) * torch.finfo(dtype).min` of GPT2Model.forward.

Only what a training export needs is kept: no past key/values, no head mask, no cross attention,
no loss inside the model (the caller computes it from the logits), and forward returns the logits.
Switches that are not HF's own (for tests only):

    buffers  "hf430": HF 4.30's persistent `bias`/`masked_bias` buffers (ONNX initializers)
             "nonpersistent": 4.31+'s persistent=False buffers (torch inlines them as Constants)
    residual "sequential": GPT-2's blocks, x + attn(ln_1(x)), then h + mlp(ln_2(h))
             "parallel": x + attn(ln_1(x)) + mlp(ln_2(x)), as GPT-NeoX/Pythia write it
             "parallel-one-norm": h = ln_1(x), x + attn(h) + mlp(h), as GPT-J, Falcon and Phi do
             (sp's gpt-neox and gpt-j families; docs/families.md)
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from common import PreTrainedModel, check_divisible, check_switches

BUFFER_FORMS = ("hf430", "nonpersistent")
ACTIVATIONS = ("gelu_new", "gelu", "relu", "silu")  # GPT2Config.activation_function (ACT2FN keys)
RESIDUAL_FORMS = ("sequential", "parallel", "parallel-one-norm")


@dataclass
class GPT2Config:
    vocab_size: int = 256
    n_positions: int = 64
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_inner: int = None  # None: 4 * n_embd
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    scale_attn_weights: bool = True
    tie_word_embeddings: bool = True
    buffers: str = "hf430"
    activation_function: str = "gelu_new"
    residual: str = "sequential"

    def __post_init__(self):
        check_switches(self, (("residual", RESIDUAL_FORMS), ("buffers", BUFFER_FORMS),
                              ("activation_function", ACTIVATIONS)))
        check_divisible(self, "n_embd", "n_head")

    @property
    def hidden_size(self):
        return self.n_embd

    @property
    def max_position_embeddings(self):
        return self.n_positions


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D: a linear layer whose weight is stored [in, out]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(size_out)
        return x


class NewGELUActivation(nn.Module):
    """transformers.activations.NewGELUActivation (ACT2FN["gelu_new"], GPT-2's activation)."""

    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        max_positions = config.max_position_embeddings
        persistent = config.buffers == "hf430"
        self.register_buffer(
            "bias",
            torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)).view(
                1, 1, max_positions, max_positions
            ),
            persistent=persistent,
        )
        self.register_buffer("masked_bias", torch.tensor(-1e4), persistent=persistent)

        self.embed_dim = config.hidden_size
        self.num_heads = config.n_head
        self.head_dim = self.embed_dim // self.num_heads
        self.split_size = self.embed_dim
        self.scale_attn_weights = config.scale_attn_weights
        self.layer_idx = layer_idx

        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)

        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def _attn(self, query, key, value, attention_mask=None):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))

        if self.scale_attn_weights:
            attn_weights = attn_weights / torch.full(
                [], value.size(-1) ** 0.5, dtype=attn_weights.dtype, device=attn_weights.device
            )

        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        # Need to be a tensor, otherwise we get error: `RuntimeError: expected scalar type float but found double`.
        # Need to be on the same device, otherwise `RuntimeError: ..., x and y to be on the same device`
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype).to(attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)

        if attention_mask is not None:
            # Apply the attention mask
            attn_weights = attn_weights + attention_mask

        attn_weights = nn.functional.softmax(attn_weights, dim=-1)

        # Downcast (if necessary) back to V's dtype (if in mixed-precision) -- No-Op otherwise
        attn_weights = attn_weights.type(value.dtype)
        attn_weights = self.attn_dropout(attn_weights)

        attn_output = torch.matmul(attn_weights, value)

        return attn_output, attn_weights

    def _split_heads(self, tensor, num_heads, attn_head_size):
        """Splits hidden_size dim into attn_head_size and num_heads"""
        new_shape = tensor.size()[:-1] + (num_heads, attn_head_size)
        tensor = tensor.view(new_shape)
        return tensor.permute(0, 2, 1, 3)  # (batch, head, seq_length, head_features)

    def _merge_heads(self, tensor, num_heads, attn_head_size):
        """Merges attn_head_size dim and num_attn_heads dim into hidden_size"""
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        new_shape = tensor.size()[:-2] + (num_heads * attn_head_size,)
        return tensor.view(new_shape)

    def forward(self, hidden_states, attention_mask=None):
        query, key, value = self.c_attn(hidden_states).split(self.split_size, dim=2)

        query = self._split_heads(query, self.num_heads, self.head_dim)
        key = self._split_heads(key, self.num_heads, self.head_dim)
        value = self._split_heads(value, self.num_heads, self.head_dim)

        attn_output, attn_weights = self._attn(query, key, value, attention_mask)

        attn_output = self._merge_heads(attn_output, self.num_heads, self.head_dim)
        attn_output = self.c_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)

        return attn_output


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size, config):
        super().__init__()
        embed_dim = config.hidden_size
        self.c_fc = Conv1D(intermediate_size, embed_dim)
        self.c_proj = Conv1D(embed_dim, intermediate_size)
        self.act = {"gelu_new": NewGELUActivation, "gelu": nn.GELU, "relu": nn.ReLU,
                    "silu": nn.SiLU}[config.activation_function]()
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class GPT2Block(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        hidden_size = config.hidden_size
        inner_dim = config.n_inner if config.n_inner is not None else 4 * hidden_size

        self.ln_1 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config, layer_idx=layer_idx)
        self.ln_2 = (nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
                     if config.residual != "parallel-one-norm" else None)
        self.mlp = GPT2MLP(inner_dim, config)
        self.residual = config.residual

    def forward(self, hidden_states, attention_mask=None):
        if self.residual != "sequential":
            attn_in = self.ln_1(hidden_states)
            attn_output = self.attn(attn_in, attention_mask=attention_mask)
            mlp_in = self.ln_2(hidden_states) if self.residual == "parallel" else attn_in
            return hidden_states + attn_output + self.mlp(mlp_in)
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_output = self.attn(hidden_states, attention_mask=attention_mask)
        # residual connection
        hidden_states = attn_output + residual

        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        # residual connection
        hidden_states = residual + feed_forward_hidden_states
        return hidden_states


class GPT2PreTrainedModel(PreTrainedModel):
    LINEAR_TYPES = (nn.Linear, Conv1D)

    def _init_weights(self, module):
        """HF's GPT2PreTrainedModel._init_weights (with the GPT-2 paper's scaled c_proj init)."""
        super()._init_weights(module)
        for name, p in module.named_parameters():
            if name == "c_proj.weight":
                p.data.normal_(mean=0.0, std=(self.config.initializer_range / math.sqrt(2 * self.config.n_layer)))


class GPT2Model(GPT2PreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_dim = config.hidden_size

        self.wte = nn.Embedding(config.vocab_size, self.embed_dim)
        self.wpe = nn.Embedding(config.max_position_embeddings, self.embed_dim)

        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([GPT2Block(config, layer_idx=i) for i in range(config.n_layer)])
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
        if position_ids is None:
            position_ids = torch.arange(past_length, input_shape[-1] + past_length, dtype=torch.long, device=device)
            position_ids = position_ids.unsqueeze(0).view(-1, input_shape[-1])
        else:
            position_ids = position_ids.view(-1, input_shape[-1])

        # GPT2Attention mask.
        if attention_mask is not None:
            attention_mask = attention_mask.view(batch_size, -1)
            # We create a 3D attention mask from a 2D tensor mask.
            # Sizes are [batch_size, 1, 1, to_seq_length]
            attention_mask = attention_mask[:, None, None, :]
            attention_mask = attention_mask.to(dtype=self.dtype)  # fp16 compatibility
            attention_mask = (1.0 - attention_mask) * torch.finfo(self.dtype).min

        inputs_embeds = self.wte(input_ids)
        position_embeds = self.wpe(position_ids)
        hidden_states = inputs_embeds + position_embeds

        hidden_states = self.drop(hidden_states)

        output_shape = input_shape + (hidden_states.size(-1),)

        for block in self.h:
            hidden_states = block(hidden_states, attention_mask=attention_mask)

        hidden_states = self.ln_f(hidden_states)

        hidden_states = hidden_states.view(output_shape)
        return hidden_states


class GPT2LMHeadModel(GPT2PreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        """Token ids [B, T] (int64) to logits [B, T, vocab]."""
        hidden_states = self.transformer(input_ids, attention_mask=attention_mask, position_ids=position_ids)
        lm_logits = self.lm_head(hidden_states)
        return lm_logits
