#!/usr/bin/python3
"""Benchmark: one Transformer layer, forward and backward, at the paper's per-GPU shapes (issue 13).

Measures what the paper's Table 4 measures: the time of one layer's forward and backward on one
GPU of a t = 8 tensor-parallel group, with no recomputation, selective and full recomputation,
the overheads of the last two, the layer's model TFLOP/s and its MFU against the device's peak;
and the same layer written with torch.nn.functional, on the same device, in the same run. A
fourth sp-run row, "fused", is the layer compiled with sp-compile's default fused attention core
(--attention fused: no scores stored; on a GPU by the blockwise kernels of
runtime/cuda/kernels/Attention.cuh, which store no scores either), its overhead against the
unfused "none"; on a GPU a fifth, "exact", runs the "none" plan with sp-run --cuda-numerics exact
(the kernels that give the CPU's bits), against the default fast kernels of the other rows.

    /usr/bin/python3 tools/bench_gpu.py --device cuda --model 22B [--steps 10] [--repeat 3] [--json r.json]
    /usr/bin/python3 tools/bench_gpu.py --device cpu --model small --steps 2 --repeat 1

Per-GPU shapes. A single GPU cannot run a t = 8 plan (sp-run wants one GPU per rank), so the
benchmark compiles a ONE-layer model whose layer IS one rank's shard of the t = 8 layer
(models/gen_paper_graph.py --shard t): a/t heads of head size h/a, QKV weight [3h/t, h],
attention projection [h, h/t], fc1 [4h/t, h], fc2 [h, 4h/t]. Its GEMMs are exactly a Megatron
rank's at t = 8. What differs from a rank of the real t = 8 run, stated in the output:
  - the collectives are absent (f/f-bar all-reduces, or the SP all-gathers and reduce-scatters),
    so their time is not counted, as if they were perfectly overlapped;
  - LayerNorm, the dropouts and the residual adds run on all s rows: that is a rank of plain
    tensor parallelism (Table 4's "baseline" rows), not sequence parallelism, under which each
    rank runs them on s/t rows;
  - the row-parallel biases (projection, fc2) are added on the rank, not once after the sum.
sp-compile accepts this model as it is: detection reads structure, not widths, and the widths
of the q/k/v heads and of the MLP are read off the graph.

What is timed. sp-run prints the time of each phase's instructions per step, the first step left
out ("time per step: forward, backward, recompute, optimizer"). A step also runs the token and
position embeddings, the final LayerNorm, the (tied) head and the loss, and the optimizer. The
model is made with a 256-token vocabulary (the byte-level data of sp-tokenize), which keeps the
head small, and the layer's time is taken apart from the rest: each round runs each plan twice,
once plainly and once with --trace; the layer's time in a phase is the plain run's phase time
minus the time the traced run spent in that phase's instructions outside the layer (embedding,
final norm, head, loss). On the GPU the trace is timed on the device (CUDA events around each
call), so a traced instruction's duration is its device time; only those few instructions'
traced times are used, not the layer's own (which the JSON keeps as traced_layer_ms). The optimizer (AdamW over
the whole model) is reported apart and left out, as in bench_recompute.py and the paper's
per-layer times. "combined" = forward + backward + recompute of the layer.

FLOPs. The paper's count of one layer's forward, 24 b s h^2 (1 + s/(6h)), divided by t for a
rank's shard (only matrix products, 2mnk each); backward twice that; model FLOPs per step 3x.
Recomputation adds hardware FLOPs: full the whole forward again, selective the attention
core's GEMM that sp recomputes, Q K^T (2 b s^2 h / t; Megatron also recomputes attention over V,
4 b s^2 h / t). The numbers are checked against sp-compile --report (its per-iteration GEMM
count, minus the head's 6 b s h v, over the one layer). MFU = model FLOPs / combined time /
peak; HFU counts the recomputed FLOPs too.

Precision. sp-run runs the fp32 plans (on cuda also with --tf32, TF32 tensor-core GEMMs), and with
--dtype bf16 the same layer compiled with sp-compile --dtype bf16 (16-bit activations and
parameter copies, float32 masters; on cuda the GEMMs on bf16 tensor cores), beside torch's layer in
bf16. MFU is reported against the device's dense BF16 peak for every row (the paper's A100 figure
is 312 TFLOP/s, a BF16 peak), so the fp32 rows are far below what the hardware can do in bf16. --peak-tflops overrides the peak table; on
the CPU MFU is n/a unless it is given.

Torch. The same layer in torch.nn.functional (LayerNorm, QKV linear, scale, causal mask, softmax,
dropout, attention over V, projection, dropout + residual, LayerNorm, fc1, GELU, fc2, dropout +
residual), same shapes, dtype and dropout 0.1, forward and backward (the gradients of the
parameters and of the layer input) timed separately, with torch.cuda.synchronize on the GPU.
Selective: torch.utils.checkpoint of the attention core (Q K^T through attention over V); full:
torch.utils.checkpoint of the whole layer; torch's recomputation is inside its backward. Torch is
optional (a GPU machine may not have it): without it only sp-run is measured. The model and its
weights need numpy and onnx only.

Flags: --device cpu|cuda[:N] (passed to sp-run --device), --model 22B|175B|small (22B and 175B
from models/paper/models.csv: h, a, s, b and t; small: h 256, a 8, s 256, b 2 sharded 4 ways,
seconds on a 2-core CPU), --dtype fp32|bf16, --steps N (timed steps; N + 1 are run), --repeat R
(rounds, modes interleaved; the fastest round of each counts), --threads (CPU kernel threads of
sp-run and torch; default all cores), --bf16-only (with --dtype bf16: no fp32 or TF32 rows),
--torch-compile (torch's layer also through torch.compile: the "compiled" row), --sp-bin,
--workdir (kept), --json FILE (every number).
"""
import argparse
import csv
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

