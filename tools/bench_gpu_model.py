#!/usr/bin/python3
"""Benchmark: a whole GPT model trained on one device, sp-run against a PyTorch training loop of the
same model, on the same device, in the same run (the whole-model companion of bench_gpu.py's one
layer).

    /usr/bin/python3 tools/bench_gpu_model.py --device cuda --model gpt2-medium [--batch 8] [--steps 20] \\
        [--compile] [--json r.json]
    /usr/bin/python3 tools/bench_gpu_model.py --device cpu --model small --steps 2

The model. gpt2-medium: GPT-2 medium's size, 24 layers, h 1024, 16 heads, s 1024, vocabulary 50304
(GPT-2's 50257 padded to a multiple of 64, as nanoGPT does), batch --batch (default 8); small: 2
layers, h 128, 4 heads, s 128, vocabulary 512, batch 2 (seconds on a CPU, the smoke test). Both are
written by models/gen_paper_graph.py with random weights: learned token and position embeddings
(with dropout), pre-LayerNorm blocks (causal attention with dropout on the probabilities and after
the projection, an erf GELU MLP with dropout), a final LayerNorm and the head tied to the token
embedding; dropout 0.1. The tokens are random (sp-run --synthetic-data; torch: one random batch),
so the head and the loss cost what they cost at the real vocabulary; no tokenizer is involved.

sp. The model compiled with sp-compile --dtype bf16 (16-bit activations and parameter copies,
float32 master weights, gradients and AdamW moments; or --dtype fp32) twice: with the default fused
attention core (--attention fused; on a GPU the blockwise kernels, which store no scores) and with
--attention unfused (the paper's ops, the [s, s] scores stored), both without recomputation. Each
plan runs --steps + 1 steps with sp-run; the step time is the sum of its "time per step" line
(forward + backward + recompute + optimizer, the mean over the steps after the first). sp-run's own
"trained steps" line (its tokens/s and MFU over all the steps, the first included, against its own
peak) is reported beside it.

torch. The same model as a torch.nn.Module (nn.Embedding token and position embeddings, dropout, per
block LayerNorm, one QKV nn.Linear, F.scaled_dot_product_attention(is_causal=True, dropout_p=0.1),
projection, dropout, residual; LayerNorm, fc1, erf GELU, fc2, dropout, residual; final LayerNorm;
the head tied to the token embedding; cross entropy over every position), float32 parameters with
torch.autocast(bfloat16) for --dtype bf16 (sp's scheme: float32 masters, 16-bit compute), and
torch.optim.AdamW(fused=True). A torch without scaled_dot_product_attention (before 2.0) runs the
explicit softmax attention instead; a torch without fused AdamW the default one: the output says so.
Eager, and with --compile also torch.compile(model) ("n/a: reason" if it fails). Timed: --steps steps
after warm-up steps (1 eager, 3 compiled), with torch.cuda.synchronize before and after.

FLOPs. Model FLOPs per step: 72 b s L h^2 (1 + s/(6h) + V/(12 h L)) (Megatron's count: the matrix
products only, 2mnk each, forward + backward = 3x forward, attention's s^2 terms counted as if not
causal), checked against sp-compile --report's GEMM count. MFU = model FLOPs / step time / peak,
the device's dense BF16 peak (bench_gpu.py's table; --peak-tflops overrides; n/a on the CPU).

Flags: --device cpu|cuda[:N], --model gpt2-medium|small, --batch B, --steps N, --dtype bf16|fp32,
--threads (CPU only), --peak-tflops, --seed, --compile, --no-torch, --ops (one more traced step of
each sp row, its milliseconds by op: where the step goes), --sp-bin, --workdir (kept), --json FILE
(every number).
"""
import argparse
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time

from bench_gpu import ROOT, SP_RUN_ENV, bf16_peak, device_name, gen, run, tool, TIME_LINE  # noqa: E402
from bench_gpu_torch import DROPOUT, LAYERNORM_EPS, import_torch, set_cpu_threads  # noqa: E402

