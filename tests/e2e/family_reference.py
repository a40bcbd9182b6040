"""The torch side of sp-run's contract for the HF-style families of models/export_family.py.

tests/e2e/torch_reference.py is the contract for models/gpt.py; this file applies the same contract
to an export of models/export_family.py (OUT.onnx + OUT.json, family gpt2, llama or bert):

  - the reference model is the family's torch model (models/hf_gpt2.py, llama.py, bert.py) built from
    the sizes and variant switches of OUT.json, its parameters loaded from the ONNX initializers by
    name, and so are the buffers the export kept as initializers (a non-persistent buffer is inlined
    by torch into the graph, and an unused one dropped: the model computes those itself, from the
    same code, so they are bitwise the ones the export saw);
  - the graph inputs are fed by role (OUT.json "inputs"): tokens and next-token targets from the
    token file exactly as torch_reference.get_batch does (or, with an objective, as
    torch_reference.objective_batch does: padding, masked-LM); position ids arange(S) in every row;
    the attention mask all ones (or the batch's: 0 for padding); token types all zeros;
  - batches, the LR schedule, AdamW with its two parameter groups, clipping and the mean cross
    entropy over the counted targets (all B * S without padding or masked-LM) are torch_reference's
    (its functions are used, not copied).

float64 models are supported (for noise floors): llama's float32 "upcasts" (RMSNorm, softmax,
logits.float()) then upcast to float64 instead, so that nothing rounds to float32 on the way.

The loss is sp-run's: next-token cross entropy by default, masked-LM with --objective masked-lm.

Needs torch, onnx and numpy (/usr/bin/python3).
"""

import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402

sys.path.insert(0, os.path.join(ref.REPO_ROOT, "models"))
import export_family  # noqa: E402

# Role -> the keyword of the families' forward that takes it (the token input is positional).
ROLE_KEYWORDS = {export_family.POSITIONS: "position_ids", export_family.MASK: "attention_mask",
                 export_family.TOKEN_TYPES: "token_type_ids"}

facts_path = ref.facts_path


def read_facts(onnx_path):
    with open(facts_path(onnx_path)) as f:
        facts = json.load(f)
    if facts.get("family") not in export_family.FAMILIES:
        raise ValueError(f"{facts_path(onnx_path)} is not a models/export_family.py export (family "
                         f"{facts.get('family')!r}); tests/e2e/torch_reference.py handles models/export_gpt.py's")
    return facts


def sizes_of(facts):
    sizes = {k: facts[k] for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "seq", "vocab", "batch")}
    sizes["max_positions"] = facts.get("max_positions", facts["seq"])
    return sizes


def build_model(facts, dropout=0.0):
    """The family's torch model with the export's sizes and variants, every dropout set to `dropout`."""
    return export_family.build_model(facts["family"], sizes_of(facts), facts["variants"], dropout,
                                     facts["tied"], facts.get("pad_token_id"))


def load_onnx_weights(model, onnx_path, dtype=torch.float32, facts=None):
    """Copy every parameter, and every buffer the export kept, from the ONNX initializer of its name.

    torch_reference.load_onnx_weights generalised: parameters must all be initializers (name and
    shape); buffers may be initializers (loaded, any dtype), or absent when torch inlined them
    (non-persistent) or dropped them (unused), and then keep the values the model computed; a float
    initializer that is neither a parameter nor a buffer is an error. Returns the model in `dtype`
    (float64 also makes llama's upcasts float64).
    """
    inits = ref.onnx_initializers(onnx_path)
    params = dict(model.named_parameters())  # tied weights are deduplicated away
    buffers = dict(model.named_buffers())
    missing = sorted(set(params) - set(inits))
    if missing:
        raise ValueError(f"{onnx_path} has no initializer for the torch parameters {missing}")
    extra = sorted(n for n, a in inits.items()
                   if a.dtype in (np.float32, np.float64) and n not in params and n not in buffers)
    if extra:
        raise ValueError(f"{onnx_path} has float initializers that are not torch parameters or buffers: {extra}")
    fates = (facts or {}).get("buffers", {})
    with torch.no_grad():
        for name, tensor in list(params.items()) + list(buffers.items()):
            if name not in inits:
                if name in params or fates.get(name) == "initializer":
                    raise ValueError(f"{onnx_path} has no initializer for {name}")
                continue  # inlined or unused: the model's own value is the export's
            value = torch.from_numpy(np.array(inits[name]))
            if tuple(value.shape) != tuple(tensor.shape):
                raise ValueError(f"{name}: ONNX shape {tuple(value.shape)} != torch {tuple(tensor.shape)}")
            tensor.copy_(value.to(tensor.dtype))
    model = model.to(dtype)
    if hasattr(model, "set_upcast_dtype"):
        model.set_upcast_dtype(torch.float64 if dtype == torch.float64 else torch.float32)
    return model


