"""BERT written the way HuggingFace transformers (~4.30, modeling_bert.py) writes BertForMaskedLM.

What matters is the ONNX graph a user gets when exporting `transformers.BertForMaskedLM`: the module
tree and parameter names (`bert.encoder.layer.0.attention.self.query.weight`, ...) and the tensor
operations of every forward are HF's. A post-LayerNorm encoder:

  - BertEmbeddings: word + token_type + position embeddings (`embeddings += position_embeddings`),
    LayerNorm (eps 1e-12), dropout; the position ids come from the `position_ids` buffer
    [1, max_positions] sliced to the sequence (persistent in 4.30, so an int64 initializer
    `bert.embeddings.position_ids`); without a token_type_ids input the (non-persistent, so inlined)
    `token_type_ids` zeros buffer is sliced and expanded to [B, T];
  - BertSelfAttention: query/key/value with bias, `transpose_for_scores` (view + permute), scores
    `/ math.sqrt(head_size)` plus the extended attention mask, softmax, dropout, context
    permute + contiguous + view;
  - BertSelfOutput / BertOutput: dense, dropout, LayerNorm(hidden + input_tensor);
  - BertIntermediate: dense + GELU (erf, nn.functional.gelu);
  - BertOnlyMLMHead: transform (dense, gelu, LayerNorm), decoder tied to the word embeddings with
    its own bias `cls.predictions.bias` (decoder.bias is the same Parameter).

The extended attention mask of BertModel.get_extended_attention_mask, switch `mask`:

    "10000":  `(1.0 - attention_mask[:, None, None, :]) * -10000.0` (transformers < 4.21)
    "finfo":  `(1.0 - attention_mask[:, None, None, :]) * torch.finfo(dtype).min` (4.21 on)

Switch `token_types`: "input" (token_type_ids is a forward input) or "buffer" (it is not, and the
buffered zeros are used). `pad_token_id` (HF: 0) gives word_embeddings a padding_idx, whose row gets
no gradient in torch; ONNX cannot say so (Gather has no padding index), so the tests leave it None.

Only what a training export needs is kept: no pooler (BertForMaskedLM has none), no head mask, no
cross attention, no loss inside the model; forward returns the prediction scores [B, T, vocab].
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from common import PreTrainedModel, check_divisible, check_switches

MASK_FORMS = ("10000", "finfo")
TOKEN_TYPE_FORMS = ("input", "buffer")


@dataclass
class BertConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 256
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 64
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = None
    mask: str = "10000"
    token_types: str = "input"

    def __post_init__(self):
        check_switches(self, (("mask", MASK_FORMS), ("token_types", TOKEN_TYPE_FORMS)))
        check_divisible(self, "hidden_size", "num_attention_heads")


class GELUActivation(nn.Module):
    """transformers.activations.GELUActivation (ACT2FN["gelu"]): the erf form."""

    def forward(self, input):
        return nn.functional.gelu(input)


class BertEmbeddings(nn.Module):
    """Construct the embeddings from word, position and token_type embeddings."""

    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)

        # self.LayerNorm is not snake-cased to stick with TensorFlow model variable name and be able to load
        # any TensorFlow checkpoint file
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # position_ids (1, len position emb) is contiguous in memory and exported when serialized
        self.position_embedding_type = "absolute"
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).expand((1, -1)))
        self.register_buffer(
            "token_type_ids", torch.zeros(self.position_ids.size(), dtype=torch.long), persistent=False
        )

    def default_token_type_ids(self, input_shape, device):
        """The token types [B, T] of a forward given none (BertEmbeddings and BertModel both ask)."""
        # Setting the token_type_ids to the registered buffer in constructor where it is all zeros, which usually occurs
        # when its auto-generated, registered buffer helps users when tracing the model without passing token_type_ids,
        # solves issue #5664
        batch_size, seq_length = input_shape
        if hasattr(self, "token_type_ids"):
            buffered_token_type_ids = self.token_type_ids[:, :seq_length]
            buffered_token_type_ids_expanded = buffered_token_type_ids.expand(batch_size, seq_length)
            return buffered_token_type_ids_expanded
        return torch.zeros(input_shape, dtype=torch.long, device=device)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, past_key_values_length=0):
        input_shape = input_ids.size()
        seq_length = input_shape[1]

        if position_ids is None:
            position_ids = self.position_ids[:, past_key_values_length : seq_length + past_key_values_length]

        if token_type_ids is None:
            token_type_ids = self.default_token_type_ids(input_shape, self.position_ids.device)

        inputs_embeds = self.word_embeddings(input_ids)
        token_type_embeddings = self.token_type_embeddings(token_type_ids)

        embeddings = inputs_embeds + token_type_embeddings
        if self.position_embedding_type == "absolute":
            position_embeddings = self.position_embeddings(position_ids)
            embeddings += position_embeddings
        embeddings = self.LayerNorm(embeddings)
        embeddings = self.dropout(embeddings)
        return embeddings


class BertSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = int(config.hidden_size / config.num_attention_heads)
        self.all_head_size = self.num_attention_heads * self.attention_head_size

        self.query = nn.Linear(config.hidden_size, self.all_head_size)
        self.key = nn.Linear(config.hidden_size, self.all_head_size)
        self.value = nn.Linear(config.hidden_size, self.all_head_size)

        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        x = x.view(new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        mixed_query_layer = self.query(hidden_states)

        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))

        query_layer = self.transpose_for_scores(mixed_query_layer)

        # Take the dot product between "query" and "key" to get the raw attention scores.
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))

        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            # Apply the attention mask is (precomputed for all layers in BertModel forward() function)
            attention_scores = attention_scores + attention_mask

        # Normalize the attention scores to probabilities.
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)

        # This is actually dropping out entire tokens to attend to, which might
        # seem a bit unusual, but is taken from the original Transformer paper.
        attention_probs = self.dropout(attention_probs)

        context_layer = torch.matmul(attention_probs, value_layer)

        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        context_layer = context_layer.view(new_context_layer_shape)
        return context_layer


class BertSelfOutput(nn.Module):
    def __init__(self, config, input_size=None):
        super().__init__()
        # input_size: HF's BertOutput is this module on the intermediate_size output of the MLP
        self.dense = nn.Linear(config.hidden_size if input_size is None else input_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return hidden_states


class BertAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden_states, attention_mask=None):
        self_outputs = self.self(hidden_states, attention_mask)
        attention_output = self.output(self_outputs, hidden_states)
        return attention_output


class BertIntermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = GELUActivation()

    def forward(self, hidden_states):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.intermediate_act_fn(hidden_states)
        return hidden_states


class BertOutput(BertSelfOutput):
    """HF writes BertSelfOutput out again with dense: intermediate_size -> hidden_size."""

    def __init__(self, config):
        super().__init__(config, input_size=config.intermediate_size)


class BertLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states, attention_mask=None):
        attention_output = self.attention(hidden_states, attention_mask)
        intermediate_output = self.intermediate(attention_output)
        layer_output = self.output(intermediate_output, attention_output)
        return layer_output


class BertEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden_states, attention_mask=None):
        for layer_module in self.layer:
            hidden_states = layer_module(hidden_states, attention_mask)
        return hidden_states


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = GELUActivation()
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.transform_act_fn(hidden_states)
        hidden_states = self.LayerNorm(hidden_states)
        return hidden_states


class BertLMPredictionHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)

        # The output weights are the same as the input embeddings, but there is
        # an output-only bias for each token.
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

        # Need a link between the two variables so that the bias is correctly resized with `resize_token_embeddings`
        self.decoder.bias = self.bias

    def forward(self, hidden_states):
        hidden_states = self.transform(hidden_states)
        hidden_states = self.decoder(hidden_states)
        return hidden_states


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)

    def forward(self, sequence_output):
        prediction_scores = self.predictions(sequence_output)
        return prediction_scores


class BertPreTrainedModel(PreTrainedModel):
    """An abstract class to handle weights initialization: HF's BertPreTrainedModel._init_weights is
    models/common.py's PreTrainedModel._init_weights (nn.Linear, nn.Embedding, nn.LayerNorm)."""


