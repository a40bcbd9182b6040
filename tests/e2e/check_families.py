#!/usr/bin/python3
"""End-to-end test: sp-run trains HuggingFace-style GPT-2, Llama and BERT exports exactly like PyTorch.

tests/e2e/check_training.py does this for our nanoGPT (models/gpt.py); this file does it for the
models a user would export from transformers: models/export_family.py's GPT2LMHeadModel (hf_gpt2),
LlamaForCausalLM (llama: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, an additive
causal mask) and BertForMaskedLM (bert: a post-LN bidirectional encoder with an attention-mask input).
Each case exports a tiny model with some variant switches and token input name, builds the torch
reference (tests/e2e/family_reference.py: the family's model from OUT.json, weights loaded from the
ONNX initializers by name, the other graph inputs fed by role: positions arange(S), the attention
mask of the batch, zero token types), writes a random uint16 token file (torch_reference.write_tokens;
with runs of the pad id in the padded cases),
runs `sp-compile MODEL -o PLAN` and `sp-run PLAN --data DATA --dump D ...` and compares, in float32
with dropout 0, exactly as check_training.py does:

  compile     sp-compile succeeds and the plan's manifest has the export's batch, seq, vocab, tied
  logits      D/logits.npy = eval-mode logits of batch 0          max|a-b| / max|b|
  loss        step-1 loss of D/loss.csv = torch's cross entropy   |a-b| / |b|
  grads       D/grads/<name>.npy for exactly the torch parameters = torch's .grad after step 1
                                         max|a-b| / max(max|b|, 1e-5 G) each
              (G the largest gradient of the model: a floor for gradients that are analytically zero,
              such as BERT's key biases, which are pure rounding noise)
  trajectory  (some cases) 20 losses of `--steps 20 --lr 1e-3 --warmup 5` = torch AdamW
                                                                 max_t |a-b| / |b|
  lr          the lr column of that loss.csv = the schedule       |a-b| / |b|       <= 1e-8
  weights     D20/weights/<name>.npy after 20 steps = torch's     ||sp-torch|| / ||torch||

Each measure m(sp, torch32) must be within 8 max(m(torch32, torch64), 2^-24), eight times torch's own
float32 rounding on the same measure (torch_reference.rounding_bound); every line shows that rounding.
The objective is next-token cross entropy unless a case names another (torch_reference.objective_batch
writes sp-run's rules for padding, --pad-token, and BERT's masked-LM, --objective masked-lm): a
next-token BERT can read its targets and its loss falls fast; the numbers must agree all the same.
A padded case feeds the attention mask 0 at padding and ignores padding's targets on both sides.

Expectations (see --list): every case passes.

Prints one PASS/FAIL line per check and a final `N passed, M failed`; exits 1 if any check failed,
2 if sp-compile or sp-run is missing from --sp-bin (after waiting --wait-bin seconds for a build).

    /usr/bin/python3 tests/e2e/check_families.py --sp-bin build/bin --workdir /tmp/e2e-families
    /usr/bin/python3 tests/e2e/check_families.py --sp-bin build/bin --workdir /tmp/e2e-families --family gpt2
    /usr/bin/python3 tests/e2e/check_families.py --list
"""

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_training as ct  # noqa: E402  (its Results, run, load_dumped, ... helpers)
import family_reference as fref  # noqa: E402
import torch_reference as ref  # noqa: E402

import export_family  # noqa: E402  (on sys.path through family_reference)

OPSETS = (13, 14, 17)
BIN_WAIT_S = 300
# A gradient that is analytically zero (BERT's attention key biases: softmax ignores a per-row
# constant) is pure rounding noise (~1e-12 of the largest gradient in float32, ~1e-21 in float64), so
# max|a-b| / max|b| is meaningless there: each gradient's error is divided by at least this fraction
# of the largest gradient of the model.
GRAD_FLOOR = 1e-5


def grad_scale(grads64):
    """The largest |gradient| of the model, the floor grad_err measures against."""
    return max(float(np.max(np.abs(g))) for g in grads64.values())


def grad_err(actual, expected, scale):
    """max|a-b| / max(max|b|, GRAD_FLOOR * scale): check_training's measure, with a floor."""
    diff = float(np.max(np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))))
    return diff / max(float(np.max(np.abs(expected))), GRAD_FLOOR * scale)


