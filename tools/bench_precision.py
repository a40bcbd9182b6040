#!/usr/bin/python3
"""Benchmark: fp32 against bf16 and fp16 (mixed precision) on the CPU backend, in one run.

For each model it compiles three plans of the same model (`sp-compile --dtype fp32|bf16|fp16`)
and measures each with sp-run on the same data, threads and flags:
  - the step time: the wall time of `--steps W+N` less that of `--steps W`, over N (process
    startup, plan loading and W warm-up steps taken out), the fastest of --repeat rounds, each
    round timing the three plans one after the other (tools/bench_train.py's method);
  - the memory: the planned arena, the measured high-water mark and the stored activations
    (sp-run --dump's memory.json), and the model state of the plan's report.
It prints one row per plan and each 16-bit plan's ratios to fp32.

The CPU backend computes a 16-bit plan's instructions in float32 on widened copies of their
16-bit buffers and rounds each result once (runtime/cpu/CpuBackend.cpp runMixed), except the
GEMMs of a bf16 plan on a CPU with AVX-512 BF16 or AMX, which run on VDPBF16PS or AMX tiles
over the bf16 operands as stored (runtime/cpu/Bf16Gemm.h). On such a CPU the bf16 plan is also
timed with SP_CPU_BF16_DOT=0 ("bf16w", every instruction widened), and on a CPU with AMX with
SP_CPU_AMX=0 ("bf16dp", the GEMMs on VDPBF16PS instead of the tiles).

    /usr/bin/python3 tools/bench_precision.py --sp-bin build/bin [--threads 2] [--models tiny medium]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_train as bt  # noqa: E402  (model export, token files, sp-run timing)

DTYPES = ("fp32", "bf16", "fp16")


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return set(f.read().split())
    except OSError:
        return set()


def has_bf16_dot():
    """Whether this CPU has AVX-512 BF16 (sp-run then runs bf16 GEMMs on VDPBF16PS)."""
    return "avx512_bf16" in cpu_flags()


def has_amx_bf16():
    """Whether this CPU has AMX-BF16 (sp-run then runs bf16 GEMMs on its tiles)."""
    return {"amx_bf16", "amx_tile"} <= cpu_flags()


def compile_plan(sp_compile, onnx_path, plan, dtype, report):
    shutil.rmtree(plan, ignore_errors=True)
    subprocess.run([sp_compile, onnx_path, "-o", plan, "--dtype", dtype, "--report", report, "--quiet"],
                   check=True)
    with open(report) as f:
        return json.load(f)["memory"]


def memory_of_run(sp_run, plan, data, threads, workdir):
    dump = os.path.join(workdir, "dump")
    shutil.rmtree(dump, ignore_errors=True)
    subprocess.run([sp_run, plan, "--data", data, "--steps", "2", "--threads", str(threads),
                    "--log-dir", os.path.join(workdir, "mem-log"), "--dump", dump],
                   check=True, capture_output=True, env=bt.SP_RUN_ENV)
    with open(os.path.join(dump, "memory.json")) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sp-bin", default=os.path.join(bt.ROOT, "build", "bin"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, help="timed steps N (default: 200 for tiny, 20 for medium)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["tiny", "medium"])
    ap.add_argument("--workdir")
    args = ap.parse_args()
    sp_compile, sp_run = (os.path.join(args.sp_bin, t) for t in ("sp-compile", "sp-run"))
    tmp = None if args.workdir else tempfile.TemporaryDirectory()
    workdir = args.workdir or tmp.name
    os.makedirs(workdir, exist_ok=True)
    load_before = os.getloadavg()[0]
    print(f"mixed precision on the CPU backend: step time and memory, dropout {bt.DROPOUT}, "
          f"{args.threads} thread(s), N steps timed after {args.warmup} (fastest of {args.repeat})")
    print(f"{'model':>7} {'dtype':>6} {'ms/step':>8} {'x fp32':>7} {'arena':>10} {'x fp32':>7} "
          f"{'high-water':>10} {'stored act.':>11} {'x fp32':>7} {'model state':>11}")
    try:
        for name in args.models:
            onnx_path = bt.model_path(name, workdir)
            with open(bt.ref.facts_path(onnx_path)) as f:
                facts = json.load(f)
            data = os.path.join(workdir, f"{name}-tokens.bin")
            bt.ref.write_tokens(data, bt.TOKENS, facts["vocab"], bt.DATA_SEED)
            steps = args.steps or bt.DEFAULT_STEPS.get(name, 20)
            plans, reports, mems = {}, {}, {}
            for d in DTYPES:
                plans[d] = os.path.join(workdir, f"{name}-{d}")
                reports[d] = compile_plan(sp_compile, onnx_path, plans[d], d,
                                          os.path.join(workdir, f"{name}-{d}.json"))
                mems[d] = memory_of_run(sp_run, plans[d], data, args.threads, workdir)
            rows = list(DTYPES)
            env = {d: None for d in DTYPES}
            if has_bf16_dot():  # the same bf16 plan, every instruction widened
                rows.insert(2, "bf16w")
                plans["bf16w"], reports["bf16w"], mems["bf16w"] = plans["bf16"], reports["bf16"], mems["bf16"]
                env["bf16w"] = {"SP_CPU_BF16_DOT": "0"}
            if has_amx_bf16():  # the same bf16 plan, its GEMMs on VDPBF16PS
                rows.insert(2, "bf16dp")
                plans["bf16dp"], reports["bf16dp"], mems["bf16dp"] = plans["bf16"], reports["bf16"], mems["bf16"]
                env["bf16dp"] = {"SP_CPU_AMX": "0"}
            short = {d: [] for d in rows}
            long = {d: [] for d in rows}
            for _ in range(args.repeat):
                for d in rows:
                    short[d].append(bt.time_sp_run(sp_run, plans[d], data, args.warmup, args.threads, workdir,
                                                   env[d]))
                    long[d].append(bt.time_sp_run(sp_run, plans[d], data, args.warmup + steps, args.threads,
                                                  workdir, env[d]))
            ms = {d: 1000.0 * (min(long[d]) - min(short[d])) / steps for d in rows}
            for d in rows:
                m, r = mems[d], reports[d]["model_state"]
                state = (r["formula_parameter_bytes"] + r["formula_gradient_bytes"] +
                         r["formula_optimizer_state_bytes"] + r.get("formula_compute_copy_bytes", 0))
                print(f"{name:>7} {d:>6} {ms[d]:>8.2f} {ms[d] / ms['fp32']:>7.2f} "
                      f"{m['arena_bytes'] / 2**20:>8.2f}Mi {m['arena_bytes'] / mems['fp32']['arena_bytes']:>7.2f} "
                      f"{m['high_water_bytes'] / 2**20:>8.2f}Mi {m['stored_activation_bytes'] / 2**20:>9.2f}Mi "
                      f"{m['stored_activation_bytes'] / mems['fp32']['stored_activation_bytes']:>7.2f} "
                      f"{state / 2**20:>9.2f}Mi", flush=True)
    finally:
        if tmp:
            tmp.cleanup()
    print(f"load average {os.getloadavg()[0]:.2f} (before {load_before:.2f}), {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
