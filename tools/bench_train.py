#!/usr/bin/python3
"""Benchmark: training step time of sp-run against PyTorch on the same model, data and threads.

For each model it writes one token file and compiles the model with `sp-compile -o PLAN
--attention A` (A fused, sp-compile's default, and unfused, the paper's ops: --attention picks
one), then measures, in this one run, side by side:
  - sp-run: `sp-run PLAN --data DATA --dropout 0.1 --threads T` with --steps W and with
    --steps W+N; each reports the wall time of its training loop ("trained steps 1-K: ... in
    X s"), which leaves out the process startup, plan and weight loading and the arena's first
    touch. The difference of the two over N is the time of a step with the first W (warm-up)
    steps taken out as well. Each is the fastest of --repeat runs. N is 200 for tiny (its steps
    take milliseconds: fewer would leave the difference to the 10 ms resolution of the report)
    and 20 for medium unless --steps says otherwise. (Process wall times were used before:
    loading gpt2s's 367 MB of weights and zeroing its 2.7 GB of pages varies by seconds from
    run to run, which made a 5-step difference up to 20% off.)
  - torch: models/gpt.py's GPT with the same config and the same weights (loaded from the ONNX
    file), dropout 0.1, the same batches (the sp-run data formula), AdamW (two param groups) with
    clip_grad_norm_(1.0) and the spec's LR schedule, T intra-op threads and T OpenBLAS threads
    (OMP_WAIT_POLICY=PASSIVE unless set; see below); W warm-up steps, then N steps timed in this
    process. Each of --repeat rounds times sp-run and then torch; the table
    shows the fastest round of each.
Both sides train in float32 with dropout on. It prints one row per model: sp-run and torch
milliseconds per step and the ratio torch/sp (> 1: sp-run is faster), and sp-run's achieved
GFLOP/s (the model's FLOPs per step from `sp-compile --report`, model_flops_per_iteration: the
GEMMs of the forward and backward, over the step time) beside OpenBLAS sgemm's rate measured in
this run (torch.mm in float32, which calls the same OpenBLAS, on the model's fc1 product
[b s, h] x [h, 4h] at T threads; the fastest of 10).

Models: "tiny" is the committed models/tiny/gpt-tiny.onnx (L 2, h 64, 4 heads, s 64, v 256,
batch 4); "medium" is exported with models/export_gpt.py (L 4, h 256, 8 heads, s 128, v 512,
batch 8, opset 17, tied); "gpt2s" is GPT-2-small's shape (L 12, h 768, 12 heads, s 256, v 8192,
batch 4, tied; 5 timed steps unless --steps says otherwise).

    /usr/bin/python3 tools/bench_train.py --sp-bin build/bin [--threads 2] [--steps N] [--models tiny medium gpt2s]
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# Before torch starts OpenMP: idle OpenMP workers sleep instead of spinning. Otherwise they spin
# for a while after every parallel region and take the cores from the OpenBLAS threads the next
# GEMM wakes (torch's Debian build calls the same pthreads OpenBLAS as sp-run): on 2 cores that
# makes torch at 2 threads about 2x slower than at 1 thread, which would flatter sp-run.
SP_RUN_ENV = dict(os.environ)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "models"))
import export_gpt  # noqa: E402
import torch_reference as ref  # noqa: E402

DROPOUT = 0.1
LR = 1e-3
TOKENS = 100_000
DATA_SEED = 7

MEDIUM_ARGV = ["--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "128", "--vocab", "512",
               "--batch", "8", "--opset", "17", "--tied", "--dropout", str(DROPOUT), "--seed", "1234"]
GPT2S_ARGV = ["--layers", "12", "--hidden", "768", "--heads", "12", "--seq", "256", "--vocab", "8192",
              "--batch", "4", "--opset", "17", "--tied", "--dropout", str(DROPOUT), "--seed", "1234"]


def model_path(name, workdir):
    if name == "tiny":
        return os.path.join(ROOT, "models", "tiny", "gpt-tiny.onnx")
    if name in ("medium", "gpt2s"):
        path = os.path.join(workdir, f"gpt-{name}.onnx")
        export_gpt.main(["-o", path] + (MEDIUM_ARGV if name == "medium" else GPT2S_ARGV))
        return path
    raise SystemExit(f"error: unknown model {name!r} (tiny, medium, gpt2s)")


def set_torch_threads(threads):
    """torch's intra-op threads and the OpenBLAS threads of its GEMMs to `threads`; returns a description.

    torch.set_num_threads does not reach the system OpenBLAS that torch's Debian build calls (it
    keeps one thread per core), so it is set directly, as sp-run --threads does for its own.
    """
    torch.set_num_threads(threads)
    with open("/proc/self/maps") as f:
        libs = sorted({os.path.realpath(line.split()[-1]) for line in f
                       if "openblas" in line and ".so" in line.split()[-1]})
    blas, cores = [], []
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_set_num_threads(threads)
            blas.append(str(lib.openblas_get_num_threads()))
            lib.openblas_get_corename.restype = ctypes.c_char_p
            cores.append(lib.openblas_get_corename().decode())
        except (OSError, AttributeError):
            continue
    blas = "/".join(sorted(set(blas))) or "not set (no OpenBLAS found)"
    # The kernels both sides' GEMMs run (sp-run links the same OpenBLAS): a VM that hides the
    # CPU model gets the generic Prescott ones unless OPENBLAS_CORETYPE says otherwise.
    core = "/".join(sorted(set(cores))) or "unknown"
    return (f"torch intra-op threads {torch.get_num_threads()}, OpenBLAS threads {blas}, "
            f"OpenBLAS kernels {core} (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}), "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")


def compile_plan(sp_compile, onnx_path, plan, attention):
    """Compiles the plan; returns the model's FLOPs per training step (sp-compile --report)."""
    shutil.rmtree(plan, ignore_errors=True)
    report = plan + "-report.json"
    subprocess.run([sp_compile, onnx_path, "-o", plan, "--attention", attention, "--quiet",
                    "--report", report], check=True)
    with open(report) as f:
        return json.load(f)["flops"]["model_flops_per_iteration"]


