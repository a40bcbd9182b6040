"""The torch side of sp-run's contract, shared by tests/e2e/check_training.py and tools/bench_train.py.

Everything here follows the sp-run contract exactly:
  - the reference model is models/gpt.py's GPT with the config of the export (OUT.json next to the
    .onnx), its parameters loaded from the ONNX initializers by name, so torch and sp start from the
    same weights (a tied model has one initializer, transformer.wte.weight, which lm_head shares);
  - batch k (0-based) row r reads tokens [o, o + S) and targets [o + 1, o + S + 1) with
    o = ((k * B + r) * S) mod (T - S);
  - the learning rate of 1-based step t of N with warmup W, peak P and minimum m is P * t / W while
    t <= W, else m + 0.5 (P - m) (1 + cos(pi (t - W) / max(1, N - W)));
  - AdamW(betas (0.9, 0.95), eps 1e-8), weight decay 0.1 on parameters of rank >= 2 and 0 on rank-1
    ones (two param groups), torch.nn.utils.clip_grad_norm_(1.0) before every step, the loss the
    mean cross entropy over all B * S tokens.

Needs torch, onnx and numpy (/usr/bin/python3).
"""

import csv
import json
import math
import os
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn.functional as F

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "models"))
from gpt import GPT, GPTConfig  # noqa: E402

# The comparison rule of sp against torch (and of sp's layouts against one device,
# tests/unit/TrainHarness.h): two float32 computations of the same mathematics may differ by
# TOLERANCE_FACTOR times the float32 rounding of the computation, measured on the same check as
# torch float32 against torch float64, and never less than float32's unit roundoff U32 (a check
# can round exactly by chance). Each float32 result deviates from the exact one by about that
# rounding, so two of them differ by up to about twice it; 8 leaves a factor of 4 for the spread of
# the estimate. No bound is tuned on one machine: the rounding is measured in every run.
TOLERANCE_FACTOR = 8
U32 = 2.0 ** -24


def rounding_bound(noise):
    """The largest allowed float32 difference on a check whose float32 rounding is `noise`."""
    return TOLERANCE_FACTOR * max(noise, U32)


BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0
CONFIG_FIELDS = ("layernorm", "gelu", "linear", "mask", "scale")


def facts_path(onnx_path):
    """models/export_gpt.py writes OUT.json next to OUT.onnx (models/tiny/gpt-tiny.json for the default)."""
    return os.path.splitext(onnx_path)[0] + ".json"


def read_facts(onnx_path):
    with open(facts_path(onnx_path)) as f:
        return json.load(f)


def config_from_facts(facts, dropout=0.0):
    """The GPTConfig of an export, from its facts JSON, with every dropout set to `dropout`."""
    return GPTConfig(vocab_size=facts["vocab"], block_size=facts["seq"], n_layer=facts["layers"],
                     n_head=facts["heads"], n_embd=facts["hidden"], dropout=dropout, tied=facts["tied"],
                     **{k: facts[k] for k in CONFIG_FIELDS})


def onnx_initializers(onnx_path):
    """name -> numpy array of every initializer of the model (external data resolved)."""
    model = onnx.load(onnx_path)
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


def load_onnx_weights(model, onnx_path, dtype=torch.float32):
    """Copy every parameter and buffer of `model` from the ONNX initializer of the same name.

    Raises ValueError if one is missing or has another shape, or if the ONNX model has float
    initializers that are not torch parameters. Returns the model (converted to `dtype`).
    """
    inits = onnx_initializers(onnx_path)
    params = dict(model.named_parameters())  # a tied lm_head.weight is deduplicated away
    buffers = dict(model.named_buffers())
    missing = sorted(set(params) - set(inits))
    if missing:
        raise ValueError(f"{onnx_path} has no initializer for the torch parameters {missing}")
    extra = sorted(n for n, a in inits.items() if a.dtype == np.float32 and n not in params)
    if extra:
        raise ValueError(f"{onnx_path} has float initializers that are not torch parameters: {extra}")
    with torch.no_grad():
        for name, tensor in list(params.items()) + list(buffers.items()):
            if name not in inits:
                raise ValueError(f"{onnx_path} has no initializer for the torch buffer {name}")
            value = torch.from_numpy(np.array(inits[name]))
            if tuple(value.shape) != tuple(tensor.shape):
                raise ValueError(f"{name}: ONNX shape {tuple(value.shape)} != torch {tuple(tensor.shape)}")
            tensor.copy_(value.to(tensor.dtype))
    if model.config.tied:
        assert model.lm_head.weight is model.transformer.wte.weight
    return model.to(dtype)