# Before torch is imported (lazily, below): idle OpenMP workers sleep instead of spinning against
# the OpenBLAS threads (see bench_train.py). sp-run gets the environment as it was.
from bench_gpu_torch import DROPOUT, MODES, import_torch, measure_torch, set_cpu_threads  # noqa: E402

SP_RUN_ENV = dict(os.environ)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "models"))
import gen_paper_graph as gen  # noqa: E402

# sp-run's modes: the paper's three with the unfused core, and the fused attention core
# (sp-compile's default, --attention fused, nothing recomputed but inside the core's backward).
SP_MODES = MODES + ["fused"]
# On a GPU also the unfused plan with the CUDA backend's exact kernels (--cuda-numerics exact: the
# CPU's bits), beside the default fast ones.
GPU_MODES = SP_MODES + ["exact"]


def sp_modes(args):
    return GPU_MODES if args.device.startswith("cuda") else SP_MODES
PHASES = ["forward", "backward", "recompute"]
TRACE_PHASE = {"fwd": "forward", "bwd": "backward", "recompute": "recompute", "opt": "optimizer"}
TIME_LINE = re.compile(r"time per step: forward ([\d.]+) ms, backward ([\d.]+) ms, "
                       r"recompute ([\d.]+) ms, optimizer ([\d.]+) ms")
VOCAB = 256  # sp-tokenize's byte-level ids
SMALL = {"hidden": 256, "heads": 8, "seq": 256, "batch": 2, "t": 4}

# The paper's Table 4: one 22B layer (h 6144, a 64, s 2048, b 4, t 8) on A100s, in ms.
PAPER_TABLE4 = [
    ("baseline no recompute", 7.7, 11.9, 19.6, None),
    ("sequence parallelism", 7.2, 11.8, 19.0, -3),
    ("baseline with recompute (full)", 7.7, 19.5, 27.2, 39),
    ("selective recompute", 7.7, 13.2, 20.9, 7),
    ("selective recompute + sequence parallelism", 7.2, 13.1, 20.3, 4),
]