def reference_model(onnx_path, dropout=0.0, dtype=torch.float32, facts=None):
    """The family's model with the export's config and the export's weights."""
    facts = facts or read_facts(onnx_path)
    return load_onnx_weights(build_model(facts, dropout), onnx_path, dtype, facts)


def role_inputs(facts, x, real=None):
    """The forward's keyword inputs for tokens x [B, S], by the roles of OUT.json's inputs (the
    attention mask `real` [B, S], 1 = a token, 0 = padding; all ones if None)."""
    batch, seq = x.shape
    kwargs = {}
    for spec in facts["inputs"][1:]:
        value = export_family.role_value(spec["role"], batch, seq)
        if spec["role"] == export_family.MASK and real is not None:
            value = real.to(value.dtype)
        kwargs[ROLE_KEYWORDS[spec["role"]]] = value
    return kwargs


def graph_feeds(facts, x):
    """name -> int64 numpy array for every graph input (what an ONNX runtime is given)."""
    batch, seq = x.shape
    return {spec["name"]: (x if spec["role"] == export_family.TOKENS
                           else export_family.role_value(spec["role"], batch, seq)).numpy()
            for spec in facts["inputs"]}


def forward(model, facts, x, real=None):
    return model(x, **role_inputs(facts, x, real))


def loss_of(model, facts, x, y, real=None):
    """Mean cross entropy of the logits against the targets y over those that are not ref.IGNORE."""
    logits = forward(model, facts, x, real)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=ref.IGNORE)


def eval_logits(model, facts, x, real=None):
    """Logits of a forward pass without dropout, as a float numpy array."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = forward(model, facts, x, real).numpy()
    model.train(was_training)
    return logits


def loss_and_grads(model, facts, x, y, real=None):
    """Training-mode loss of one batch and every parameter's gradient (before clipping), by name."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss = loss_of(model, facts, x, y, real)
    loss.backward()
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().numpy().copy()
             for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return float(loss.item()), grads


def pad_tokens(tokens, pad, facts, steps, seed=5):
    """A copy of `tokens` with runs of 1 to 4 pad ids over about a fifth of it, and no pad id at the
    start of a row of batches 0 .. steps - 1: there a causal query would have no key to attend to,
    which the exports do not agree on (HF GPT-2 attends to the first key, sp to every key alike); its
    target is ignored and its key masked, so it changes no loss or gradient, only the logits of that
    padding position."""
    rng = np.random.default_rng(seed)
    out = np.array(tokens, dtype=np.int64)
    for start in rng.choice(len(out), size=len(out) // 12, replace=False):
        out[start:start + rng.integers(1, 5)] = pad
    for k in range(steps):
        for o in ref.batch_offsets(k, facts["batch"], facts["seq"], len(out)):
            if out[o] == pad:
                out[o] = (pad + 1) % facts["vocab"]
    return out.astype("<u2")


def batch(facts, tokens, k, objective=None):
    """((x, real), y) of 0-based batch k: torch_reference.get_batch's next-token batch with an all-ones
    mask, or torch_reference.objective_batch's under `objective` (padding, masked-LM)."""
    if objective is None:
        x, y = ref.get_batch(tokens, k, facts["batch"], facts["seq"])
        return (x, None), y
    x, y, real = ref.objective_batch(tokens, k, facts["batch"], facts["seq"], facts["vocab"], objective)
    return (x, real), y


def train(model, facts, tokens, steps, lr, warmup=0, min_lr=None, callback=None, objective=None):
    """torch_reference.train with the role inputs fed and the objective's batches. Returns [(loss, lr)]
    per step."""
    return ref.train(model, tokens, facts["batch"], facts["seq"], steps, lr, warmup, min_lr, callback,
                     loss_fn=lambda m, xr, y: loss_of(m, facts, xr[0], y, xr[1]),
                     batch_fn=lambda k: batch(facts, tokens, k, objective))