def reference_model(onnx_path, dropout=0.0, dtype=torch.float32, facts=None):
    """models/gpt.py's GPT with the export's config and the export's weights."""
    facts = facts or read_facts(onnx_path)
    model = GPT(config_from_facts(facts, dropout))
    return load_onnx_weights(model, onnx_path, dtype)


def random_tokens(count, vocab, seed, follow=0.9):
    """`count` random token ids < vocab from numpy's `seed`: a random Markov chain in which each id is
    followed by its own fixed successor with probability `follow` and by a uniform id otherwise.

    The ids are random but learnable, so the loss of a few training steps falls clearly (uniform ids
    sit at log(vocab) from the first step and would hide an optimizer that does nothing).
    """
    rng = np.random.default_rng(seed)
    successor = rng.permutation(vocab)
    uniform = rng.integers(0, vocab, size=count)
    jump = rng.random(count) >= follow
    tokens = np.empty(count, dtype=np.int64)
    tokens[0] = uniform[0]
    for i in range(1, count):
        tokens[i] = uniform[i] if jump[i] else successor[tokens[i - 1]]
    return tokens.astype("<u2")


def write_tokens(path, count, vocab, seed):
    """Write random_tokens() as a nanoGPT-style token file (little-endian uint16); returns them."""
    tokens = random_tokens(count, vocab, seed)
    tokens.tofile(path)
    return tokens


def read_tokens(path):
    return np.fromfile(path, dtype="<u2")


def batch_offsets(k, batch, seq, num_tokens):
    """Start offsets of the rows of 0-based batch k (the spec's formula, without --shuffle)."""
    return [((k * batch + r) * seq) % (num_tokens - seq) for r in range(batch)]


