#!/usr/bin/python3
"""Test that sp-compile's activation memory reproduces the paper's Table 2.

Writes the four models of models/paper/models.csv (Table 3) without weights,
runs `sp-compile --paper-table` on them (fp16 accounting, t = 8) and checks
all 36 cells (four sizes times Table 2's six configurations, two with a
fused attention core and one more with context parallelism, c = 2): our bytes per layer, read off the compiled program,
within 0.5% of Table 2's formula (for the fused ones, Table 2's without the
5as/h term plus 4asb/t bytes of log-sum-exp); the Figure 7
chart names every model and configuration; the first pipeline stage of the
175B, 530B and 1T pipelines against Eq. 5 and 6 (times 1 + (p-1)/(pm) when
interleaved); and the FLOP report of the 175B model equals the paper's
72 B L s h^2 (1 + s/6h + v/12hL).

    /usr/bin/python3 tests/e2e/check_paper_table.py --sp-compile build/bin/sp-compile --workdir /tmp/pt
"""

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "models"))
import gen_paper_graph  # noqa: E402

TOLERANCE = 0.005
# The paper's pipelines (Table 3): p, m and the global batch as microbatches of b.
PIPELINES = {
    "175B": ["--pp", "8", "--interleave", "3", "--microbatches", "64"],
    "530B": ["--pp", "35", "--interleave", "3", "--microbatches", "280"],
    "1T": ["--pp", "64", "--microbatches", "512"],
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sp-compile", required=True)
    p.add_argument("--workdir", required=True)
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    models = gen_paper_graph.read_paper_models(gen_paper_graph.DEFAULT_MODELS_CSV)
    paths = []
    for name in models:
        path = os.path.join(args.workdir, f"gpt-{name}.onnx")
        gen_paper_graph.main(["--model", name, "-o", path])
        paths.append(path)
    report = os.path.join(args.workdir, "paper-table.json")
    figure = os.path.join(args.workdir, "figure7.svg")
    out = subprocess.run([args.sp_compile, "--paper-table", "--figure7", figure, "--report", report] + paths,
                         check=True, capture_output=True, text=True).stdout
    print(out)
    table = json.load(open(report))["paper_table"]
    failures, cells = [], 0
    for model in table:
        assert model["tp"] == 8, model
        for row in model["rows"]:
            cells += 1
            if abs(row["relative_difference"]) > TOLERANCE:
                failures.append(f"{model['model']} / {row['configuration']}: {row['bytes']} vs "
                                f"{row['table2_bytes']:.0f} ({100 * row['relative_difference']:+.3f}%)")
    assert cells == 36, f"expected 36 cells, got {cells}"
    svg = open(figure).read()
    for model in table:
        assert model["model"] in svg, f"{model['model']} missing from Figure 7"
    for config in ["TP+SP+selective", "full recompute", "TP+fused", "TP+SP+fused", "TP+SP+CP2+fused"]:
        assert config in svg, f"{config} missing from Figure 7"

    # The whole first pipeline stage (Eq. 5 and 6, interleaving factor
    # included) at the paper's pipeline sizes, from rank 0's unrolled program.
    for name, flags in PIPELINES.items():
        report = os.path.join(args.workdir, f"pipeline-{name}.json")
        out = subprocess.run([args.sp_compile, "--paper-table", os.path.join(args.workdir, f"gpt-{name}.onnx"),
                              "--report", report, "--figure7", os.path.join(args.workdir, f"figure7-{name}.svg")]
                             + flags, check=True, capture_output=True, text=True).stdout
        print("\n".join(line for line in out.splitlines() if "first stage" in line))
        rows = [r for r in json.load(open(report))["paper_table"][0]["rows"] if "Eq." in r["configuration"]]
        assert len(rows) == 2, rows
        for row in rows:
            cells += 1
            if abs(row["relative_difference"]) > TOLERANCE:
                failures.append(f"{name} / {row['configuration']}: {row['bytes']} vs {row['table2_bytes']:.0f}")

    # The FLOP report at 175B, t = 8, SP and selective recompute.
    flops_json = os.path.join(args.workdir, "175B.json")
    subprocess.run([args.sp_compile, os.path.join(args.workdir, "gpt-175B.onnx"), "--tp", "8", "--sp",
                    "--recompute", "selective", "--dtype", "fp16", "--quiet", "--report", flops_json], check=True)
    flops = json.load(open(flops_json))["flops"]
    if abs(flops["model_vs_paper"]) > 1e-9:
        failures.append(f"175B model FLOPs {flops['model_flops_per_iteration']:.6e} vs the paper's "
                        f"{flops['paper_model_flops_per_iteration']:.6e}")
    m = models["175B"]
    s, h, b, L = m.seq, m.hidden, m.batch, m.layers
    # Selective recomputes QK^T of every layer: 2 b s^2 h FLOPs.
    expected = 2 * b * s * s * h * L
    if abs(flops["recompute_flops_per_iteration"] / expected - 1) > 1e-9:
        failures.append(f"175B recompute FLOPs {flops['recompute_flops_per_iteration']:.6e}, expected {expected:.6e}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"all {cells} cells within {100 * TOLERANCE}% of Table 2 and Eq. 5/6; FLOPs equal the paper's formula")
    return 0


if __name__ == "__main__":
    sys.exit(main())
