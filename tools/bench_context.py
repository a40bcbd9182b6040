#!/usr/bin/python3
"""Benchmark: context parallelism on the CPU at a long sequence, in one run.

Writes a small GPT at s = 16384 with models/gen_paper_graph.py (L 2, h 64, 4 heads, v 256,
batch 1, the causal mask built from its shape, random weights), compiles it for one device and
for --cp C (each C given), trains each plan --steps steps on the same data with `sp-run` (C
thread ranks), and prints a table: the planned arena per rank, the ring's bytes per rank and
step, the time per step (forward and backward, the first step left
out) and the last loss, which must be one device's to float32 rounding. The ranks share this
machine's cores (each gets cores / C kernel threads), so the time is the ring's cost on one
machine, not a speed-up.

    /usr/bin/python3 tools/bench_context.py --sp-bin build/bin [--cp 2 4] [--steps 3]
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sp-bin", required=True, help="the folder of sp-compile and sp-run")
    p.add_argument("--cp", type=int, nargs="+", default=[2, 4], help="context-parallel sizes (default 2 4)")
    p.add_argument("--seq", type=int, default=16384, help="sequence length (default %(default)s)")
    p.add_argument("--steps", type=int, default=3, help="training steps per plan (default %(default)s)")
    args = p.parse_args()
    bins = {t: os.path.join(args.sp_bin, t) for t in ("sp-compile", "sp-run")}
    with tempfile.TemporaryDirectory(prefix="sp-bench-context-") as work:
        model = os.path.join(work, "long.onnx")
        run([sys.executable, os.path.join(ROOT, "models", "gen_paper_graph.py"), "--layers", "2",
             "--hidden", "64", "--heads", "4", "--seq", str(args.seq), "--vocab", "256", "--batch", "1",
             "--mask", "computed", "--weights", "-o", model])
        data = os.path.join(work, "data.bin")
        run([sys.executable, "-c", "import numpy as np, sys; np.random.default_rng(7).integers("
             "0, 256, 400000).astype('<u2').tofile(sys.argv[1])", data])
        rows = []
        for c in [1] + args.cp:
            plan = os.path.join(work, f"cp{c}")
            run([bins["sp-compile"], model, "-o", plan, "--quiet"] + (["--cp", str(c)] if c > 1 else []))
            m = json.load(open(os.path.join(plan, "manifest.json")))
            # The machine's cores shared by the ranks.
            threads = max(1, (os.cpu_count() or 1) // c)
            out = run([bins["sp-run"], plan, "--data", data, "--steps", str(args.steps), "--threads", str(threads)])
            fwd, bwd = map(float, re.search(r"forward ([0-9.]+) ms, backward ([0-9.]+) ms", out).groups())
            with open(os.path.join(plan, "run", "loss.csv")) as f:
                loss = float(list(csv.DictReader(f))[-1]["loss"])
            ring = m.get("context_parallel", {})
            rows.append((c, m["plan"]["arena_bytes"],
                         ring.get("ring_forward_bytes", 0) + ring.get("ring_backward_bytes", 0), fwd + bwd, loss))
        mib = lambda b: f"{b / 2**20:.2f} MiB"
        print(f"| cp | arena per rank | ring per rank and step | forward + backward | loss at step {args.steps} |")
        print("| --- | --- | --- | --- | --- |")
        for c, arena, ring, ms, loss in rows:
            print(f"| {c} | {mib(arena)} | {mib(ring) if ring else '-'} | {ms:,.0f} ms | {loss:.7f} |")


if __name__ == "__main__":
    main()
