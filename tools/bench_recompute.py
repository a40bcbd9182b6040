#!/usr/bin/python3
"""Benchmark: the time cost of recomputation (none, selective, full) and of the fused attention
core (`--attention fused`, whose backward recomputes the scores blockwise) on the CPU, in one run.

Exports a model where attention matters (by default L 2, h 256, 8 heads, s 512, v 512, batch 2,
dropout 0.1) with models/export_gpt.py, compiles it four times (`sp-compile --recompute MODE`, and
`--attention fused`),
and runs each plan with `sp-run --steps N`, --repeat times, interleaving the modes so that load
from elsewhere hits them alike. sp-run reports the time spent in each phase's instructions per
step (forward, backward, recompute, optimizer; the first step left out); the table shows the
fastest round of each mode, like the paper's Table 4 (forward, backward with recomputation,
combined) and the overhead of each mode against none. The optimizer step is left out of
"combined", as the paper's per-layer times leave it out.

    /usr/bin/python3 tools/bench_recompute.py --sp-bin build/bin [--threads 2] [--steps 6] [--repeat 3]

It also prints the stored activation bytes per layer of each plan (from sp-compile's report).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["none", "selective", "full", "fused"]  # fused: --attention fused, nothing recomputed


def compile_flags(mode):
    return ["--attention", "fused"] if mode == "fused" else ["--attention", "unfused", "--recompute", mode]
TIME_LINE = re.compile(r"time per step: forward ([\d.]+) ms, backward ([\d.]+) ms, "
                       r"recompute ([\d.]+) ms, optimizer ([\d.]+) ms")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sp-bin", required=True, help="directory with sp-compile, sp-run and sp-tokenize")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--workdir", help="keep the model and plans here (default: a temporary directory)")
    args = p.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="sp-bench-recompute-")
    os.makedirs(work, exist_ok=True)
    tool = lambda name: os.path.join(args.sp_bin, name)  # noqa: E731

    model = os.path.join(work, "gpt.onnx")
    subprocess.run([sys.executable, os.path.join(ROOT, "models", "export_gpt.py"), "-o", model,
                    "--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
                    "--seq", str(args.seq), "--vocab", "512", "--batch", str(args.batch), "--dropout", "0.1",
                    "--opset", "17"], check=True, capture_output=True)
    data = os.path.join(work, "data.bin")
    subprocess.run([tool("sp-tokenize"), os.path.join(ROOT, "models", "data", "python-reference.txt"), "-o",
                    data], check=True, capture_output=True)
    stored = {}
    for mode in MODES:
        plan = os.path.join(work, f"plan-{mode}")
        shutil.rmtree(plan, ignore_errors=True)
        report = os.path.join(work, f"report-{mode}.json")
        subprocess.run([tool("sp-compile"), model, "-o", plan, *compile_flags(mode), "--quiet", "--report", report],
                       check=True)
        stored[mode] = json.load(open(report))["memory"]["activation_bytes_per_layer"]

    best = {}
    for _ in range(args.repeat):
        for mode in MODES:
            out = subprocess.run([tool("sp-run"), os.path.join(work, f"plan-{mode}"), "--data", data, "--steps",
                                  str(args.steps + 1), "--dropout", "0.1", "--threads", str(args.threads),
                                  "--log-dir", os.path.join(work, "log")],
                                 check=True, capture_output=True, text=True).stdout
            m = TIME_LINE.search(out)
            if not m:
                raise SystemExit(f"error: no timing line in sp-run's output:\n{out}")
            fwd, bwd, rec, _ = map(float, m.groups())
            row = (fwd + bwd + rec, fwd, bwd + rec, rec)
            if mode not in best or row < best[mode]:
                best[mode] = row

    print(f"model: L {args.layers}, h {args.hidden}, a {args.heads}, s {args.seq}, b {args.batch}; "
          f"{args.threads} threads; fastest of {args.repeat} rounds of {args.steps} steps")
    print(f"{'mode':<10} {'forward ms':>11} {'backward ms':>12} {'(recompute)':>12} {'combined ms':>12} "
          f"{'overhead':>9} {'stored/layer':>13}")
    base = best["none"][0]
    for mode in MODES:
        combined, fwd, bwd, rec = best[mode]
        print(f"{mode:<10} {fwd:>11.2f} {bwd:>12.2f} {rec:>12.2f} {combined:>12.2f} "
              f"{100 * (combined / base - 1):>8.1f}% {stored[mode] / 2**20:>10.2f} MiB")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
