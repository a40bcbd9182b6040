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

Then the pipelined plans (--pipelines), written with -o as a whole process: the paper's
175B at t 8, SP, p 8 x 3 interleaved chunks, 64 microbatches, and 1T at t 8, SP, p 64,
512 microbatches (selective recomputation, fp16), with the process's peak resident memory
and the plan's size on disk, against the same onnx load + infer_shapes of the graph.

Then the layout search (--auto), a whole process each: the paper's models at their GPU counts
and global batches (models/paper/models.csv: 22B on 8 GPUs, batch 4; 175B on 64, 64; 530B on
280, 280; 1T on 512, 512), DGX A100 80GB, fp16, with the layouts it compiled and the process's
peak resident memory (issue 16's goals: 22B in 2 s, 1T in 10 s).

  /usr/bin/python3 tools/bench_compile.py --sp-compile build/bin/sp-compile [--models 175B]
      [--pipelines 175B 1T] [--auto 22B 1T]
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


# The pipelined plans: model -> sp-compile flags.
PIPELINES = {
    "175B": ["--tp", "8", "--sp", "--pp", "8", "--interleave", "3", "--microbatches", "64"],
    "530B": ["--tp", "8", "--sp", "--pp", "35", "--interleave", "3", "--microbatches", "280"],
    "1T": ["--tp", "8", "--sp", "--pp", "64", "--microbatches", "512"],
}


def run_process(cmd):
    """Runs cmd as a whole process: its wall time, peak resident memory
    (bytes) and stdout; exits naming the command if it fails."""
    start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"failed: {' '.join(cmd)}")
    return wall, usage.ru_maxrss * 1024, out


def time_pipeline(sp_compile, path, flags, repeat):
    """Median wall time of a whole sp-compile -o process, its largest peak
    resident memory (bytes) and the plan's bytes on disk."""
    wall, rss, size = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "plan")
        for _ in range(repeat):
            w, r, _ = run_process([sp_compile, path, "--quiet", "-o", plan, "--recompute",
                                   "selective", "--dtype", "fp16"] + flags)
            wall.append(w)
            rss = max(rss, r)
        for root, _, files in os.walk(plan):
            size += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return statistics.median(wall), rss, size


# The layout search: model -> (GPUs, global batch), the paper's Table 3.
SEARCHES = {"22B": (8, 4), "175B": (64, 64), "530B": (280, 280), "1T": (512, 512)}


def time_search(sp_compile, path, name, repeat):
    """Median and slowest wall time of a whole sp-compile --auto process, its
    largest peak resident memory (bytes), and its first line (layouts
    compiled)."""
    gpus, batch = SEARCHES[name]
    wall, rss, first = [], 0, ""
    for _ in range(repeat):
        w, r, out = run_process([sp_compile, path, "--quiet", "--auto", "--gpus", str(gpus),
                                 "--gpu-memory", "80GiB", "--global-batch", str(batch),
                                 "--dtype", "fp16"])
        wall.append(w)
        rss = max(rss, r)
        first = out.splitlines()[0] if out else ""
    return statistics.median(wall), max(wall), rss, first


def paper_graph(tmp, name, mask="buffer"):
    """The weight-free graph of a paper model in tmp, generated once."""
    path = os.path.join(tmp, f"gpt-{name}-{mask}.onnx")
    if not os.path.exists(path):
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "gen_paper_graph.py"),
                        "--model", name, "--mask", mask, "-o", path], check=True,
                       stdout=subprocess.DEVNULL)
    return path


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
    ap.add_argument("--models", nargs="*", default=["22B", "175B", "530B", "1T"])
    ap.add_argument("--masks", nargs="+", default=["buffer", "shared"])
    ap.add_argument("--pipelines", nargs="*", default=["175B", "1T"], choices=sorted(PIPELINES))
    ap.add_argument("--auto", nargs="*", default=[], choices=sorted(SEARCHES))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if args.models:
        print(f"{'model':>6} {'mask':>7} {'onnx nodes':>10} {'sp-compile (s)':>15} {'process (s)':>12} "
              f"{'onnx load+infer (s)':>20} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for mask in args.masks:
                path = paper_graph(tmp, name, mask)
                sp_inner, sp_wall = time_sp_compile(args.sp_compile, path, args.repeat)
                py, nodes = time_onnx(path, args.repeat)
                print(f"{name:>6} {mask:>7} {nodes:>10} {sp_inner:>15.3f} {sp_wall:>12.3f} {py:>20.3f} "
                      f"{py / sp_inner:>5.1f}x")
        if args.pipelines:
            if args.models:
                print()
            print(f"{'model':>6} {'pipeline':>30} {'process -o (s)':>15} {'peak RSS (MB)':>14} "
                  f"{'plan (MB)':>10} {'onnx load+infer (s)':>20} {'ratio':>6}")
        for name in args.pipelines:
            path = paper_graph(tmp, name)
            flags = PIPELINES[name]
            wall, rss, size = time_pipeline(args.sp_compile, path, flags, args.repeat)
            py, _ = time_onnx(path, args.repeat)
            grid = " ".join(f.lstrip("-") for f in flags)
            print(f"{name:>6} {grid:>30} {wall:>15.3f} {rss / 1e6:>14.0f} {size / 1e6:>10.1f} "
                  f"{py:>20.3f} {py / wall:>5.2f}x")
        if args.auto:
            if args.models or args.pipelines:
                print()
            print(f"{'model':>6} {'GPUs':>5} {'median (s)':>11} {'slowest (s)':>12} {'peak RSS (MB)':>14}  "
                  f"search")
        for name in args.auto:
            path = paper_graph(tmp, name)
            med, worst, rss, first = time_search(args.sp_compile, path, name, args.repeat)
            layouts = first.split(";", 1)[1].split(" in ")[0].strip() if ";" in first else first
            print(f"{name:>6} {SEARCHES[name][0]:>5} {med:>11.2f} {worst:>12.2f} {rss / 1e6:>14.0f}  "
                  f"{layouts}")


if __name__ == "__main__":
    main()
