"""What the reference models here share: config checks, parameter counts, HF-style weight init.

models/gpt.py (nanoGPT-style) and the HuggingFace-style hf_gpt2.py, llama.py and bert.py each
check their config's variant switches and sizes the same way and count their parameters the same
way; the three HF-style files initialize their weights as transformers' `_init_weights` does, which
`PreTrainedModel` below holds once (transformers, too, gives every model one PreTrainedModel base).
Nothing here adds an operation to a forward pass, so the ONNX exports are the files' own.
"""

import torch.nn as nn


def check_switches(config, switches):
    """Raise ValueError unless every (field, forms) of switches has config.field in forms."""
    for name, forms in switches:
        if getattr(config, name) not in forms:
            raise ValueError(f"{name} must be one of {forms}, got {getattr(config, name)!r}")


def check_divisible(config, name, by):
    """Raise ValueError unless config.name is a multiple of config.by (e.g. hidden size by heads)."""
    if getattr(config, name) % getattr(config, by):
        raise ValueError(f"{name} {getattr(config, name)} is not divisible by {by} {getattr(config, by)}")


def num_params(model):
    """Trainable parameters (a tied weight counted once), buffers not counted."""
    return sum(p.numel() for p in model.parameters())


class PreTrainedModel(nn.Module):
    """The base of the HF-style models: transformers' weight init, and the parameter count.

    `_init_weights` is what BertPreTrainedModel, LlamaPreTrainedModel and GPT2PreTrainedModel each
    write (normal(0, initializer_range) weights of LINEAR_TYPES and embeddings, zero biases, a zero
    padding row, LayerNorm reset to 1 and 0); a model applies it in its __init__ as HF's post_init
    does, so the weights, and the random numbers drawn for them, are HF's.
    """

    LINEAR_TYPES = (nn.Linear,)

    def _init_weights(self, module):
        """Initialize the weights"""
        std = self.config.initializer_range
        if isinstance(module, self.LINEAR_TYPES):
            # Slightly different from the TF version which uses truncated_normal for initialization
            # cf https://github.com/pytorch/pytorch/pull/5617
            module.weight.data.normal_(mean=0.0, std=std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)

    def num_params(self):
        """Trainable parameters (a tied weight counted once), buffers not counted."""
        return num_params(self)