def sgemm_gflops(facts, repeat=10):
    """OpenBLAS sgemm's GFLOP/s on the model's fc1 product [b s, h] x [h, 4h], through torch.mm in
    float32 at the threads set by set_torch_threads: the fastest of `repeat`."""
    m, k = facts["batch"] * facts["seq"], facts["hidden"]
    n = 4 * k
    g = torch.Generator().manual_seed(1)
    a, b = torch.rand(m, k, generator=g), torch.rand(k, n, generator=g)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * m * n * k / best / 1e9


def time_sp_run(sp_run, plan, data, steps, threads, workdir, env=None):
    """Wall seconds of the training loop of one sp-run process training `steps` steps, as sp-run
    reports it (env: extra environment)."""
    run_dir = os.path.join(workdir, "sp-run-out")
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sp_run, plan, "--data", data, "--steps", str(steps), "--dropout", str(DROPOUT), "--lr", str(LR),
           "--threads", str(threads), "--log-dir", os.path.join(run_dir, "log")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(SP_RUN_ENV, **(env or {})))
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr.strip()}")
    m = re.search(r"^trained steps 1-\d+: .* tokens in ([0-9.]+) s\)$", proc.stdout, re.M)
    if not m:
        raise SystemExit(f"error: no 'trained steps' line in the output of {' '.join(cmd)}:\n{proc.stdout}")
    return float(m.group(1))


def torch_ms_per_step(onnx_path, facts, tokens, warmup, steps):
    """Milliseconds per training step of the torch reference, timed after `warmup` steps."""
    torch.manual_seed(1234)
    model = ref.reference_model(onnx_path, dropout=DROPOUT, facts=facts)
    stamps = {}

    def stamp(t):
        if t in (warmup, warmup + steps):
            stamps[t] = time.perf_counter()

    ref.train(model, tokens, facts["batch"], facts["seq"], warmup + steps, LR, callback=stamp)
    return 1000.0 * (stamps[warmup + steps] - stamps[warmup]) / steps


DEFAULT_STEPS = {"tiny": 200, "medium": 20, "gpt2s": 5}