MODELS = {
    "gpt2-medium": dict(layers=24, hidden=1024, heads=16, seq=1024, vocab=50304, batch=8),
    "small": dict(layers=2, hidden=128, heads=4, seq=128, vocab=512, batch=2),
}
SP_ROWS = {"fused": "--attention fused", "unfused": "--attention unfused"}
TRAINED_LINE = re.compile(r"trained steps [\d-]+: final loss ([\d.naif]+), ([\d,]+) tok/s, .*?\(MFU ([\d.]+)%\)")
TORCH_WARMUP = {"eager": 1, "compiled": 3}


def model_flops(size):
    """Megatron's model FLOPs of one training step (forward and backward)."""
    b, s, L, h, v = size.batch, size.seq, size.layers, size.hidden, size.vocab
    return 72 * b * s * L * h * h * (1 + s / (6 * h) + v / (12 * h * L))


def parameters(size):
    """Parameter count (the tied head counted once) and without the embeddings."""
    h, L = size.hidden, size.layers
    per_layer = 12 * h * h + 13 * h  # QKV, proj, fc1, fc2 and their biases, two LayerNorms
    embeddings = size.vocab * h + size.seq * h
    return {"total": L * per_layer + embeddings + 2 * h, "non_embedding": L * per_layer + 2 * h}


def rates(row, tokens, flops, peak):
    seconds = row["ms_per_step"] / 1000
    row["tokens_per_s"] = tokens / seconds if seconds > 0 else None
    row["model_tflops"] = flops / seconds / 1e12 if seconds > 0 else None
    row["mfu"] = row["model_tflops"] / peak if peak and row["model_tflops"] else None


# ---------------------------------------------------------------------------------------------
# sp

def prepare_sp(args, size, work):
    """The model with its weights and the two plans; returns ({row: plan}, {row: report})."""
    model = os.path.join(work, f"{args.model}.onnx")
    start = time.perf_counter()
    gen.write_graph(size, model, args.model, weights=True, seed=args.seed)
    weights = os.path.splitext(model)[0] + ".weights.bin"
    print(f"model: {model} (+ {os.path.getsize(weights) / 2**20:.1f} MiB of weights), "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    plans, reports = {}, {}
    for row, flag in SP_ROWS.items():
        plans[row] = os.path.join(work, f"plan-{row}")
        shutil.rmtree(plans[row], ignore_errors=True)
        report = os.path.join(work, f"report-{row}.json")
        start = time.perf_counter()
        run([tool(args, "sp-compile"), model, "-o", plans[row], *flag.split(), "--recompute", "none",
             "--dtype", args.dtype, "--quiet", "--report", report])
        with open(report) as f:
            reports[row] = json.load(f)
        print(f"plan {row}: {plans[row]}, compiled in {time.perf_counter() - start:.1f} s, planned peak "
              f"{reports[row]['memory']['peak_bytes_per_rank'] / 2**30:.2f} GiB", flush=True)
    return plans, reports


def traced_ops(args, plan, work, row):
    """With --ops: one more sp-run of 2 steps with --trace (timed on the device on a GPU); the
    milliseconds of step 2 by op, largest first (tools/trace_ops.py's sums)."""
    trace = os.path.join(work, f"trace-{row}.json")
    run([tool(args, "sp-run"), plan, "--synthetic-data", "--seed", str(args.seed), "--steps", "2",
         "--device", args.device, "--log-dir", os.path.join(work, "log"), "--trace", trace]
        + (["--threads", str(args.threads)] if args.device == "cpu" else []), env=SP_RUN_ENV)
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"]
                  if e.get("ph") == "X" and e.get("args", {}).get("step") == 2]
    by_op = {}
    for e in events:
        op = e.get("name", "").split(" ")[0]
        by_op[op] = by_op.get(op, 0.0) + e["dur"] / 1000.0
    return dict(sorted(by_op.items(), key=lambda kv: -kv[1]))