# Dense BF16 tensor-core peaks (TFLOP/s, no sparsity), from NVIDIA's data sheets, matched in order
# against the device name (nvidia-smi's, e.g. "NVIDIA H100 80GB HBM3" for the SXM part).
BF16_PEAK_TFLOPS = [
    ("GH200", 989.0), ("H200", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0),
    ("A100", 312.0), ("L40S", 362.0),
]


@dataclasses.dataclass
class LayerShape:
    """One rank's layer of a t-way tensor-parallel Transformer layer."""
    name: str
    hidden: int
    heads: int
    seq: int
    batch: int
    t: int

    def size(self):
        """The one-layer model of this shard, as gen_paper_graph.py writes it (its GPTSize owns the
        shard's widths)."""
        return gen.GPTSize(layers=1, hidden=self.hidden, heads=self.heads, seq=self.seq, vocab=VOCAB,
                           batch=self.batch, dropout=DROPOUT, shard=self.t)

    head_dim = property(lambda self: self.size().head_dim)
    local_heads = property(lambda self: self.size().local_heads)
    inner = property(lambda self: self.size().inner)
    ffn = property(lambda self: self.size().ffn)

    def describe(self):
        return (f"{self.name}: h {self.hidden}, a {self.heads}, s {self.seq}, b {self.batch}, t {self.t}: "
                f"one rank's layer: {self.local_heads} heads of {self.head_dim}, QKV [{self.hidden}, "
                f"{3 * self.inner}], proj [{self.inner}, {self.hidden}], fc1 [{self.hidden}, {self.ffn}], "
                f"fc2 [{self.ffn}, {self.hidden}]")


def layer_shape(model):
    if model == "small":
        return LayerShape("small", **SMALL)
    with open(gen.DEFAULT_MODELS_CSV, newline="") as f:
        rows = {row["model"]: row for row in csv.DictReader(f)}
    if model not in rows:
        raise SystemExit(f"error: no model {model!r} in {gen.DEFAULT_MODELS_CSV}")
    row = rows[model]
    return LayerShape(model, hidden=int(row["hidden_h"]), heads=int(row["attention_heads_a"]),
                      seq=int(row["seq_s"]), batch=int(row["micro_batch_b"]), t=int(row["tensor_parallel_t"]))


def layer_flops(sh):
    """The paper's GEMM FLOPs of one rank's layer per step: forward 24 b s h^2 (1 + s/(6h)) / t,
    backward twice that, and what each recompute mode adds."""
    b, s, h, t = sh.batch, sh.seq, sh.hidden, sh.t
    forward = (24 * b * s * h * h + 4 * b * s * s * h) // t  # = 24bsh^2 (1 + s/6h) / t, exactly
    return {"forward": forward, "backward": 2 * forward, "model_per_step": 3 * forward,
            "recompute": {"none": 0, "selective": 2 * b * s * s * h // t, "full": forward,
                          "fused": 2 * b * s * s * h // t, "exact": 0},
            "megatron_selective_recompute": 4 * b * s * s * h // t,
            "formula": "forward 24 b s h^2 (1 + s/(6h)) / t; backward 2x; selective recomputes Q K^T "
                       "(2 b s^2 h / t), full the forward; the fused core's backward recomputes Q K^T "
                       "too (inside its backward: no recompute phase)"}


def report_flops(report, sh):
    """The layer's model and recompute FLOPs per step read off sp-compile --report (per iteration,
    the tied head's 2 b s h v forward and 4 b s h v backward taken out; one layer)."""
    f = report["flops"]
    head = 6 * sh.batch * sh.seq * sh.hidden * report["model"]["vocab"]
    layers = report["model"]["layers"]
    return {"model_per_step": (f["model_flops_per_iteration"] - head) / layers,
            "recompute": f["recompute_flops_per_iteration"] / layers}


def device_name(device):
    if device == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
        except OSError:
            pass
        return f"{platform.processor() or 'cpu'}, {os.cpu_count()} cores"
    index = device.split(":")[1] if ":" in device else "0"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", index],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:  # no nvidia-smi: torch, if it is there
        import torch
        return torch.cuda.get_device_name(int(index))
    except Exception:  # noqa: BLE001 (no torch, no CUDA torch, no such device: the name is unknown)
        return "unknown GPU"


def bf16_peak(name):
    for key, peak in BF16_PEAK_TFLOPS:
        if key.lower() in name.lower():
            return peak
    return None


def run(cmd, env=None):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}"
                         f"{proc.stderr.strip()}")
    return proc.stdout