@dataclass
class Case:
    """An export of models/export_family.py to check: family, sizes, switches, token input name."""
    name: str
    family: str
    opset: int
    input_name: str
    variants: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)
    tied: bool = None
    trajectory: bool = False
    expect: str = ""
    # sp-run's objective (torch_reference.objective_batch): None is next-token without padding.
    objective: dict = None

    def export_argv(self, path):
        argv = ["-o", path, "--family", self.family, "--opset", str(self.opset), "--input-name", self.input_name]
        sizes = dict(layers=2, hidden=32, heads=4, seq=16, vocab=64, batch=2)
        sizes.update(self.sizes)
        for flag, value in sizes.items():
            argv += [f"--{flag.replace('_', '-')}", str(value)]
        for switch, value in self.variants.items():
            argv += [f"--{switch.replace('_', '-')}", str(value)]
        if self.tied is not None:
            argv.append("--tied" if self.tied else "--untied")
        return argv


# sp-run objectives (torch_reference.objective_batch): padding id 0 (HF BERT's) as next-token data,
# and BERT's masked-LM over padded data with a [MASK] id of 3 and a rate above BERT's 0.15, so that
# the tiny batches (2 x 16) predict enough positions.
PADDED = {"kind": "next-token", "pad": 0, "seed": 1234}
MASKED_LM_PADDED = {"kind": "masked-lm", "pad": 0, "mask_token": 3, "rate": 0.3, "seed": 1234}

GPT2_EXPECT = "pass"
LLAMA_EXPECT = "pass"
NEOX_EXPECT = "pass"
GPTJ_EXPECT = "pass"
PHI_EXPECT = "pass"
BERT_EXPECT = "pass"

