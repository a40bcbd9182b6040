#!/usr/bin/python3
"""Smoke test of tools/bench_gpu_model.py: runs it on the CPU with the small model and checks its JSON.

    /usr/bin/python3 tests/e2e/check_bench_gpu_model.py --sp-bin build/bin --workdir /tmp/bench-gpu-model

Runs `tools/bench_gpu_model.py --device cpu --model small --steps 2 --threads 2 --ops --json FILE` and checks
what it wrote, not its speed: sp-run's fused and unfused rows (and torch's eager row when torch is
importable) with positive, finite step times, tokens/s = tokens per step / step time, the model FLOPs
equal to 72 b s L h^2 (1 + s/6h + V/12hL) and to sp-compile's report, TFLOP/s = FLOPs / step time,
and no MFU on the CPU without a peak. No timing is asserted.
"""
import argparse
import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def check(result, failures):
    def expect(ok, what):
        if not ok:
            failures.append(what)

    sh = result["shape"]
    b, s, L, h, v = sh["batch"], sh["seq"], sh["layers"], sh["hidden"], sh["vocab"]
    tokens = b * s
    expect(result["tokens_per_step"] == tokens, f"tokens per step {result['tokens_per_step']} != b s = {tokens}")
    # 72 b s L h^2 (1 + s/6h + V/12hL), in integers: 72 b s L h^2 + 12 b s^2 L h + 6 b s h V
    exact = 72 * b * s * L * h * h + 12 * b * s * s * L * h + 6 * b * s * h * v
    f = result["flops"]
    expect(math.isclose(f["model_per_step"], exact, rel_tol=1e-12), f"model FLOPs {f['model_per_step']} != {exact}")
    for row, counted in f["from_report"].items():
        expect(math.isclose(counted, exact, rel_tol=1e-12), f"sp-compile's report ({row}) counts {counted}, not {exact}")
    expect(result["device"] == "cpu" and result["peak_tflops"] is None, "cpu run without a peak")
    p = result["parameters"]
    expect(p["non_embedding"] == L * (12 * h * h + 13 * h) + 2 * h and
           p["total"] == p["non_embedding"] + (v + s) * h, f"parameter counts {p}")
    expect(p["total"] == result["parameters_from_report"],
           f"parameters {p['total']}, sp-compile's report {result['parameters_from_report']}")

    # --ops: one traced step of each sp row, by op: its GEMMs, loss and update are there.
    for name in ("fused", "unfused"):
        ops = result["sp"].get(name, {}).get("ops_ms", {})
        expect({"linear", "cross_entropy", "adamw"} <= set(ops) and all(t >= 0 for t in ops.values())
               and sum(ops.values()) > 0, f"sp {name}: traced ops {ops}")
    rows = [("sp", name, result["sp"].get(name, {})) for name in ("fused", "unfused")]
    expect(sorted(result["sp"]) == ["fused", "unfused"], f"sp rows {sorted(result['sp'])}")
    try:
        import torch  # noqa: F401
        expect("eager" in result["torch"], f"torch rows {sorted(result['torch'])} (eager expected)")
        rows += [("torch", name, r) for name, r in result["torch"].items() if "error" not in r]
    except ImportError:
        expect(not result["torch"], "torch rows without torch")
    for who, name, r in rows:
        what = f"{who} {name}"
        for key in ("ms_per_step", "tokens_per_s", "model_tflops"):
            expect(positive(r.get(key)), f"{what}: {key} = {r.get(key)}")
        if not positive(r.get("ms_per_step")):
            continue
        seconds = r["ms_per_step"] / 1000
        expect(math.isclose(r["tokens_per_s"], tokens / seconds, rel_tol=1e-9), f"{what}: tokens/s != tokens / time")
        expect(math.isclose(r["model_tflops"], exact / seconds / 1e12, rel_tol=1e-9), f"{what}: TFLOP/s != FLOPs / time")
        expect(r.get("mfu") is None, f"{what}: MFU on the CPU without a peak")
        expect(math.isfinite(r.get("final_loss", float("nan"))), f"{what}: final loss {r.get('final_loss')}")
        if who == "sp":
            ph = r.get("phases_ms", {})
            expect(math.isclose(sum(ph.values()), r["ms_per_step"]) and ph.get("recompute") == 0 and
                   positive(ph.get("forward")) and positive(ph.get("backward")) and positive(ph.get("optimizer")),
                   f"{what}: phases {ph}")
            expect(positive(r.get("sp_run_tokens_per_s")), f"{what}: sp-run's own tokens/s")
    for key, ratio in result["ratios_tokens_per_s"].items():
        expect(positive(ratio), f"ratio {key} = {ratio}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sp-bin", required=True)
    p.add_argument("--workdir", required=True)
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    out = os.path.join(args.workdir, "bench-gpu-model.json")
    if os.path.exists(out):
        os.remove(out)
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "bench_gpu_model.py"), "--device", "cpu",
                    "--model", "small", "--steps", "2", "--threads", "2", "--ops", "--sp-bin", args.sp_bin,
                    "--workdir", os.path.join(args.workdir, "work"), "--json", out], check=True)
    with open(out) as f:
        result = json.load(f)
    failures = []
    check(result, failures)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"bench_gpu_model.py: sp-run fused and unfused{' and torch' if result['torch'] else ''}, "
          f"FLOPs equal to the formula and to sp-compile's report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