# ---------------------------------------------------------------------------------------------
# sp-run

def prepare(args, sh, work):
    """The one-layer shard model with its weights, the token file, and the three plans with their
    reports; returns (data, {mode: plan}, {mode: report})."""
    size = sh.size()
    model = os.path.join(work, f"layer-{sh.name}.onnx")
    start = time.perf_counter()
    gen.write_graph(size, model, f"{sh.name} layer shard 1/{sh.t}", weights=True, seed=args.seed)
    weights = os.path.splitext(model)[0] + ".weights.bin"
    print(f"model: {model} (+ {os.path.getsize(weights) / 2**20:.1f} MiB of weights), "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    data = os.path.join(work, "data.bin")
    run([tool(args, "sp-tokenize"), os.path.join(ROOT, "models", "data", "python-reference.txt"), "-o", data])
    plans, reports = {}, {}
    for dtype in ["fp32"] + (["bf16"] if args.dtype == "bf16" else []):
        plans[dtype] = {}
        for mode in SP_MODES:
            suffix = "" if dtype == "fp32" else "-bf16"
            plans[dtype][mode] = os.path.join(work, f"plan-{mode}{suffix}")
            shutil.rmtree(plans[dtype][mode], ignore_errors=True)
            report = os.path.join(work, f"report-{mode}{suffix}.json")
            core = ["--recompute", "none", "--attention", "fused"] if mode == "fused" else \
                ["--recompute", mode, "--attention", "unfused"]
            run([tool(args, "sp-compile"), model, "-o", plans[dtype][mode], *core,
                 "--dtype", dtype, "--quiet", "--report", report])
            if dtype == "fp32":
                with open(report) as f:
                    reports[mode] = json.load(f)
        plans[dtype]["exact"] = plans[dtype]["none"]  # run with --cuda-numerics exact
    reports["exact"] = reports["none"]
    return data, plans, reports


def tool(args, name):
    return os.path.join(args.sp_bin, name)


def sp_run_once(args, plan, data, precision, work, trace=None, mode=None):
    """One sp-run of --steps + 1 steps; returns its phase times per step (ms, first step left out)."""
    cmd = [tool(args, "sp-run"), plan, "--data", data, "--steps", str(args.steps + 1), "--device", args.device,
           "--log-dir", os.path.join(work, "log")]
    if args.device == "cpu":
        cmd += ["--threads", str(args.threads)]
    if precision == "tf32":
        cmd.append("--tf32")
    if mode == "exact":
        cmd += ["--cuda-numerics", "exact"]
    if trace:
        cmd += ["--trace", trace]
    m = TIME_LINE.search(run(cmd, env=SP_RUN_ENV))
    if not m:
        raise SystemExit(f"error: no 'time per step' line in the output of {' '.join(cmd)}")
    return dict(zip(PHASES + ["optimizer"], map(float, m.groups())))


def traced_split(path):
    """Per step (the first left out), ms spent in each phase inside layer 0 and outside any layer."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted({e["args"]["step"] for e in events})
    timed = set(steps[1:]) if len(steps) > 1 else set(steps)
    split = {"layer": {p: 0.0 for p in PHASES + ["optimizer"]},
             "outside": {p: 0.0 for p in PHASES + ["optimizer"]}}
    for e in events:
        if e["args"]["step"] in timed:
            where = "layer" if e["args"].get("layer", -1) >= 0 else "outside"
            split[where][TRACE_PHASE[e["args"]["phase"]]] += e["dur"] / 1000.0 / len(timed)
    return split


def measure_sp(args, plans, data, precision, work):
    """The fastest of --repeat rounds for each mode: the layer's ms per phase, and the rest."""
    best = {}
    for _ in range(args.repeat):
        for mode in sp_modes(args):
            plain = sp_run_once(args, plans[mode], data, precision, work, mode=mode)
            trace = os.path.join(work, f"trace-{mode}.json")
            sp_run_once(args, plans[mode], data, precision, work, trace, mode=mode)
            split = traced_split(trace)
            layer = {p: plain[p] - split["outside"][p] for p in PHASES}
            # The two runs are timed apart: on a loaded machine (the CPU smoke test beside other
            # tests) a phase's difference can come out at or below 0. The traced run's own time
            # inside the layer is taken then.
            if any(layer[p] <= 0 < split["layer"][p] for p in PHASES):
                layer = dict(split["layer"])
            row = {"forward_ms": layer["forward"], "backward_ms": layer["backward"] + layer["recompute"],
                   "recompute_ms": layer["recompute"],
                   "combined_ms": sum(layer.values()),
                   "outside_layer_ms": {p: split["outside"][p] for p in ("forward", "backward")},
                   "optimizer_ms": plain["optimizer"],
                   "step_phases_ms": {p: plain[p] for p in PHASES + ["optimizer"]},
                   "traced_layer_ms": {p: split["layer"][p] for p in PHASES}}
            if mode not in best or row["combined_ms"] < best[mode]["combined_ms"]:
                best[mode] = row
    return best


# ---------------------------------------------------------------------------------------------
# torch

def add_rates(rows, flops, peak):
    """Overheads against none, model TFLOP/s, MFU and HFU (None without a peak)."""
    base = rows["none"]["combined_ms"]
    for mode, row in rows.items():
        seconds = row["combined_ms"] / 1000
        hardware = flops["model_per_step"] + flops["recompute"].get(mode, 0)
        row["overhead_pct"] = 100 * (row["combined_ms"] / base - 1) if base > 0 else float("nan")
        row["model_tflops"] = flops["model_per_step"] / seconds / 1e12 if seconds > 0 else None
        row["hardware_tflops"] = hardware / seconds / 1e12 if seconds > 0 else None
        row["mfu"] = row["model_tflops"] / peak if peak and row["model_tflops"] else None
        row["hfu"] = row["hardware_tflops"] / peak if peak and row["hardware_tflops"] else None


def print_table(title, rows, with_recompute=True):
    print(title)
    print(f"  {'mode':<10} {'forward ms':>10} {'backward ms':>12} {'(recompute)':>12} {'combined ms':>12} "
          f"{'overhead':>9} {'TFLOP/s':>8} {'MFU':>7}")
    for mode in GPU_MODES + ["compiled"]:  # (compiled: torch's, with --torch-compile)
        if mode not in rows:
            continue
        r = rows[mode]
        rec = f"{r['recompute_ms']:>12.2f}" if with_recompute else f"{'(in bwd)':>12}"
        mfu = f"{100 * r['mfu']:>6.1f}%" if r["mfu"] is not None else f"{'n/a':>7}"
        # (a zero time has no rate)
        tflops = f"{r['model_tflops']:>8.3g}" if r["model_tflops"] is not None else f"{'n/a':>8}"
        print(f"  {mode:<10} {r['forward_ms']:>10.2f} {r['backward_ms']:>12.2f} {rec} {r['combined_ms']:>12.2f} "
              f"{r['overhead_pct']:>8.1f}% {tflops} {mfu}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (sp-run --device; default cpu)")
    ap.add_argument("--model", choices=["22B", "175B", "small"], default="small")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="fp32 (sp-run and torch; on cuda also TF32); bf16 adds bf16 runs of both")
    ap.add_argument("--torch-compile", action="store_true",
                    help="also time torch's layer through torch.compile (the 'compiled' row; torch 2.x)")
    ap.add_argument("--bf16-only", action="store_true",
                    help="with --dtype bf16: measure the bf16 plans only (no fp32 or TF32 rows)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (one more is run and left out)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the fastest of each mode counts")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of sp-run and torch")
    ap.add_argument("--peak-tflops", type=float, help="the device's peak for MFU (default: its bf16 peak)")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the weights")
    ap.add_argument("--no-torch", action="store_true", help="measure sp-run only")
    ap.add_argument("--sp-bin", default=os.path.join(ROOT, "build", "bin"),
                    help="directory with sp-compile, sp-run and sp-tokenize (default: %(default)s)")
    ap.add_argument("--workdir", help="keep the model, plans and traces here (default: a temporary directory)")
    ap.add_argument("--json", help="write every number to this file")
    args = ap.parse_args()
    if args.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", args.device):
        ap.error("--device must be cpu, cuda or cuda:N")
    if args.steps < 1 or args.repeat < 1 or args.threads < 1:
        ap.error("--steps, --repeat and --threads must be positive")
    for name in ("sp-compile", "sp-run", "sp-tokenize"):
        if not os.access(tool(args, name), os.X_OK):
            ap.error(f"{tool(args, name)} not found (pass the build's bin/ as --sp-bin)")

    sh = layer_shape(args.model)
    flops = layer_flops(sh)
    name = device_name(args.device)
    peak, peak_source = args.peak_tflops, "--peak-tflops"
    if peak is None and args.device != "cpu":
        peak, peak_source = bf16_peak(name), f"dense BF16 peak of {name}"
    if peak is None:
        peak_source = "no peak known (give --peak-tflops)"
    precisions = ["fp32"] if args.device == "cpu" else ["fp32", "tf32"]
    if args.bf16_only:
        if args.dtype != "bf16":
            raise SystemExit("error: --bf16-only needs --dtype bf16")
        precisions = []
    work = args.workdir or tempfile.mkdtemp(prefix="sp-bench-gpu-")
    os.makedirs(work, exist_ok=True)

    print(f"one Transformer layer, forward + backward, on {args.device} ({name})")
    print(f"  {sh.describe()}")
    print("  the layer of one tensor-parallel rank run alone: collectives not timed; LayerNorm, dropout and "
          "residual on all s rows (plain TP, not SP); embedding, head, loss and optimizer excluded")
    print(f"  model FLOPs per step {flops['model_per_step']:.4e} (forward {flops['forward']:.4e} = "
          f"24 b s h^2 (1 + s/6h) / t); peak: {peak_source}"
          + (f", {peak:g} TFLOP/s" if peak else ""), flush=True)
    try:
        data, plans, reports = prepare(args, sh, work)
        from_report = {mode: report_flops(reports[mode], sh) for mode in sp_modes(args)}
        for mode in sp_modes(args):
            r = from_report[mode]
            if r["model_per_step"] != flops["model_per_step"] or r["recompute"] != flops["recompute"][mode]:
                print(f"  warning: sp-compile --report ({mode}) counts {r['model_per_step']:.6e} model and "
                      f"{r['recompute']:.6e} recompute FLOPs per layer; the formula "
                      f"{flops['model_per_step']:.6e} and {flops['recompute'][mode]:.6e}")
        sp = {prec: measure_sp(args, plans["bf16" if prec == "bf16" else "fp32"], data, prec, work)
              for prec in precisions + (["bf16"] if args.dtype == "bf16" else [])}
        torch_rows, torch_note = {}, "not run (--no-torch)"
        if not args.no_torch:
            torch, torch_note = import_torch(args.device)
            if torch is not None:
                if args.device == "cpu":
                    set_cpu_threads(torch, args.threads)
                for prec in precisions + (["bf16"] if args.dtype == "bf16" else []):
                    torch_rows[prec] = measure_torch(torch, args, sh, prec)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    for prec in sp:
        add_rates(sp[prec], flops, peak)
    for prec in torch_rows:
        add_rates(torch_rows[prec], flops, peak)
    print(f"\nfastest of {args.repeat} rounds of {args.steps} steps (the first step of each run left out); "
          f"layer times in ms per step")
    for prec in sp:
        what = {"fp32": "fp32", "tf32": "fp32 with TF32 GEMMs (--tf32)",
                "bf16": "bf16 (--dtype bf16: 16-bit activations, float32 masters)"}[prec]
        print_table(f"sp-run, {what}:", sp[prec])
        outside = sp[prec]["none"]
        print(f"  outside the layer (not counted): embedding, final norm, head, loss: forward "
              f"{outside['outside_layer_ms']['forward']:.2f} ms, backward "
              f"{outside['outside_layer_ms']['backward']:.2f} ms; optimizer {outside['optimizer_ms']:.2f} ms")
        if prec in torch_rows:
            print_table(f"torch, same layer, {'bf16' if prec == 'bf16' else what} (recompute inside its backward):",
                        torch_rows[prec], with_recompute=False)
            print("  sp / torch combined: " + ", ".join(
                f"{mode} {sp[prec][mode]['combined_ms'] / torch_rows[prec][mode]['combined_ms']:.2f}"
                for mode in MODES) +
                "".join(f"; {mode} / torch none "
                        f"{sp[prec][mode]['combined_ms'] / torch_rows[prec]['none']['combined_ms']:.2f}"
                        for mode in ("fused", "exact") if mode in sp[prec]) +
                ("; none / torch compiled "
                 f"{sp[prec]['none']['combined_ms'] / torch_rows[prec]['compiled']['combined_ms']:.2f}"
                 if "compiled" in torch_rows[prec] else ""))
    if not torch_rows:
        print(f"torch: {torch_note}")
    print("MFU is against the dense BF16 peak (fp32 and TF32 rows included)." if peak and args.device != "cpu" else
          "MFU: n/a on the CPU without --peak-tflops." if not peak else
          f"MFU against --peak-tflops {peak:g}.")
    print("paper, Table 4 (22B, t 8, one layer on A100s, 16-bit):")
    for label, fwd, bwd, combined, overhead in PAPER_TABLE4:
        print(f"  {label:<44} forward {fwd:>4} ms, backward {bwd:>4} ms, combined {combined:>4} ms"
              + (f", overhead {overhead:+d}%" if overhead is not None else ""))
    print("  (this benchmark's rows compare with the plain-TP rows: selective 7%, full 39%; "
          "with SP the paper's selective overhead is 4%)")

    if args.json:
        result = {
            "model": args.model, "device": args.device, "device_name": name,
            "shape": dict(dataclasses.asdict(sh), local_heads=sh.local_heads, head_dim=sh.head_dim,
                          inner=sh.inner, ffn=sh.ffn, vocab=VOCAB, dropout=DROPOUT),
            "method": "one-layer model whose layer is one rank's shard at t (gen_paper_graph.py --shard); "
                      "collectives not timed; LayerNorm/dropout/residual on all s rows (TP without SP); "
                      "layer time = sp-run phase time minus the traced time of the instructions outside "
                      "the layer (embedding, final norm, head, loss); optimizer excluded",
            "steps": args.steps, "repeat": args.repeat, "threads": args.threads,
            "peak_tflops": peak, "peak_source": peak_source,
            "flops": dict(flops, from_report=from_report),
            "sp": sp, "torch": torch_rows, "torch_note": torch_note,
            "paper_table4": [{"configuration": c, "forward_ms": f, "backward_ms": b, "combined_ms": m,
                              "overhead_pct": o} for c, f, b, m, o in PAPER_TABLE4],
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