CASES = [
    # hf_gpt2: the same weights (seed) under the three usual token input names, then the other forms.
    Case("hf_gpt2-o17-idx", "gpt2", 17, "idx", trajectory=True, expect=GPT2_EXPECT),
    Case("hf_gpt2-o17-input_ids", "gpt2", 17, "input_ids", trajectory=True,
         expect=GPT2_EXPECT + " (wrong numbers if sp-run feeds only an input named idx)"),
    Case("hf_gpt2-o17-tokens", "gpt2", 17, "tokens", expect=GPT2_EXPECT),
    Case("hf_gpt2-o13-idx-nonpersistent-untied-maxpos", "gpt2", 13, "idx", {"buffers": "nonpersistent"},
         tied=False, sizes=dict(heads=2, seq=24, max_positions=32, vocab=96), trajectory=True, expect=GPT2_EXPECT),
    # n_positions 2048 (GPT-Neo's, GPT-J's): a causal buffer of 4M elements, too large to fold,
    # checked by its data (passes/Canonicalize.cpp, isTrilBufferSlice).
    Case("hf_gpt2-o17-idx-maxpos2048", "gpt2", 17, "idx", sizes=dict(max_positions=2048), trajectory=True,
         expect=GPT2_EXPECT),
    Case("hf_gpt2-o14-input_ids-mask-positions-padded", "gpt2", 14, "input_ids",
         {"attention_mask": "input", "position_ids": "input"}, sizes=dict(hidden=48, heads=3),
         trajectory=True, objective=PADDED, expect=GPT2_EXPECT),
    # HF's other activation_functions: relu (OPT's), silu and exact gelu in a GPT-2 MLP.
    Case("hf_gpt2-o17-idx-relu", "gpt2", 17, "idx", {"activation": "relu"}, trajectory=True,
         expect=GPT2_EXPECT),
    Case("hf_gpt2-o14-input_ids-silu", "gpt2", 14, "input_ids", {"activation": "silu"}, expect=GPT2_EXPECT),
    Case("hf_gpt2-o13-tokens-gelu", "gpt2", 13, "tokens", {"activation": "gelu"}, expect=GPT2_EXPECT),
    # Parallel residual blocks (the gpt-neox and gpt-j families) in GPT-2's code.
    Case("hf_gpt2-o17-idx-parallel", "gpt2", 17, "idx", {"residual": "parallel"}, trajectory=True,
         expect=GPT2_EXPECT),
    Case("hf_gpt2-o14-input_ids-parallel-one-norm", "gpt2", 14, "input_ids",
         {"residual": "parallel-one-norm"}, trajectory=True, expect=GPT2_EXPECT),
    # gpt_neox: HF's GPTNeoXForCausalLM (Pythia's rotary_pct 0.25, parallel residual), per-head fused
    # qkv, partial rotary; then every switch value across the opsets.
    Case("gpt_neox-o17-input_ids-hf", "gpt_neox", 17, "input_ids", trajectory=True, expect=NEOX_EXPECT),
    Case("gpt_neox-o14-idx-half-rotary-mask-positions-padded", "gpt_neox", 14, "idx",
         {"rotary_pct": "0.5", "attention_mask": "input", "position_ids": "input"}, sizes=dict(hidden=48, heads=3),
         trajectory=True, objective=PADDED, expect=NEOX_EXPECT),
    Case("gpt_neox-o13-tokens-full-rotary-sequential", "gpt_neox", 13, "tokens",
         {"rotary_pct": "1.0", "parallel_residual": "false"}, expect=NEOX_EXPECT),
    # gptj: HF's GPTJForCausalLM (GPT-J-6B's rotary_dim of a quarter head), separate bias-free q/k/v,
    # interleaved rotary on [b, s, heads, d] before the permute, an lm_head with bias; then every
    # switch value across the opsets.
    Case("gptj-o17-input_ids-hf", "gptj", 17, "input_ids", sizes=dict(hidden=64), trajectory=True,
         expect=GPTJ_EXPECT),
    Case("gptj-o14-idx-half-rotary-mask-positions-padded", "gptj", 14, "idx",
         {"rotary_pct": "0.5", "attention_mask": "input", "position_ids": "input"}, sizes=dict(hidden=48, heads=3),
         trajectory=True, objective=PADDED, expect=GPTJ_EXPECT),
    Case("gptj-o13-tokens-full-rotary-positions", "gptj", 13, "tokens",
         {"rotary_pct": "1.0", "position_ids": "input"}, expect=GPTJ_EXPECT),
    # phi: HF's PhiForCausalLM (4.37; phi-1/phi-1.5's partial_rotary_factor 0.5), q/k/v/dense with bias,
    # rotate_half on part of each head, the additive `_make_causal_mask`, an lm_head with bias.
    Case("phi-o17-input_ids-hf", "phi", 17, "input_ids", sizes=dict(hidden=64), trajectory=True,
         expect=PHI_EXPECT),
    Case("phi-o14-idx-quarter-rotary-positions", "phi", 14, "idx", {"rotary_pct": "0.25", "position_ids": "input"},
         sizes=dict(hidden=64), trajectory=True, expect=PHI_EXPECT),
    Case("phi-o13-tokens-full-rotary", "phi", 13, "tokens", {"rotary_pct": "1.0"}, sizes=dict(hidden=48, heads=3),
         expect=PHI_EXPECT),
    # llama: HF's defaults first, then every switch value at least once across the opsets.
    Case("llama-o17-input_ids-hf", "llama", 17, "input_ids", trajectory=True, expect=LLAMA_EXPECT),
    Case("llama-o14-idx-div-manual-interleaved-sliced-triu-mask-padded", "llama", 14, "idx",
         {"rmsnorm": "div", "silu": "manual", "rope": "interleaved", "rope_tables": "sliced", "mask": "triu",
          "attention_mask": "input"}, objective=PADDED, expect=LLAMA_EXPECT),
    Case("llama-o13-input_ids-hf-sliced-ones-mha-maxpos", "llama", 13, "input_ids",
         {"rope_tables": "sliced", "attention_mask": "ones"}, sizes=dict(kv_heads=4, max_positions=24),
         expect=LLAMA_EXPECT),
    Case("llama-o17-tokens-interleaved-triu-tied-mqa", "llama", 17, "tokens",
         {"rope": "interleaved", "mask": "triu"}, sizes=dict(heads=4, kv_heads=1), tied=True,
         expect=LLAMA_EXPECT),
    # tril: each attention's causal mask built from its shape (gen_llama_graph.py's form), with padding.
    Case("llama-o14-input_ids-tril-mask-padded", "llama", 14, "input_ids",
         {"mask": "tril", "attention_mask": "input"}, objective=PADDED, expect=LLAMA_EXPECT),
    # s 1088 (> 1024): the causal mask HF builds at run time has more elements than the folder
    # materialises; the canonicalizer checks it one element at a time (analysis/LazyElements.h).
    Case("llama-o17-input_ids-hf-seq1088", "llama", 17, "input_ids",
         sizes=dict(layers=1, seq=1088, max_positions=1088, batch=1), expect=LLAMA_EXPECT),
    Case("llama-o14-idx-triu-seq1088", "llama", 14, "idx", {"mask": "triu"},
         sizes=dict(layers=1, seq=1088, max_positions=1088, batch=1), expect=LLAMA_EXPECT),
    Case("llama-o14-idx-mask-padded-seq1088", "llama", 14, "idx", {"attention_mask": "input"},
         sizes=dict(layers=1, seq=1088, max_positions=1088, batch=2), objective=PADDED, expect=LLAMA_EXPECT),
    # bert
    Case("bert-o17-input_ids-10000-types-mlm-padded", "bert", 17, "input_ids", trajectory=True,
         objective=MASKED_LM_PADDED, expect=BERT_EXPECT),
    Case("bert-o14-input_ids-finfo-buffer-maxpos-padded", "bert", 14, "input_ids",
         {"mask": "finfo", "token_types": "buffer"}, sizes=dict(max_positions=24), objective=PADDED,
         expect=BERT_EXPECT),
    Case("bert-o13-idx-10000-buffer", "bert", 13, "idx", {"token_types": "buffer"}, sizes=dict(heads=2),
         expect=BERT_EXPECT),
]