def measure_sp(args, plan, work):
    """One sp-run of --steps + 1 steps: its phase times (first step left out) and its own summary."""
    cmd = [tool(args, "sp-run"), plan, "--synthetic-data", "--seed", str(args.seed), "--steps", str(args.steps + 1),
           "--device", args.device, "--log-dir", os.path.join(work, "log")]
    if args.device == "cpu":
        cmd += ["--threads", str(args.threads)]
    start = time.perf_counter()
    out = run(cmd, env=SP_RUN_ENV)
    wall = time.perf_counter() - start
    m = TIME_LINE.search(out)
    if not m:
        raise SystemExit(f"error: no 'time per step' line in the output of {' '.join(cmd)}")
    phases = dict(zip(["forward", "backward", "recompute", "optimizer"], map(float, m.groups())))
    row = {"ms_per_step": sum(phases.values()), "phases_ms": phases, "process_wall_s": wall}
    t = TRAINED_LINE.search(out)
    if t:
        row["sp_run_line"] = t.group(0)
        row["final_loss"] = float(t.group(1))
        row["sp_run_tokens_per_s"] = float(t.group(2).replace(",", ""))
        row["sp_run_mfu"] = float(t.group(3)) / 100
    return row


# ---------------------------------------------------------------------------------------------
# torch

def torch_model(torch, size, sdpa):
    import math
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h = size.hidden
            self.ln_1 = nn.LayerNorm(h, eps=LAYERNORM_EPS)
            self.c_attn = nn.Linear(h, 3 * h)
            self.attn_proj = nn.Linear(h, h)
            self.ln_2 = nn.LayerNorm(h, eps=LAYERNORM_EPS)
            self.c_fc = nn.Linear(h, 4 * h)
            self.mlp_proj = nn.Linear(4 * h, h)
            self.register_buffer("hidden_keys", None if sdpa else torch.triu(
                torch.ones(size.seq, size.seq, dtype=torch.bool), diagonal=1), persistent=False)

        def attention(self, x):
            b, s, h = x.shape
            q, k, v = self.c_attn(x).split(h, dim=-1)
            q, k, v = (t.view(b, s, size.heads, h // size.heads).transpose(1, 2) for t in (q, k, v))
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=DROPOUT if self.training else 0.0,
                                                   is_causal=True)
            else:  # torch < 2.0: the explicit core
                scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(h // size.heads)
                scores = scores.masked_fill(self.hidden_keys[:s, :s], float("-inf"))
                y = torch.matmul(F.dropout(F.softmax(scores, dim=-1), DROPOUT, self.training), v)
            y = y.transpose(1, 2).reshape(b, s, h)
            return F.dropout(self.attn_proj(y), DROPOUT, self.training)

        def forward(self, x):
            x = x + self.attention(self.ln_1(x))
            y = self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))
            return x + F.dropout(y, DROPOUT, self.training)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(size.vocab, size.hidden)
            self.wpe = nn.Embedding(size.seq, size.hidden)
            self.h = nn.ModuleList(Block() for _ in range(size.layers))
            self.ln_f = nn.LayerNorm(size.hidden, eps=LAYERNORM_EPS)
            for name, p in self.named_parameters():  # gen_paper_graph.py's initial values
                if p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = F.dropout(self.wte(idx) + self.wpe(pos), DROPOUT, self.training)
            for block in self.h:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head, no bias
            return F.cross_entropy(logits.float().view(-1, size.vocab), targets.view(-1))

    return GPT()


