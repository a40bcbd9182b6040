#!/usr/bin/python3
"""End-to-end test: sp-compile finds the model's sizes and every layer's roles.

Exports a matrix of torch models with models/export_gpt.py (opsets 13/14/17 and
every variant switch) and the paper's four configurations with
models/gen_paper_graph.py into --workdir, runs `sp-compile MODEL.onnx --report
R.json --attention unfused` on each, and checks R.json's `model` object (sizes,
parameter count, tying, causal) and its `structure` (embeddings, final norm,
head, and REQUIRED_ROLES in every layer) against what the model is known to
be; the torch exports again with the fused core (FUSED_ROLES). Prints one PASS/FAIL line
per case and a final `N passed, M failed`; exits 1 if any case failed.

    /usr/bin/python3 tests/e2e/check_structure.py --sp-compile build/bin/sp-compile --workdir /tmp/e2e

With --export-only it only makes the models and checks them against the
parameter formula (no sp-compile needed). Needs torch and onnx.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass

import onnx

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "models"))
import export_gpt  # noqa: E402
import gen_paper_graph  # noqa: E402
from gpt import GELU_FORMS, LAYERNORM_FORMS, LINEAR_FORMS, MASK_FORMS, SCALE_FORMS  # noqa: E402

REQUIRED_ROLES = ["ln1", "qkv", "qk", "scale", "mask", "softmax", "attn_core_dropout", "av", "proj",
                  "attn_dropout", "residual1", "ln2", "fc1", "act", "fc2", "mlp_dropout", "residual2"]
# With the fused core (sp-compile's default), one "attention" stands for these.
CORE_ROLES = ("qk", "scale", "mask", "softmax", "attn_core_dropout", "av")
FUSED_ROLES = [r for r in REQUIRED_ROLES if r not in CORE_ROLES] + ["attention"]
MODEL_FIELDS = ("layers", "hidden", "heads", "seq", "vocab", "batch", "params", "tied")
WHOLE_MODEL_PARTS = ("embedding", "position_embedding", "final_norm", "lm_head")
SP_COMPILE_TIMEOUT_S = 600
OPSETS = (13, 14, 17)
SWITCHES = {"tied": (True, False), "gelu": GELU_FORMS, "layernorm": LAYERNORM_FORMS, "linear": LINEAR_FORMS,
            "mask": MASK_FORMS, "scale": SCALE_FORMS, "dynamic": (True, False), "external_data": (True, False)}


@dataclass(frozen=True)
class Case:
    opset: int
    tied: bool
    gelu: str
    layernorm: str
    linear: str
    mask: str
    scale: str
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    seq: int = 32
    vocab: int = 128
    batch: int = 2
    dynamic: bool = False
    external_data: bool = False

    @property
    def name(self):
        extras = [word for word, on in (("dynamic", self.dynamic), ("external", self.external_data)) if on]
        return "-".join([f"o{self.opset}", "tied" if self.tied else "untied", self.gelu, self.layernorm,
                         self.linear, self.mask, self.scale] + extras)

    def export_argv(self, path):
        argv = ["-o", path, "--opset", str(self.opset), "--gelu", self.gelu, "--layernorm", self.layernorm,
                "--linear", self.linear, "--mask", self.mask, "--scale", self.scale,
                "--tied" if self.tied else "--untied"]
        for flag in ("layers", "hidden", "heads", "seq", "vocab", "batch"):
            argv += [f"--{flag}", str(getattr(self, flag))]
        switches = (("--dynamic", self.dynamic), ("--external-data", self.external_data))
        return argv + [flag for flag, on in switches if on]


# Every value of every switch at least once; every opset tied and untied, with erf and with tanh.
CASES = [
    Case(13, True, "erf", "module", "matmul", "buffer", "div"),
    Case(13, False, "tanh", "manual", "gemm", "buffer", "mul", layers=3, hidden=32, heads=2, seq=16, vocab=64),
    Case(13, True, "tanh", "module", "gemm", "buffer", "div", hidden=48, heads=3, dynamic=True),
    Case(13, False, "erf", "manual", "matmul", "buffer", "mul", hidden=32, seq=16),
    Case(14, True, "erf", "module", "matmul", "trilu", "mul", layers=3, hidden=48, heads=2, vocab=96),
    Case(14, False, "tanh", "manual", "gemm", "trilu", "div", hidden=32, heads=2, seq=24, vocab=64),
    Case(14, True, "tanh", "manual", "matmul", "buffer", "div", external_data=True),
    Case(14, False, "erf", "module", "gemm", "buffer", "mul", layers=3, seq=16, dynamic=True),
    Case(17, True, "erf", "module", "matmul", "buffer", "div"),
    Case(17, False, "tanh", "module", "matmul", "trilu", "div", layers=3, hidden=32, heads=2, seq=16, vocab=64),
    Case(17, True, "tanh", "manual", "gemm", "trilu", "mul", hidden=48, dynamic=True),
    Case(17, False, "erf", "manual", "gemm", "buffer", "div", hidden=32, heads=2, seq=24, vocab=96),
    Case(17, True, "erf", "module", "gemm", "trilu", "mul", layers=3, seq=16, vocab=64),
    Case(17, False, "erf", "module", "matmul", "buffer", "div", external_data=True),
]


def uncovered(cases):
    """Switch values, and (opset, tied, gelu) combinations, that no case has."""
    need = {(s, v) for s, values in SWITCHES.items() for v in values}
    need |= {("opset/tied/gelu", (o, t, g)) for o in OPSETS for t in (True, False) for g in GELU_FORMS}
    have = {(s, getattr(c, s)) for c in cases for s in SWITCHES}
    have |= {("opset/tied/gelu", (c.opset, c.tied, c.gelu)) for c in cases}
    return sorted(need - have, key=str)


def gpt_params(layers, hidden, seq, vocab, tied):
    """Trainable parameters of the GPT: embeddings, L layers of 12h^2 + 13h, final norm, head if untied."""
    return vocab * hidden + seq * hidden + layers * (12 * hidden ** 2 + 13 * hidden) + 2 * hidden \
        + (0 if tied else vocab * hidden)


def model_differences(expected, report, fused=False):
    """What the report's `model` object and `structure` get wrong, as a list of short strings: with
    fused, the roles of a fused attention core, whose causal mask the report must still see."""
    model, structure = report.get("model", {}), report.get("structure", {})
    diffs = [f"model.{f} {model.get(f)!r} != {expected[f]!r}" for f in MODEL_FIELDS
             if type(model.get(f)) is not type(expected[f]) or model.get(f) != expected[f]]  # 1 is not true
    diffs += [f"structure.{part} is not true" for part in WHOLE_MODEL_PARTS if structure.get(part) is not True]
    layers = structure.get("layers", [])
    if len(layers) != expected["layers"]:
        diffs.append(f"structure.layers has {len(layers)} entries, want {expected['layers']}")
    if model.get("causal") is not True:
        diffs.append("model.causal is not true")
    for i, layer in enumerate(layers):
        missing = [role for role in (FUSED_ROLES if fused else REQUIRED_ROLES) if role not in layer.get("roles", [])]
        if missing:
            diffs.append(f"layer {i} lacks roles {missing}")
    return diffs


def run_sp_compile(sp_compile, model_path, extra_args=()):
    """Run sp-compile on a model; returns (report dict, None) or (None, error message)."""
    report_path = os.path.splitext(model_path)[0] + ".report.json"
    if os.path.exists(report_path):
        os.remove(report_path)
    cmd = [sp_compile, model_path, "--report", report_path, *extra_args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SP_COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"sp-compile timed out after {SP_COMPILE_TIMEOUT_S} s: {' '.join(cmd)}"
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "(no output)").splitlines()[-1]
        return None, f"sp-compile exited {proc.returncode}: {last}"
    try:
        with open(report_path) as f:
            return json.load(f), None
    except (OSError, json.JSONDecodeError) as e:
        return None, f"cannot read the report {report_path}: {e}"


def report_line(name, diffs):
    print(f"FAIL {name}: {'; '.join(diffs)}" if diffs else f"PASS {name}", flush=True)
    return not diffs


def export_case(case, workdir):
    """Export one case; returns (model path, expected facts, differences so far)."""
    path = os.path.join(workdir, case.name + ".onnx")
    try:
        export_gpt.main(case.export_argv(path))
    except (Exception, SystemExit):
        return path, None, [f"export failed: {traceback.format_exc(limit=1).strip().splitlines()[-1]}"]
    with open(export_gpt.facts_path(path)) as f:
        facts = json.load(f)
    want = gpt_params(case.layers, case.hidden, case.seq, case.vocab, case.tied)
    return path, facts, [] if facts["params"] == want else [f"export has {facts['params']} params, formula {want}"]


def check_torch_case(case, workdir, sp_compile):
    path, facts, diffs = export_case(case, workdir)
    if sp_compile and facts:
        extra = ["--batch", str(case.batch), "--seq", str(case.seq)] if case.dynamic else []
        # Every op of the paper's attention core found, and the core fused.
        for fused in (False, True):
            report, error = run_sp_compile(sp_compile, path, extra + ["--attention", "fused" if fused else "unfused"])
            diffs += [error] if error else [d + (" (fused)" if fused else "") for d in
                                            model_differences(facts, report, fused)]
    return report_line(case.name, diffs)


def generated_params(path):
    """Float parameters declared in a generated graph (the bool mask buffers are not parameters)."""
    graph = onnx.load(path, load_external_data=False).graph
    return sum(math.prod(t.dims) for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT)


def check_paper_models(workdir, models_csv, sp_compile):
    """Generate the paper's graphs and check each; returns one bool per model."""
    directory = os.path.join(workdir, "paper")
    os.makedirs(directory, exist_ok=True)
    results = []
    for name, size in gen_paper_graph.read_paper_models(models_csv).items():
        path = gen_paper_graph.paper_graph_path(directory, name)
        gen_paper_graph.write_graph(size, path, name)
        expected = {"layers": size.layers, "hidden": size.hidden, "heads": size.heads, "seq": size.seq,
                    "vocab": size.vocab, "batch": size.batch, "tied": True,
                    "params": gpt_params(size.layers, size.hidden, size.seq, size.vocab, tied=True)}
        declared = generated_params(path)
        diffs = [] if declared == expected["params"] else [f"graph has {declared} params, formula {expected['params']}"]
        if sp_compile:
            report, error = run_sp_compile(sp_compile, path, ["--attention", "unfused"])
            diffs += [error] if error else model_differences(expected, report)
        results.append(report_line(f"paper-{name}", diffs))
    return results


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sp-compile", help="path to the sp-compile binary (required unless --export-only)")
    p.add_argument("--workdir", required=True, help="directory for the models and reports (created if missing)")
    p.add_argument("--export-only", action="store_true", help="only make the models and check their facts")
    p.add_argument("--models-csv", default=gen_paper_graph.DEFAULT_MODELS_CSV,
                   help="the paper's models.csv (default: %(default)s)")
    args = p.parse_args(argv)
    if args.export_only:
        args.sp_compile = None
    elif not args.sp_compile:
        p.error("--sp-compile is required (or pass --export-only)")
    elif not (os.path.isfile(args.sp_compile) and os.access(args.sp_compile, os.X_OK)):
        p.exit(2, f"error: sp-compile not found or not executable at {args.sp_compile}: build it first, "
                  "or pass --export-only to test only the exports\n")
    return args


def main(argv=None):
    args = parse_args(argv)
    if uncovered(CASES):
        sys.exit(f"error: the test matrix misses {uncovered(CASES)}")
    os.makedirs(args.workdir, exist_ok=True)
    results = [check_torch_case(case, args.workdir, args.sp_compile) for case in CASES]
    results += check_paper_models(args.workdir, args.models_csv, args.sp_compile)
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
