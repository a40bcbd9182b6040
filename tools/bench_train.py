#!/usr/bin/python3
"""Benchmark: training step time of sp-run against PyTorch on the same model, data and threads.

For each model it writes one token file and compiles the model with `sp-compile -o PLAN`, then
measures, in this one run, side by side:
  - sp-run: `sp-run PLAN --data DATA --dropout 0.1 --threads T` with --steps W and with
    --steps W+N; the difference of the two wall times over N is the time of a step with the
    process startup, plan loading and the first W (warm-up) steps taken out. Each is the
    fastest of --repeat runs.
  - torch: models/gpt.py's GPT with the same config and the same weights (loaded from the ONNX
    file), dropout 0.1, the same batches (the sp-run data formula), AdamW (two param groups) with
    clip_grad_norm_(1.0) and the spec's LR schedule, torch.set_num_threads(T); W warm-up steps, then
    N steps timed in this process (the fastest of --repeat such runs).
Both sides train in float32 with dropout on. It prints one row per model: sp-run and torch
milliseconds per step and the ratio torch/sp (> 1: sp-run is faster).

Models: "tiny" is the committed models/tiny/gpt-tiny.onnx (L 2, h 64, 4 heads, s 64, v 256,
batch 4); "medium" is exported with models/export_gpt.py (L 4, h 256, 8 heads, s 128, v 512,
batch 8, opset 17, tied).

    /usr/bin/python3 tools/bench_train.py --sp-bin build/bin [--threads 2] [--steps 20] [--models tiny medium]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

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


def model_path(name, workdir):
    if name == "tiny":
        return os.path.join(ROOT, "models", "tiny", "gpt-tiny.onnx")
    if name == "medium":
        path = os.path.join(workdir, "gpt-medium.onnx")
        export_gpt.main(["-o", path] + MEDIUM_ARGV)
        return path
    raise SystemExit(f"error: unknown model {name!r} (tiny, medium)")


def compile_plan(sp_compile, onnx_path, plan):
    shutil.rmtree(plan, ignore_errors=True)
    subprocess.run([sp_compile, onnx_path, "-o", plan, "--quiet"], check=True)


def time_sp_run(sp_run, plan, data, steps, threads, workdir):
    """Wall seconds of one sp-run process training `steps` steps."""
    run_dir = os.path.join(workdir, "sp-run-out")
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sp_run, plan, "--data", data, "--steps", str(steps), "--dropout", str(DROPOUT), "--lr", str(LR),
           "--threads", str(threads), "--log-dir", os.path.join(run_dir, "log"),
           "--checkpoint", os.path.join(run_dir, "checkpoint")]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr.strip()}")
    return seconds


def sp_run_ms_per_step(sp_run, plan, data, warmup, steps, threads, repeat, workdir):
    short = min(time_sp_run(sp_run, plan, data, warmup, threads, workdir) for _ in range(repeat))
    long = min(time_sp_run(sp_run, plan, data, warmup + steps, threads, workdir) for _ in range(repeat))
    return 1000.0 * (long - short) / steps, short


def torch_ms_per_step(onnx_path, facts, tokens, warmup, steps, repeat):
    """Milliseconds per training step of the torch reference, timed after `warmup` steps."""
    best = float("inf")
    for _ in range(repeat):
        torch.manual_seed(1234)
        model = ref.reference_model(onnx_path, dropout=DROPOUT, facts=facts)
        stamps = {}

        def stamp(t):
            if t in (warmup, warmup + steps):
                stamps[t] = time.perf_counter()

        ref.train(model, tokens, facts["batch"], facts["seq"], warmup + steps, LR, callback=stamp)
        best = min(best, 1000.0 * (stamps[warmup + steps] - stamps[warmup]) / steps)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sp-bin", default=os.path.join(ROOT, "build", "bin"),
                    help="directory holding sp-compile and sp-run (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="sp-run --threads and torch.set_num_threads (default 2)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps N (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps W (default 3)")
    ap.add_argument("--repeat", type=int, default=2, help="take the fastest of this many runs (default 2)")
    ap.add_argument("--models", nargs="+", default=["tiny", "medium"], help="tiny and/or medium")
    ap.add_argument("--workdir", help="where models, plans and data go (default: a temporary directory)")
    args = ap.parse_args()
    sp_compile, sp_run = (os.path.join(args.sp_bin, tool) for tool in ("sp-compile", "sp-run"))
    for tool in (sp_compile, sp_run):
        if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
            sys.exit(f"error: {tool} not found or not executable (pass the build's bin/ as --sp-bin)")
    torch.set_num_threads(args.threads)

    tmp = None if args.workdir else tempfile.TemporaryDirectory()
    workdir = args.workdir or tmp.name
    os.makedirs(workdir, exist_ok=True)
    print(f"training step time, float32, dropout {DROPOUT}, AdamW + clipping, {args.threads} threads, "
          f"{args.steps} steps timed after {args.warmup} (fastest of {args.repeat})", flush=True)
    header = (f"{'model':>7} {'params':>9} {'batch x seq':>11} {'sp-run ms/step':>15} {'torch ms/step':>14} "
              f"{'torch/sp':>9} {'threads':>8}")
    rows = []
    try:
        for name in args.models:
            onnx_path = model_path(name, workdir)
            with open(ref.facts_path(onnx_path)) as f:
                facts = json.load(f)
            data = os.path.join(workdir, f"{name}-tokens.bin")
            tokens = ref.write_tokens(data, TOKENS, facts["vocab"], DATA_SEED)
            plan = os.path.join(workdir, f"{name}-plan")
            compile_plan(sp_compile, onnx_path, plan)
            sp_ms, startup = sp_run_ms_per_step(sp_run, plan, data, args.warmup, args.steps, args.threads,
                                                args.repeat, workdir)
            torch_ms = torch_ms_per_step(onnx_path, facts, tokens, args.warmup, args.steps, args.repeat)
            rows.append(f"{name:>7} {facts['params']:>9} {facts['batch']:>5} x {facts['seq']:<3} {sp_ms:>15.2f} "
                        f"{torch_ms:>14.2f} {torch_ms / sp_ms:>9.2f} {args.threads:>8}")
            print(f"  {name}: sp-run {sp_ms:.2f} ms/step (a {args.warmup}-step run takes {startup:.2f} s), "
                  f"torch {torch_ms:.2f} ms/step", flush=True)
    finally:
        if tmp:
            tmp.cleanup()
    print(header)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