FAMILY_ALIASES = {"gpt2": "gpt2", "hf_gpt2": "gpt2", "gpt_neox": "gpt_neox", "neox": "gpt_neox", "gptj": "gptj",
                  "gpt-j": "gptj", "phi": "phi", "llama": "llama",
                  "bert": "bert"}

# Forms the exporter writes that sp refuses, with one error naming them: not trained here.
REFUSED = set()


def uncovered(cases):
    """(family, switch, value) and (family, opset) pairs that no case has."""
    have = set()
    for c in cases:
        variants = {name: default for name, (_, default) in export_family.VARIANTS[c.family].items()}
        variants.update(c.variants)
        have |= {(c.family, k, v) for k, v in variants.items()}
        have.add((c.family, "opset", c.opset))
    want = {(f, k, v) for f, switches in export_family.VARIANTS.items() for k, (choices, _) in switches.items()
            for v in choices}
    want |= {(f, "opset", o) for f in export_family.FAMILIES for o in OPSETS}
    return sorted(want - have - REFUSED, key=str)


class FamilyCheck(ct.ModelCheck):
    """All the checks of one export; check_training.ModelCheck's, with the family's reference."""

    def export_model(self):
        path = os.path.join(self.dir, "model.onnx")
        export_family.main(self.case.export_argv(path))
        return path, fref.read_facts(path)

    def write_tokens(self):
        tokens = super().write_tokens()
        pad = (self.case.objective or {}).get("pad")
        if pad is not None:
            tokens = fref.pad_tokens(tokens, pad, self.facts, ct.TRAJ_STEPS)
            tokens.tofile(self.data)
        return tokens

    def run_flags(self):
        return ref.sp_run_objective_flags(self.case.objective) if self.case.objective else []

    def get_batch(self, k):
        return fref.batch(self.facts, self.tokens, k, self.case.objective)

    def compile_flags(self):
        if not self.args.bind_inputs:
            return []
        return [f"--input={spec['name']}={spec['role']}" for spec in self.facts["inputs"][1:]]

    def reference(self, dtype):
        return fref.reference_model(self.onnx_path, dropout=0.0, dtype=dtype, facts=self.facts)

    def eval_logits(self, model, x):
        return fref.eval_logits(model, self.facts, *x)

    def loss_and_grads(self, model, x, y):
        return fref.loss_and_grads(model, self.facts, x[0], y, x[1])

    def grad_error(self, actual, expected, grads64):
        return grad_err(actual, expected, grad_scale(grads64))

    def grad_note(self, names, grads64):
        scale = grad_scale(grads64)
        floored = [n for n in names if float(np.max(np.abs(grads64[n]))) < GRAD_FLOOR * scale]
        return (f"; {len(floored)} below {GRAD_FLOOR:g} x the largest gradient (BERT's key biases are 0 "
                f"analytically), e.g. {floored[0]}, measured against that" if floored else "")

    def train_reference(self, model):
        return fref.train(model, self.facts, self.tokens, ct.TRAJ_STEPS, ct.TRAJ_LR, warmup=ct.TRAJ_WARMUP,
                          objective=self.case.objective)

    def run_all(self):
        try:
            error = self.prepare()
        except SystemExit as e:  # the exporter refuses with sys.exit / argparse
            error = f"export refused: {e.code}"
        except Exception:  # noqa: BLE001  an export failure is a test failure, not a crash
            error = f"setup failed: {traceback.format_exc(limit=2).strip().splitlines()[-1]}"
        if error:
            self.fail("compile", error)
            return
        f = self.facts
        inputs = ", ".join(f"{i['name']}={i['role']}" for i in f["inputs"])
        self.check("compile", True,
                   f"{f['family']} -> plan (L {f['layers']} h {f['hidden']} heads {f['heads']}"
                   f"{'/' + str(f['kv_heads']) if f['family'] == 'llama' else ''} s {self.seq} v {self.vocab} "
                   f"b {self.batch}, {'tied' if f['tied'] else 'untied'}, opset {f['opset']}; inputs {inputs})")
        stages = [("step1", self.check_step1)]
        if self.case.trajectory:
            stages.append(("trajectory", self.check_trajectory))
        for name, stage in stages:
            try:
                stage()
            except Exception:  # noqa: BLE001  report and go on with the other checks
                self.fail(name, f"the check crashed: {traceback.format_exc(limit=3).strip().splitlines()[-1]}")