class BertModel(BertPreTrainedModel):
    """The encoder without a pooler (BertForMaskedLM builds it with add_pooling_layer=False)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    @property
    def dtype(self):
        return self.embeddings.word_embeddings.weight.dtype

    def get_extended_attention_mask(self, attention_mask, input_shape, dtype=None):
        if dtype is None:
            dtype = self.dtype
        # We can provide a self-attention mask of dimensions [batch_size, from_seq_length, to_seq_length]
        # ourselves in which case we just need to make it broadcastable to all heads.
        if attention_mask.dim() == 3:
            extended_attention_mask = attention_mask[:, None, :, :]
        elif attention_mask.dim() == 2:
            # Provided a padding mask of dimensions [batch_size, seq_length]
            # - the model is an encoder, so make the mask broadcastable to
            #   [batch_size, num_heads, seq_length, seq_length]
            extended_attention_mask = attention_mask[:, None, None, :]
        else:
            raise ValueError(
                f"Wrong shape for input_ids (shape {input_shape}) or attention_mask (shape {attention_mask.shape})"
            )

        # Since attention_mask is 1.0 for positions we want to attend and 0.0 for
        # masked positions, this operation will create a tensor which is 0.0 for
        # positions we want to attend and the dtype's smallest value for masked positions.
        # Since we are adding it to the raw scores before the softmax, this is
        # effectively the same as removing these entirely.
        extended_attention_mask = extended_attention_mask.to(dtype=dtype)  # fp16 compatibility
        if self.config.mask == "10000":
            extended_attention_mask = (1.0 - extended_attention_mask) * -10000.0
        else:
            extended_attention_mask = (1.0 - extended_attention_mask) * torch.finfo(dtype).min
        return extended_attention_mask

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        input_shape = input_ids.size()
        batch_size, seq_length = input_shape
        device = input_ids.device

        if attention_mask is None:
            attention_mask = torch.ones(((batch_size, seq_length)), device=device)

        if token_type_ids is None:
            token_type_ids = self.embeddings.default_token_type_ids(input_shape, device)

        # We can provide a self-attention mask of dimensions [batch_size, from_seq_length, to_seq_length]
        # ourselves in which case we just need to make it broadcastable to all heads.
        extended_attention_mask = self.get_extended_attention_mask(attention_mask, input_shape)

        embedding_output = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        sequence_output = self.encoder(embedding_output, attention_mask=extended_attention_mask)
        return sequence_output


class BertForMaskedLM(BertPreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertOnlyMLMHead(config)
        self.apply(self._init_weights)
        # tie_weights(): the decoder shares the word embeddings
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        """Token ids [B, T] (int64), attention_mask [B, T] (1 = attend), token_type_ids [B, T] to scores."""
        sequence_output = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        prediction_scores = self.cls(sequence_output)
        return prediction_scores
