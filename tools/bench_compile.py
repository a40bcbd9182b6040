#!/usr/bin/env python3
"""Benchmark: compile time of the weight-free paper-size graphs.

For each model and each export form of its causal mask (models/gen_paper_graph.py --mask:
`buffer`, a weight-free tril buffer sliced in every layer as torch exports it, and `shared`,
one [s, s] bool initializer with data that every layer's Where uses), it generates the
weight-free ONNX graph, then times, on the same file:
  - sp-compile: import, constant folding, canonicalization, dce and detection
    (the in-process time sp-compile reports, and the wall time of the process);
  - Python onnx: onnx.load + onnx.shape_inference.infer_shapes (the peer).
Each is the median of --repeat runs. It prints one row per model and the ratio.

  /usr/bin/python3 tools/bench_compile.py --sp-compile build/bin/sp-compile [--models 175B]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def time_sp_compile(sp_compile, path, repeat):
    inner, wall = [], []
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "r.json")
        for _ in range(repeat):
            start = time.perf_counter()
            subprocess.run([sp_compile, path, "--quiet", "--report", report], check=True)
            wall.append(time.perf_counter() - start)
            with open(report) as f:
                inner.append(json.load(f)["compile_seconds"])
    return statistics.median(inner), statistics.median(wall)


def time_onnx(path, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        model = onnx.load(path, load_external_data=False)
        onnx.shape_inference.infer_shapes(model)
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(model.graph.node)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sp-compile", default=os.path.join(ROOT, "build", "bin", "sp-compile"))
    ap.add_argument("--models", nargs="+", default=["22B", "175B", "530B", "1T"])
    ap.add_argument("--masks", nargs="+", default=["buffer", "shared"])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"{'model':>6} {'mask':>7} {'onnx nodes':>10} {'sp-compile (s)':>15} {'process (s)':>12} "
          f"{'onnx load+infer (s)':>20} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for mask in args.masks:
                path = os.path.join(tmp, f"gpt-{name}-{mask}.onnx")
                subprocess.run([sys.executable, os.path.join(ROOT, "models", "gen_paper_graph.py"),
                                "--model", name, "--mask", mask, "-o", path], check=True,
                               stdout=subprocess.DEVNULL)
                sp_inner, sp_wall = time_sp_compile(args.sp_compile, path, args.repeat)
                py, nodes = time_onnx(path, args.repeat)
                print(f"{name:>6} {mask:>7} {nodes:>10} {sp_inner:>15.3f} {sp_wall:>12.3f} {py:>20.3f} "
                      f"{py / sp_inner:>5.1f}x")


if __name__ == "__main__":
    main()