def wait_for(paths, seconds):
    """The C++ tools are rebuilt from time to time: wait up to `seconds` for them to (re)appear."""
    deadline = time.time() + seconds
    while True:
        missing = [p for p in paths if not ct.executable(p)]
        if not missing or time.time() >= deadline:
            return missing
        time.sleep(5)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sp-bin", help="directory holding sp-compile and sp-run")
    p.add_argument("--workdir", help="directory for models, plans and dumps (created if missing)")
    p.add_argument("--family", help="run only this family's cases: gpt2 (or hf_gpt2), gpt_neox (or neox), gptj, phi, "
                   "llama, "
                   "bert")
    p.add_argument("--only", help="run only the cases whose name contains one of these comma-separated strings")
    p.add_argument("--list", action="store_true", help="list the cases and what is expected of them, then exit")
    p.add_argument("--threads", type=int, default=2, help="sp-run --threads and torch threads (default 2)")
    p.add_argument("--bind-inputs", action="store_true",
                   help="pass sp-compile --input NAME=ROLE for every input but the tokens (default: let sp find them)")
    p.add_argument("--wait-bin", type=float, default=BIN_WAIT_S,
                   help=f"seconds to wait for a missing sp-compile/sp-run (a rebuild; default {BIN_WAIT_S})")
    args = p.parse_args(argv)
    if args.family:
        if args.family not in FAMILY_ALIASES:
            p.error(f"--family must be one of {', '.join(FAMILY_ALIASES)}")
        args.family = FAMILY_ALIASES[args.family]
    if args.list:
        return args
    if not args.sp_bin or not args.workdir:
        p.error("--sp-bin and --workdir are required (except with --list)")
    args.sp_compile = os.path.abspath(os.path.join(args.sp_bin, "sp-compile"))
    args.sp_run = os.path.abspath(os.path.join(args.sp_bin, "sp-run"))
    missing = wait_for([args.sp_compile, args.sp_run], args.wait_bin)
    if missing:
        p.exit(2, f"error: {missing[0]} not found or not executable: build it first, or pass the build's bin/ "
                  "directory as --sp-bin\n")
    return args


def selected(cases, args):
    return [c for c in cases if (not args.family or c.family == args.family) and (not args.only or any(o in c.name for o in args.only.split(",")))]


def main(argv=None):
    args = parse_args(argv)
    if uncovered(CASES):
        sys.exit(f"error: the test matrix misses {uncovered(CASES)}")
    cases = selected(CASES, args)
    if args.list:
        for c in cases:
            print(f"{c.name:58s} {'+20 steps' if c.trajectory else '         '}  expect: {c.expect}")
            print(f"{'':58s} export_family.py {' '.join(c.export_argv('OUT.onnx'))}")
        return
    torch.set_num_threads(args.threads)
    os.makedirs(args.workdir, exist_ok=True)
    results = ct.Results()
    start = time.perf_counter()
    for case in cases:
        FamilyCheck(case, args, results).run_all()
    print(f"({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"{results.passed} passed, {results.failed} failed")
    sys.exit(1 if results.failed else 0)


if __name__ == "__main__":
    main()