def measure(sp_run, plans, data, onnx_path, facts, tokens, args, steps, workdir):
    """({attention: (sp-run ms/step, training-loop seconds of a warm-up-only sp-run)}, torch ms/step): the fastest
    of --repeat rounds, each round timing every plan and torch one after the other so that load
    from elsewhere hits all of them."""
    short, long, torch_ms = {a: [] for a in plans}, {a: [] for a in plans}, []
    for _ in range(args.repeat):
        for a, plan in plans.items():
            short[a].append(time_sp_run(sp_run, plan, data, args.warmup, args.threads, workdir))
            long[a].append(time_sp_run(sp_run, plan, data, args.warmup + steps, args.threads, workdir))
        torch_ms.append(torch_ms_per_step(onnx_path, facts, tokens, args.warmup, steps))
    return ({a: (1000.0 * (min(long[a]) - min(short[a])) / steps, min(short[a])) for a in plans},
            min(torch_ms))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sp-bin", default=os.path.join(ROOT, "build", "bin"),
                    help="directory holding sp-compile and sp-run (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2,
                    help="sp-run --threads; torch intra-op and BLAS threads (default 2)")
    ap.add_argument("--steps", type=int, help="timed steps N (default: 200 for tiny, 20 for medium)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps W (default 3)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the fastest of each side counts (default 3)")
    ap.add_argument("--models", nargs="+", default=["tiny", "medium"],
                    help="tiny, medium and/or gpt2s (default: tiny medium)")
    ap.add_argument("--workdir", help="where models, plans and data go (default: a temporary directory)")
    ap.add_argument("--attention", choices=["fused", "unfused", "both"], default="both",
                    help="sp-compile --attention of the sp-run plans; both: a row for each (default)")
    args = ap.parse_args()
    sp_compile, sp_run = (os.path.join(args.sp_bin, tool) for tool in ("sp-compile", "sp-run"))
    for tool in (sp_compile, sp_run):
        if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
            sys.exit(f"error: {tool} not found or not executable (pass the build's bin/ as --sp-bin)")
    torch_threads = set_torch_threads(args.threads)
    load_before = os.getloadavg()[0]

    tmp = None if args.workdir else tempfile.TemporaryDirectory()
    workdir = args.workdir or tmp.name
    os.makedirs(workdir, exist_ok=True)
    print(f"training step time, float32, dropout {DROPOUT}, AdamW + clipping, {args.threads} thread(s), "
          f"N steps timed after {args.warmup} (fastest of {args.repeat})\n"
          f"sp-run --threads {args.threads}; {torch_threads}", flush=True)
    header = (f"{'model':>7} {'params':>9} {'batch x seq':>11} {'attention':>9} {'sp-run ms/step':>15} "
              f"{'torch ms/step':>14} {'torch/sp':>9} {'threads':>8} {'sp GFLOP/s':>11} "
              f"{'sgemm GFLOP/s':>14} {'of sgemm':>9}")
    rows = []
    try:
        for name in args.models:
            onnx_path = model_path(name, workdir)
            with open(ref.facts_path(onnx_path)) as f:
                facts = json.load(f)
            data = os.path.join(workdir, f"{name}-tokens.bin")
            tokens = ref.write_tokens(data, TOKENS, facts["vocab"], DATA_SEED)
            plans, flops = {}, {}
            for a in (["fused", "unfused"] if args.attention == "both" else [args.attention]):
                plans[a] = os.path.join(workdir, f"{name}-{a}-plan")
                flops[a] = compile_plan(sp_compile, onnx_path, plans[a], a)
            steps = args.steps or DEFAULT_STEPS.get(name, 20)
            sp, torch_ms = measure(sp_run, plans, data, onnx_path, facts, tokens, args, steps, workdir)
            sgemm = sgemm_gflops(facts)
            for a, (sp_ms, startup) in sp.items():
                achieved = flops[a] / (sp_ms / 1000.0) / 1e9
                rows.append(f"{name:>7} {facts['params']:>9} {facts['batch']:>5} x {facts['seq']:<3} {a:>9} "
                            f"{sp_ms:>15.2f} {torch_ms:>14.2f} {torch_ms / sp_ms:>9.2f} {args.threads:>8} "
                            f"{achieved:>11.1f} {sgemm:>14.1f} {100 * achieved / sgemm:>8.0f}%")
                print(f"  {name}: N = {steps}: sp-run --attention {a} {sp_ms:.2f} ms/step (a {args.warmup}-step "
                      f"run trains in {startup:.2f} s), torch {torch_ms:.2f} ms/step", flush=True)
    finally:
        if tmp:
            tmp.cleanup()
    print(header)
    print("\n".join(rows))
    load = os.getloadavg()[0]
    note = (f"  (busy machine: other processes compete for the {os.cpu_count()} cores; rerun when idle)"
            if load > args.threads + 0.5 else "")
    print(f"load average {load_before:.2f} before, {load:.2f} after, {os.cpu_count()} cores{note}")


if __name__ == "__main__":
    main()