def measure_torch(torch, args, size, compiled):
    """ms per training step (forward, backward, AdamW) of the torch model, eager or compiled."""
    dev = torch.device(args.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    notes = []
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    if not sdpa:
        notes.append(f"torch {torch.__version__} has no scaled_dot_product_attention: explicit softmax attention")
    torch.manual_seed(args.seed)
    model = torch_model(torch, size, sdpa).to(dev)
    model.train()
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                fused=True)
        fused = True
    except (TypeError, RuntimeError) as e:  # torch without fused AdamW (or not on this device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        fused = False
        notes.append(f"AdamW(fused=True) refused ({str(e).splitlines()[0][:100]}): the default AdamW")
    step_model = model
    if compiled:
        step_model = torch.compile(model)
    gen_ = torch.Generator().manual_seed(args.seed)
    data = torch.randint(0, size.vocab, (size.batch, size.seq + 1), generator=gen_).to(dev)
    idx, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = step_model(idx, targets)
        loss.backward()
        opt.step()
        return loss

    start = time.perf_counter()
    for _ in range(TORCH_WARMUP["compiled" if compiled else "eager"]):
        step()
    sync()
    warmup = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    seconds = time.perf_counter() - start
    row = {"ms_per_step": 1000 * seconds / args.steps, "warmup_s": warmup, "final_loss": float(loss.item()),
           "sdpa": sdpa, "fused_adamw": fused, "notes": notes}
    if dev.type == "cuda":
        row["peak_memory_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    return row


def run_torch(args, size):
    """{row: result}, and a note: eager, and compiled with --compile."""
    torch, note = import_torch(args.device)
    if torch is None:
        return {}, note
    if args.device == "cpu":
        set_cpu_threads(torch, args.threads)
    rows = {}
    for which in ["eager"] + (["compiled"] if args.compile else []):
        try:
            rows[which] = measure_torch(torch, args, size, which == "compiled")
        except Exception as e:  # noqa: BLE001 (torch.compile's failures are many; report, go on)
            if which == "eager":
                raise
            rows[which] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"}
        finally:
            if args.device != "cpu":
                torch.cuda.empty_cache()
    return rows, note


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (sp-run --device; default cpu)")
    ap.add_argument("--model", choices=sorted(MODELS), default="small")
    ap.add_argument("--batch", type=int, help="sequences per step (default: gpt2-medium 8, small 2)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (sp-run runs one more, left out)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of sp-run and torch")
    ap.add_argument("--peak-tflops", type=float, help="the device's peak for MFU (default: its dense BF16 peak)")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the weights, tokens and dropout")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(model)")
    ap.add_argument("--no-torch", action="store_true", help="measure sp-run only")
    ap.add_argument("--ops", action="store_true",
                    help="also trace one step of each sp row and print its milliseconds by op")
    ap.add_argument("--sp-bin", default=os.path.join(ROOT, "build", "bin"),
                    help="directory with sp-compile and sp-run (default: %(default)s)")
    ap.add_argument("--workdir", help="keep the model and plans here (default: a temporary directory)")
    ap.add_argument("--json", help="write every number to this file")
    args = ap.parse_args()
    if args.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", args.device):
        ap.error("--device must be cpu, cuda or cuda:N")
    if args.steps < 1 or args.threads < 1 or (args.batch is not None and args.batch < 1):
        ap.error("--steps, --threads and --batch must be positive")
    for name in ("sp-compile", "sp-run"):
        if not os.access(tool(args, name), os.X_OK):
            ap.error(f"{tool(args, name)} not found (pass the build's bin/ as --sp-bin)")

    shape = dict(MODELS[args.model])
    if args.batch:
        shape["batch"] = args.batch
    size = gen.GPTSize(**shape, dropout=DROPOUT)
    tokens = size.batch * size.seq
    flops = model_flops(size)
    params = parameters(size)
    name = device_name(args.device)
    peak, peak_source = args.peak_tflops, "--peak-tflops"
    if peak is None and args.device != "cpu":
        peak, peak_source = bf16_peak(name), f"dense BF16 peak of {name}"
    if peak is None:
        peak_source = "no peak known (give --peak-tflops)"
    print(f"whole-model training step on {args.device} ({name}), {args.dtype}")
    print(f"  {args.model}: L {size.layers}, h {size.hidden}, a {size.heads}, s {size.seq}, v {size.vocab}, "
          f"b {size.batch} ({tokens} tokens per step), tied head, dropout {DROPOUT}; "
          f"{params['total'] / 1e6:.1f} M parameters ({params['non_embedding'] / 1e6:.1f} M without embeddings)")
    print(f"  model FLOPs per step {flops:.4e} (72 b s L h^2 (1 + s/6h + V/12hL)); peak: {peak_source}"
          + (f", {peak:g} TFLOP/s" if peak else ""), flush=True)

    work = args.workdir or tempfile.mkdtemp(prefix="sp-bench-model-")
    os.makedirs(work, exist_ok=True)
    try:
        plans, reports = prepare_sp(args, size, work)
        sp = {row: measure_sp(args, plans[row], work) for row in SP_ROWS}
        if args.ops:
            for row in SP_ROWS:
                sp[row]["ops_ms"] = traced_ops(args, plans[row], work, row)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    for row in sp:
        sp[row]["planned_peak_gib"] = reports[row]["memory"]["peak_bytes_per_rank"] / 2**30
    from_report = {row: reports[row]["flops"]["model_flops_per_iteration"] for row in SP_ROWS}
    for row, counted in from_report.items():
        if abs(counted / flops - 1) > 1e-9:
            print(f"  warning: sp-compile --report ({row}) counts {counted:.6e} model FLOPs per step; "
                  f"the formula {flops:.6e}")
    torch_rows, torch_note = ({}, "not run (--no-torch)") if args.no_torch else run_torch(args, size)

    for row in sp.values():
        rates(row, tokens, flops, peak)
    for row in torch_rows.values():
        if "error" not in row:
            rates(row, tokens, flops, peak)

    print(f"\n{args.steps} timed steps (sp-run: the mean of its time per step over the steps after the first)")
    print(f"  {'':<34} {'ms/step':>9} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>7}  notes")

    def line(label, r, notes=""):
        if "error" in r:
            print(f"  {label:<34} {'n/a: ' + r['error']}")
            return
        mfu = f"{100 * r['mfu']:>6.1f}%" if r["mfu"] is not None else f"{'n/a':>7}"
        print(f"  {label:<34} {r['ms_per_step']:>9.2f} {r['tokens_per_s']:>10,.0f} {r['model_tflops']:>8.3g} "
              f"{mfu}  {notes}")

    for row, r in sp.items():
        own = (f"sp-run's own: {r['sp_run_tokens_per_s']:,.0f} tok/s, MFU {100 * r['sp_run_mfu']:.1f}% (all steps, "
               f"its peak); " if "sp_run_mfu" in r else "")
        line(f"sp {row} ({SP_ROWS[row]})", r, f"{own}planned peak {r['planned_peak_gib']:.2f} GiB")
    for which in ("eager", "compiled"):
        if which in torch_rows:
            r = torch_rows[which]
            notes = "; ".join(r.get("notes", []))
            if "peak_memory_gib" in r:
                notes = f"peak allocated {r['peak_memory_gib']:.2f} GiB" + (f"; {notes}" if notes else "")
            line(f"torch {which}", r, notes)
    if not torch_rows:
        print(f"  torch: {torch_note}")
    ratios = {}
    for row in sp:
        for which, r in torch_rows.items():
            if "error" not in r:
                ratios[f"sp {row} / torch {which}"] = sp[row]["tokens_per_s"] / r["tokens_per_s"]
    if ratios:
        print("  tokens/s, sp / torch: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    for row, r in sp.items():
        if "ops_ms" in r:
            top = list(r["ops_ms"].items())[:12]
            print(f"  sp {row}, one traced step by op ({sum(r['ops_ms'].values()):.2f} ms in all): "
                  + ", ".join(f"{op} {ms:.2f}" for op, ms in top))

    if args.json:
        result = {
            "model": args.model, "device": args.device, "device_name": name, "dtype": args.dtype,
            "shape": dataclasses.asdict(size), "tokens_per_step": tokens, "parameters": params,
            "steps": args.steps, "threads": args.threads if args.device == "cpu" else None,
            "peak_tflops": peak, "peak_source": peak_source,
            "flops": {"model_per_step": flops, "formula": "72 b s L h^2 (1 + s/(6h) + V/(12 h L))",
                      "from_report": from_report},
            "parameters_from_report": reports["fused"]["model"]["params"],
            "sp": sp, "torch": torch_rows, "torch_note": torch_note, "ratios_tokens_per_s": ratios,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
