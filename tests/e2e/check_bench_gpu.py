#!/usr/bin/python3
"""Smoke test of tools/bench_gpu.py: runs it on the CPU with the small shapes and checks its JSON.

    /usr/bin/python3 tests/e2e/check_bench_gpu.py --sp-bin build/bin --workdir /tmp/bench-gpu

Runs `tools/bench_gpu.py --device cpu --model small --dtype bf16 --steps 2 --repeat 1 --json FILE`
and checks the structure of what it wrote, not its speed: the three modes for sp-run in fp32 and
bf16 (and for torch when torch is importable) and sp-run's fused-attention row, every time positive
and finite, backward including recompute, recompute zero without recomputation (and in the fused
plan, whose core recomputes inside its backward) and positive with it, and the FLOPs equal to the paper's formula for the small shapes
(24 b s h^2 (1 + s/6h) / t forward, backward twice, selective adding Q K^T, full the forward) and
to sp-compile's report. No timing is asserted.
"""
import argparse
import json
import math
from fractions import Fraction
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = ["none", "selective", "full"]
SP_MODES = MODES + ["fused"]  # sp-run also runs the fused attention core


def positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def check(result, failures):
    def expect(ok, what):
        if not ok:
            failures.append(what)

    sh = result["shape"]
    b, s, h, t = sh["batch"], sh["seq"], sh["hidden"], sh["t"]
    expect(sh["inner"] == h // t and sh["ffn"] == 4 * h // t and sh["local_heads"] == sh["heads"] // t,
           f"shard shapes {sh}")
    forward = Fraction(24 * b * s * h * h) * (1 + Fraction(s, 6 * h)) / t  # exact
    f = result["flops"]
    expect(f["forward"] == forward, f"forward FLOPs {f['forward']} != 24bsh^2(1 + s/6h)/t = {forward}")
    expect(f["backward"] == 2 * forward, f"backward FLOPs {f['backward']} != {2 * forward}")
    expect(f["model_per_step"] == 3 * forward, f"model FLOPs {f['model_per_step']} != {3 * forward}")
    recompute = {"none": 0, "selective": Fraction(2 * b * s * s * h, t), "full": forward,
                 "fused": Fraction(2 * b * s * s * h, t)}
    for mode in SP_MODES:
        expect(f["recompute"][mode] == recompute[mode], f"{mode}: recompute FLOPs {f['recompute'][mode]}")
        r = f["from_report"][mode]
        expect(r["model_per_step"] == 3 * forward and r["recompute"] == recompute[mode],
               f"{mode}: sp-compile's report {r} disagrees with the formula")

    expect(result["device"] == "cpu" and result["peak_tflops"] is None, "cpu run without a peak")
    expect(set(result["sp"]) == {"fp32", "bf16"}, f"sp precisions {sorted(result['sp'])} (fp32 and bf16)")
    tables = [("sp", result["sp"][prec]) for prec in ("fp32", "bf16") if prec in result["sp"]]
    try:
        import torch  # noqa: F401
        expect(set(result["torch"]) == {"fp32", "bf16"}, f"torch precisions {sorted(result['torch'])}")
        for prec in ("fp32", "bf16"):
            if prec in result["torch"]:
                tables.append(("torch", result["torch"][prec]))
    except ImportError:
        expect(not result["torch"], "torch rows without torch")
    for who, rows in tables:
        modes = SP_MODES if who == "sp" else MODES
        expect(sorted(rows) == sorted(modes), f"{who}: modes {sorted(rows)}")
        for mode in modes:
            row = rows.get(mode, {})
            for key in ("forward_ms", "backward_ms", "combined_ms", "model_tflops"):
                expect(positive(row.get(key)), f"{who} {mode}: {key} = {row.get(key)}")
            expect(row.get("mfu") is None, f"{who} {mode}: MFU on the CPU without a peak")
            expect(math.isclose(row.get("combined_ms", 0), row.get("forward_ms", 0) + row.get("backward_ms", 0)),
                   f"{who} {mode}: combined != forward + backward")
            if who == "sp":
                rec = row.get("recompute_ms", -1)
                expect(rec == 0 if mode in ("none", "fused") else rec > 0, f"sp {mode}: recompute {rec} ms")
                expect(row.get("backward_ms", 0) >= rec, f"sp {mode}: backward excludes its recompute")
                outside = row.get("outside_layer_ms", {}).get("forward")
                expect(positive(outside) and positive(row.get("optimizer_ms")),
                       f"sp {mode}: the embedding/head and optimizer times")
        expect(rows.get("none", {}).get("overhead_pct") == 0, f"{who}: overhead of none")
    expect(len(result["paper_table4"]) == 5, "the paper's Table 4 rows")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sp-bin", required=True)
    p.add_argument("--workdir", required=True)
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    out = os.path.join(args.workdir, "bench-gpu.json")
    if os.path.exists(out):
        os.remove(out)
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "bench_gpu.py"), "--device", "cpu",
                    "--model", "small", "--dtype", "bf16", "--steps", "2", "--repeat", "1", "--threads", "2",
                    "--sp-bin", args.sp_bin, "--workdir", os.path.join(args.workdir, "work"), "--json", out],
                   check=True)
    with open(out) as f:
        result = json.load(f)
    failures = []
    check(result, failures)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"bench_gpu.py: 3 modes for {', '.join(['sp-run'] + (['torch'] if result['torch'] else []))} "
          f"and sp-run's fused core, FLOPs equal to the formula and to sp-compile's report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