def get_batch(tokens, k, batch, seq):
    """(inputs, targets) of 0-based batch k as int64 tensors [batch, seq]."""
    offsets = batch_offsets(k, batch, seq, len(tokens))
    x = np.stack([tokens[o:o + seq] for o in offsets]).astype(np.int64)
    y = np.stack([tokens[o + 1:o + seq + 1] for o in offsets]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


IGNORE = -100  # a target that counts for nothing (torch's ignore_index default; sp's IgnoreTarget)
_M64 = (1 << 64) - 1


def mix64(x):
    """SplitMix64's output function (runtime/DataLoader.cpp mix64)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _unit(h):
    return (h >> 11) * 2.0 ** -53


def objective_batch(tokens, k, batch, seq, vocab, objective):
    """(x, y, real) of 0-based batch k under sp-run's --objective, --pad-token, --mask-token, --mask-rate
    and --seed, written from the rules of runtime/DataLoader.h (not from its code):

      objective = {"kind": "next-token" or "masked-lm", "pad": id or None, "mask_token": id,
                   "rate": float, "seed": int}

    A position holding the pad token is padding: real 0, target IGNORE. next-token: target the next
    token (IGNORE if it is padding). masked-LM: a non-padding position is chosen when
    u(h) < rate, h = mix(mix(mix(mix(seed ^ 0x6d6c6d) ^ k) ^ r) ^ j); a chosen one predicts its token
    and reads the mask token (u(h2) < 0.8), mix(h2) mod vocab (u(h2) < 0.9) or itself, h2 = mix(h).
    """
    offsets = batch_offsets(k, batch, seq, len(tokens))
    pad = objective.get("pad")
    x = np.stack([tokens[o:o + seq] for o in offsets]).astype(np.int64)
    nxt = np.stack([tokens[o + 1:o + seq + 1] for o in offsets]).astype(np.int64)
    real = np.ones_like(x) if pad is None else (x != pad).astype(np.int64)
    if objective["kind"] == "next-token":
        y = np.where((real == 1) & (nxt != (-1 if pad is None else pad)), nxt, IGNORE)
    else:
        y = np.full_like(x, IGNORE)
        inputs = x.copy()
        for r in range(batch):
            row = mix64(mix64(mix64(objective["seed"] ^ 0x6D6C6D) ^ k) ^ r)
            for j in range(seq):
                h = mix64(row ^ j)
                if not real[r, j] or _unit(h) >= objective["rate"]:
                    continue
                y[r, j] = x[r, j]
                h2 = mix64(h)
                u = _unit(h2)
                if u < 0.8:
                    inputs[r, j] = objective["mask_token"]
                elif u < 0.9:
                    inputs[r, j] = mix64(h2) % vocab
        x = inputs
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(real)


def sp_run_objective_flags(objective):
    """The sp-run flags of an objective_batch objective."""
    flags = ["--objective", objective["kind"], "--seed", str(objective["seed"])]
    if objective.get("pad") is not None:
        flags += ["--pad-token", str(objective["pad"])]
    if objective["kind"] == "masked-lm":
        flags += ["--mask-token", str(objective["mask_token"]), "--mask-rate", repr(objective["rate"])]
    return flags


def lr_at(t, steps, warmup, peak, min_lr):
    """Learning rate of 1-based step t of `steps`."""
    if warmup > 0 and t <= warmup:
        return peak * t / warmup
    progress = (t - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (peak - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model, lr):
    """AdamW with weight decay on rank >= 2 parameters only (two param groups)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=BETAS, eps=ADAM_EPS)


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def eval_logits(model, x):
    """Logits of a forward pass without dropout, as a float numpy array."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(x).numpy()
    model.train(was_training)
    return logits


def loss_and_grads(model, x, y):
    """Training-mode loss of one batch and every parameter's gradient (before clipping), by name."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss = loss_of(model, x, y)
    loss.backward()
    grads = {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return float(loss.item()), grads


def train(model, tokens, batch, seq, steps, lr, warmup=0, min_lr=None, callback=None, loss_fn=None,
          batch_fn=None):
    """Train `steps` steps as sp-run does; returns [(loss, lr)] per step (the loss before the update).

    `loss_fn(model, x, y)` replaces loss_of (a model fed other inputs too), and `batch_fn(k)` replaces
    get_batch (another objective: its x is whatever loss_fn takes).
    """
    min_lr = lr / 10 if min_lr is None else min_lr
    loss_fn = loss_fn or loss_of
    model.train()
    optimizer = make_optimizer(model, lr)
    history = []
    for t in range(1, steps + 1):
        x, y = batch_fn(t - 1) if batch_fn else get_batch(tokens, t - 1, batch, seq)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        step_lr = lr_at(t, steps, warmup, lr, min_lr)
        for group in optimizer.param_groups:
            group["lr"] = step_lr
        optimizer.step()
        history.append((float(loss.item()), step_lr))
        if callback:
            callback(t)
    return history


def rel_err(actual, expected):
    """max|a - b| / max|b| (the absolute max difference when b is all zeros)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    diff = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    return diff / scale if scale > 0 else diff


def global_rel_l2(actual, expected):
    """||a - b||_2 / ||b||_2 over every element of every tensor of two name -> array dicts (b's names)."""
    num = sum(float(np.sum((np.asarray(actual[n], np.float64) - np.asarray(b, np.float64)) ** 2))
              for n, b in expected.items())
    den = sum(float(np.sum(np.asarray(b, np.float64) ** 2)) for b in expected.values())
    return (num / den) ** 0.5 if den > 0 else num ** 0.5


def read_loss_csv(path):
    """sp-run's loss.csv as a list of (step, loss, lr, grad_norm); grad_norm
    is None where the plan computes no gradient norm."""
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        for col in ("step", "loss", "lr", "grad_norm"):
            if col not in (reader.fieldnames or []):
                raise ValueError(f"{path}: no '{col}' column in {reader.fieldnames}")
        for r in reader:
            norm = float(r["grad_norm"]) if r["grad_norm"] else None
            rows.append((int(r["step"]), float(r["loss"]), float(r["lr"]), norm))
    return rows
