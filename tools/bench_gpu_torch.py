#!/usr/bin/python3
"""The PyTorch side of tools/bench_gpu.py: the same Transformer layer written with torch ops (eager,
and with --torch-compile also through torch.compile where torch has it: the "compiled" row,
without recomputation), timed forward and backward at the same shapes and precision as sp's plans,
with no, selective and full recomputation.

Imported by bench_gpu.py, which owns the shapes (LayerShape) and prints both sides' tables.
"""

import os
import time

# The recomputation modes both sides run, and the layer's constants (as the exported layer's).
MODES = ["none", "selective", "full"]
DROPOUT = 0.1
LAYERNORM_EPS = 1e-5


def import_torch(device):
    """torch, or None with the reason."""
    try:
        import torch
    except ImportError as e:
        return None, f"torch is not importable ({e})"
    if device != "cpu" and not torch.cuda.is_available():
        return None, f"torch {torch.__version__} has no CUDA device"
    return torch, f"torch {torch.__version__}"


def set_cpu_threads(torch, threads):
    """torch's intra-op threads, and the OpenBLAS threads its GEMMs use where it calls a system
    OpenBLAS (bench_train.py explains why)."""
    torch.set_num_threads(threads)
    import ctypes
    with open("/proc/self/maps") as f:
        libs = sorted({os.path.realpath(line.split()[-1]) for line in f
                       if "openblas" in line and ".so" in line.split()[-1]})
    for path in libs:
        try:
            ctypes.CDLL(path).openblas_set_num_threads(threads)
        except (OSError, AttributeError):
            continue


def measure_torch(torch, args, sh, precision):
    """The fastest of --repeat rounds for each mode: ms per forward and backward of the layer."""
    import math
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    dev = torch.device(args.device)
    if dev.type == "cuda" and dev.index is None:  # sp-run's "cuda": this process's (first) GPU
        dev = torch.device("cuda", 0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
    gen_ = torch.Generator().manual_seed(args.seed)
    h, inner, ffn = sh.hidden, sh.inner, sh.ffn

    def param(*shape, kind="normal"):
        if kind == "normal":
            value = torch.randn(*shape, generator=gen_) * 0.02
        else:
            value = torch.full(shape, 1.0 if kind == "ones" else 0.0)
        return value.to(dev, dtype).requires_grad_(True)

    p = {"ln1_w": param(h, kind="ones"), "ln1_b": param(h, kind="zeros"),
         "qkv_w": param(3 * inner, h), "qkv_b": param(3 * inner, kind="zeros"),
         "proj_w": param(h, inner), "proj_b": param(h, kind="zeros"),
         "ln2_w": param(h, kind="ones"), "ln2_b": param(h, kind="zeros"),
         "fc1_w": param(ffn, h), "fc1_b": param(ffn, kind="zeros"),
         "fc2_w": param(h, ffn), "fc2_b": param(h, kind="zeros")}
    hidden_keys = torch.triu(torch.ones(sh.seq, sh.seq, dtype=torch.bool, device=dev), diagonal=1)
    scale = 1.0 / math.sqrt(sh.head_dim)

    def core(q, k, v):  # the attention core: what selective recomputation recomputes
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        scores = scores.masked_fill(hidden_keys, float("-inf"))
        probs = F.dropout(F.softmax(scores, dim=-1), DROPOUT, training=True)
        return torch.matmul(probs, v)

    def heads(x):
        return x.view(sh.batch, sh.seq, sh.local_heads, sh.head_dim).transpose(1, 2)

    def layer(x, selective):
        y = F.layer_norm(x, (h,), p["ln1_w"], p["ln1_b"], LAYERNORM_EPS)
        q, k, v = F.linear(y, p["qkv_w"], p["qkv_b"]).split(inner, dim=-1)
        q, k, v = heads(q), heads(k), heads(v)
        y = checkpoint(core, q, k, v, use_reentrant=False) if selective else core(q, k, v)
        y = y.transpose(1, 2).reshape(sh.batch, sh.seq, inner)
        x = x + F.dropout(F.linear(y, p["proj_w"], p["proj_b"]), DROPOUT, training=True)
        y = F.layer_norm(x, (h,), p["ln2_w"], p["ln2_b"], LAYERNORM_EPS)
        y = F.linear(F.gelu(F.linear(y, p["fc1_w"], p["fc1_b"])), p["fc2_w"], p["fc2_b"])
        return x + F.dropout(y, DROPOUT, training=True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    x = torch.randn(sh.batch, sh.seq, h, generator=gen_).to(dev, dtype).requires_grad_(True)
    dy = torch.randn(sh.batch, sh.seq, h, generator=gen_).to(dev, dtype)
    # --torch-compile: the "compiled" row, the layer without recomputation through torch.compile
    # (its first step, left out, compiles it); None where torch has no torch.compile.
    compiled = torch.compile(layer) if getattr(args, "torch_compile", False) and hasattr(torch, "compile") \
        else None
    modes = MODES + (["compiled"] if compiled is not None else [])
    best = {}
    for _ in range(args.repeat):
        for mode in modes:
            fwd = bwd = 0.0
            for step in range(args.steps + 1):  # the first step is left out, as sp-run does
                for t in list(p.values()) + [x]:
                    t.grad = None
                sync()
                t0 = time.perf_counter()
                if mode == "full":
                    out = checkpoint(layer, x, False, use_reentrant=False)
                elif mode == "compiled":
                    out = compiled(x, False)
                else:
                    out = layer(x, mode == "selective")
                sync()
                t1 = time.perf_counter()
                out.backward(dy)
                sync()
                t2 = time.perf_counter()
                if step:
                    fwd += t1 - t0
                    bwd += t2 - t1
                del out
            row = {"forward_ms": 1000 * fwd / args.steps, "backward_ms": 1000 * bwd / args.steps}
            row["combined_ms"] = row["forward_ms"] + row["backward_ms"]
            if mode not in best or row["combined_ms"] < best[mode]["combined_ms"]:
                best[mode] = row
    return best


# ---------------------------------------------------------------------------------------------
# the table
