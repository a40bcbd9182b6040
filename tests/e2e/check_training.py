#!/usr/bin/python3
"""End-to-end test: sp-run trains exactly like PyTorch.

For the committed models/tiny/gpt-tiny.onnx and a set of torch exports (models/export_gpt.py at
opsets 13, 14 and 17, covering tied/untied, erf/tanh GELU, module/manual LayerNorm, matmul/gemm
linears, buffer/trilu masks and div/mul scaling), it builds the torch reference (models/gpt.py's GPT
with the export's config, weights loaded from the ONNX initializers by name), writes a random uint16
token file (10k ids < vocab from a fixed seed: a random Markov chain, so that the loss falls), runs
`sp-compile MODEL -o PLAN` and `sp-run PLAN --data DATA ... --dump D`, and checks against torch
(float32, dropout 0), each measure m(sp, torch32) within 8 max(m(torch32, torch64), 2^-24): 8 times
torch's own float32 rounding on the same measure (torch_reference.rounding_bound; no bound is tuned
on one machine):

  logits      D/logits.npy = eval-mode logits of batch 0          max|a-b| / max|b|
  loss        step-1 loss of D/loss.csv = torch's cross entropy   |a-b| / |b|
  grads       D/grads/<name>.npy for exactly the torch parameters, each
              = torch's .grad after step 1 (before clipping)      max|a-b| / max|b| each
  grad_norm   the grad_norm column of step 1 = torch's global L2 norm of those .grad
              (clip_grad_norm_'s total_norm, before clipping)     |a-b| / |b|
  trajectory  the 20 losses of `--steps 20 --lr 1e-3 --warmup 5` = torch AdamW (two param groups,
              clip_grad_norm_(1.0), the spec's LR schedule)       max_t |a-b| / |b|
  lr          the lr column of that loss.csv = the spec's schedule  |a-b| / |b| <= 1e-8 (float64
              on both sides; loss.csv prints 9 significant digits)
  weights     D20/weights/<name>.npy for exactly the parameters after those 20 steps, all of
              them together = torch's                     ||sp-torch||_2 / ||torch||_2
              (one norm over every element of every parameter: Adam turns rounding into
              lr-sized steps where a gradient is ~0, so a per-tensor max is noise at ~1e-4,
              while the whole-model norm sits at ~1e-6 and moves to >= 3e-4 if weight decay,
              clipping, beta2 or eps are wrong; the loss alone moves by < 1e-4 without decay)
and, on the committed model, that sp-run rejects a too-short token file and a token id >= vocab
(naming its position). Each line also shows torch float32 against torch float64 on the same check,
the rounding noise floor of float32 itself.

Prints one PASS/FAIL line per check and a final `N passed, M failed`; exits 1 if any check failed,
2 if sp-compile or sp-run is missing from --sp-bin.

    /usr/bin/python3 tests/e2e/check_training.py --sp-bin build/bin --workdir /tmp/e2e-training
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402

sys.path.insert(0, os.path.join(ref.REPO_ROOT, "models"))
import export_gpt  # noqa: E402
from gpt import GELU_FORMS, LAYERNORM_FORMS, LINEAR_FORMS, MASK_FORMS, SCALE_FORMS  # noqa: E402

COMMITTED_MODEL = os.path.join(ref.REPO_ROOT, "models", "tiny", "gpt-tiny.onnx")
# The lr column: float64 on both sides, printed with 9 significant digits (half a unit in the
# last: 5e-9 relative). Every other check is bounded by torch_reference.rounding_bound.
TOL_LR = 1e-8
TOKENS = 10_000
DATA_SEED = 20240
STEP1_LR = 1e-3
TRAJ_STEPS, TRAJ_LR, TRAJ_WARMUP = 20, 1e-3, 5
TIMEOUT_S = 600
OPSETS = (13, 14, 17)


@dataclass
class Case:
    """A model to check: the committed one (export None) or a torch export with these switches."""
    name: str
    export: Optional[dict] = None
    trajectory: bool = False

    def export_argv(self, path):
        e = self.export
        argv = ["-o", path, "--tied" if e["tied"] else "--untied"]
        for flag in ("opset", "gelu", "layernorm", "linear", "mask", "scale",
                     "layers", "hidden", "heads", "seq", "vocab", "batch"):
            argv += [f"--{flag}", str(e[flag])]
        return argv


def export_case(name, opset, tied, gelu, layernorm, linear, mask, scale, layers=2, hidden=32, heads=2,
                seq=16, vocab=64, batch=2, trajectory=False):
    return Case(name, dict(opset=opset, tied=tied, gelu=gelu, layernorm=layernorm, linear=linear, mask=mask,
                           scale=scale, layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                           batch=batch), trajectory)


# Every opset and every switch value at least once (uncovered() checks); 20-step trajectories on
# the committed model, two untied exports and a tied one.
CASES = [
    Case("committed-gpt-tiny", None, trajectory=True),
    export_case("o13-untied-tanh-manual-gemm-buffer-mul", 13, False, "tanh", "manual", "gemm", "buffer", "mul",
                hidden=32, heads=2, seq=16, vocab=64, trajectory=True),
    export_case("o14-tied-erf-module-gemm-trilu-div", 14, True, "erf", "module", "gemm", "trilu", "div",
                hidden=48, heads=3, seq=32, vocab=96),
    export_case("o14-untied-erf-manual-matmul-buffer-div", 14, False, "erf", "manual", "matmul", "buffer", "div",
                hidden=32, heads=4, seq=24, vocab=128),
    export_case("o17-untied-erf-module-matmul-trilu-mul", 17, False, "erf", "module", "matmul", "trilu", "mul",
                hidden=64, heads=4, seq=32, vocab=128, trajectory=True),
    export_case("o17-tied-tanh-manual-gemm-buffer-div", 17, True, "tanh", "manual", "gemm", "buffer", "div",
                hidden=64, heads=2, seq=16, vocab=64, trajectory=True),
]


SWITCHES = {"opset": OPSETS, "tied": (True, False), "gelu": GELU_FORMS,
            "layernorm": LAYERNORM_FORMS, "linear": LINEAR_FORMS, "mask": MASK_FORMS, "scale": SCALE_FORMS}


def uncovered(cases):
    """(switch, value) pairs that no export case has."""
    have = {(k, c.export[k]) for c in cases if c.export for k in SWITCHES}
    return sorted({(k, v) for k, values in SWITCHES.items() for v in values} - have, key=str)


class Results:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def report(self, name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok


def last_line(proc):
    text = (proc.stderr or "").strip() or (proc.stdout or "").strip() or "(no output)"
    return text.splitlines()[-1]


def run(cmd, timeout=TIMEOUT_S):
    """Run a command; returns (CompletedProcess, None) or (None or proc, error message)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s: {' '.join(cmd)}"
    except OSError as e:
        return None, f"cannot run {cmd[0]}: {e}"
    if proc.returncode != 0:
        return proc, f"{os.path.basename(cmd[0])} exited {proc.returncode}: {last_line(proc)}"
    return proc, None


def fresh_dir(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def load_dumped(path, shape):
    """A dumped .npy: float32 of the given shape, or raise ValueError."""
    if not os.path.isfile(path):
        raise ValueError(f"{os.path.basename(path)} missing")
    try:
        a = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{os.path.basename(path)} is not a readable .npy: {e}") from None
    if a.dtype != np.float32:
        raise ValueError(f"{os.path.basename(path)} is {a.dtype}, want float32")
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{os.path.basename(path)} has shape {tuple(a.shape)}, want {tuple(shape)}")
    return a


def name_differences(kind, have, want):
    """'' if the file names equal the parameter names, else what is missing and extra."""
    missing, extra = sorted(want - have), sorted(have - want)

    def some(names):
        return ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")

    parts = ([f"{kind} files missing for {some(missing)}"] if missing else []) + \
            ([f"{kind} files for non-parameters {some(extra)}"] if extra else [])
    return "; ".join(parts)


def npy_names(directory):
    if not os.path.isdir(directory):
        return set()
    return {f[:-4] for f in os.listdir(directory) if f.endswith(".npy")}


class ModelCheck:
    """All the checks of one model."""

    def __init__(self, case, args, results):
        self.case, self.args, self.results = case, args, results
        self.dir = fresh_dir(os.path.join(args.workdir, case.name))
        self.name = case.name

    def check(self, what, ok, detail):
        return self.results.report(f"{self.name} {what}", ok, detail)

    def fail(self, what, detail):
        return self.check(what, False, detail)

    # -- setup -------------------------------------------------------------------------------------

    def export_model(self):
        """The model to check and its facts: the committed one, or an export into self.dir."""
        if self.case.export is None:
            return COMMITTED_MODEL, ref.read_facts(COMMITTED_MODEL)
        path = os.path.join(self.dir, "model.onnx")
        export_gpt.main(self.case.export_argv(path))
        return path, ref.read_facts(path)

    def compile_flags(self):
        """sp-compile flags beyond the model and -o."""
        return []

    def prepare(self):
        """Export (or take the committed model), write tokens, compile. Returns an error or None."""
        self.onnx_path, self.facts = self.export_model()
        self.batch, self.seq, self.vocab = self.facts["batch"], self.facts["seq"], self.facts["vocab"]
        self.data = os.path.join(self.dir, "tokens.bin")
        self.tokens = self.write_tokens()
        self.plan = os.path.join(self.dir, "plan")
        shutil.rmtree(self.plan, ignore_errors=True)
        _, error = run([self.args.sp_compile, self.onnx_path, "-o", self.plan, "--quiet",
                        *self.compile_flags()])
        if error:
            return error
        with open(os.path.join(self.plan, "manifest.json")) as f:
            model = json.load(f).get("model", {})
        wrong = [f"{k} {model.get(k)!r} != {self.facts[k]!r}" for k in ("batch", "seq", "vocab", "tied")
                 if model.get(k) != self.facts[k]]
        return f"plan manifest: {'; '.join(wrong)}" if wrong else None

    def sp_run(self, dump, steps, lr, warmup=0, extra=()):
        fresh_dir(dump)
        cmd = [self.args.sp_run, self.plan, "--data", self.data, "--steps", str(steps), "--dropout", "0",
               "--lr", repr(lr), "--warmup", str(warmup), "--threads", str(self.args.threads),
               "--log-dir", os.path.join(dump, "log"), "--dump", dump, *self.run_flags(), *extra]
        start = time.perf_counter()
        _, error = run(cmd)
        return error, time.perf_counter() - start

    def write_tokens(self):
        """Write self.data; returns its tokens."""
        return ref.write_tokens(self.data, TOKENS, self.vocab, DATA_SEED)

    def run_flags(self):
        """sp-run flags beyond the data, steps, schedule and dumps."""
        return []

    def get_batch(self, k):
        """(x, y) of 0-based batch k, x as eval_logits and loss_and_grads take it."""
        return ref.get_batch(self.tokens, k, self.batch, self.seq)

    def reference(self, dtype):
        return ref.reference_model(self.onnx_path, dropout=0.0, dtype=dtype, facts=self.facts)

    def eval_logits(self, model, x):
        return ref.eval_logits(model, x)

    def loss_and_grads(self, model, x, y):
        return ref.loss_and_grads(model, x, y)

    def grad_error(self, actual, expected, grads64):
        """The error of one gradient (grads64: every float64 gradient, for scales)."""
        return ref.rel_err(actual, expected)

    def grad_note(self, names, grads64):
        """What the grads line adds about how errors were measured."""
        return ""

    def train_reference(self, model):
        """The torch side of the 20-step trajectory: [(loss, lr)] per step."""
        return ref.train(model, self.tokens, self.batch, self.seq, TRAJ_STEPS, TRAJ_LR, warmup=TRAJ_WARMUP)

    # -- step 1: logits, loss, gradients --------------------------------------------------------------

    def check_step1(self):
        dump = os.path.join(self.dir, "step1")
        error, seconds = self.sp_run(dump, steps=1, lr=STEP1_LR)
        if error:
            for what in ("logits", "loss", "grad_norm", "grads"):
                self.fail(what, error)
            return
        x, y = self.get_batch(0)
        m32, m64 = self.reference(torch.float32), self.reference(torch.float64)
        names = [n for n, _ in m32.named_parameters()]
        shapes = {n: tuple(p.shape) for n, p in m32.named_parameters()}
        logits32, logits64 = self.eval_logits(m32, x), self.eval_logits(m64, x)
        loss32, grads32 = self.loss_and_grads(m32, x, y)
        loss64, grads64 = self.loss_and_grads(m64, x, y)

        # logits
        try:
            logits = load_dumped(os.path.join(dump, "logits.npy"), logits32.shape)
            err = ref.rel_err(logits, logits32)
            noise = ref.rel_err(logits32, logits64)
            self.check("logits", err <= ref.rounding_bound(noise),
                       f"max|sp-torch|/max|torch| = {err:.2e} (tol {ref.rounding_bound(noise):.2g}; "
                       f"torch f32 vs f64 {noise:.2e}; shape {list(logits32.shape)})")
        except (ValueError, OSError) as e:
            self.fail("logits", str(e))

        # loss of step 1
        try:
            rows = ref.read_loss_csv(os.path.join(dump, "loss.csv"))
            if len(rows) != 1 or rows[0][0] != 1:
                raise ValueError(f"loss.csv has steps {[r[0] for r in rows]}, want [1]")
            err = abs(rows[0][1] - loss32) / abs(loss32)
            noise = abs(loss32 - loss64) / abs(loss64)
            self.check("loss", err <= ref.rounding_bound(noise),
                       f"sp {rows[0][1]:.8f} torch {loss32:.8f}: |sp-torch|/|torch| = {err:.2e} "
                       f"(tol {ref.rounding_bound(noise):.2g}; torch f32 vs f64 {noise:.2e})")
        except (ValueError, OSError) as e:
            self.fail("loss", str(e))

        # the gradient norm of step 1 (the whole model's, before clipping)
        try:
            rows = ref.read_loss_csv(os.path.join(dump, "loss.csv"))
            if not rows or rows[0][3] is None:
                raise ValueError("loss.csv has no grad_norm at step 1")
            def global_norm(grads):
                return math.sqrt(sum(float(np.sum(np.asarray(g, np.float64) ** 2))
                                     for g in grads.values()))
            norm32, norm64 = global_norm(grads32), global_norm(grads64)
            err = abs(rows[0][3] - norm32) / norm32
            noise = abs(norm32 - norm64) / norm64
            self.check("grad_norm", err <= ref.rounding_bound(noise),
                       f"sp {rows[0][3]:.8f} torch {norm32:.8f}: |sp-torch|/|torch| = {err:.2e} "
                       f"(tol {ref.rounding_bound(noise):.2g}; torch f32 vs f64 {noise:.2e})")
        except (ValueError, OSError) as e:
            self.fail("grad_norm", str(e))

        # gradients: exactly the parameters, each within tolerance
        grad_dir = os.path.join(dump, "grads")
        have = npy_names(grad_dir)
        problems = []
        if have != set(names):
            problems.append(name_differences("grad", have, set(names)))
        errs, noises = {}, {}
        for n in names:
            noises[n] = self.grad_error(grads32[n], grads64[n], grads64)
            if n not in have:
                continue
            try:
                errs[n] = self.grad_error(load_dumped(os.path.join(grad_dir, n + ".npy"), shapes[n]),
                                          grads32[n], grads64)
            except (ValueError, OSError) as e:
                problems.append(str(e))
        # Each gradient against its own float32 rounding: the share of its bound it uses.
        used = {n: e / ref.rounding_bound(noises[n]) for n, e in errs.items()}
        bad = [n for n in errs if used[n] > 1]
        if bad:
            ranked = sorted(bad, key=lambda n: -used[n])
            problems.append(f"{len(bad)} over tolerance: " + ", ".join(
                f"{n} {errs[n]:.2e} (tol {ref.rounding_bound(noises[n]):.2g})" for n in ranked[:6])
                            + (", ..." if len(ranked) > 6 else ""))
        worst = max(used, key=used.get) if used else None
        summary = (f"{len(errs)}/{len(names)} params, closest to its tol: {worst} max|sp-torch|/max|torch| = "
                   f"{errs[worst]:.2e} (tol {ref.rounding_bound(noises[worst]):.2g})" if worst
                   else "no gradients compared")
        self.check("grads", not problems,
                   f"{summary} (each within 8 x its torch f32 vs f64, worst {max(noises.values()):.2e}"
                   f"{'; tied: the embedding includes the head' if self.facts['tied'] else ''}"
                   f"{self.grad_note(names, grads64)})"
                   + (f"; {'; '.join(problems)}" if problems else ""))
        self.step1_seconds = seconds

    # -- 20-step trajectory ---------------------------------------------------------------------------

    def check_trajectory(self):
        dump = os.path.join(self.dir, "steps20")
        error, seconds = self.sp_run(dump, steps=TRAJ_STEPS, lr=TRAJ_LR, warmup=TRAJ_WARMUP)
        if error:
            for what in ("trajectory", "lr", "weights"):
                self.fail(what, error)
            return
        histories, finals = {}, {}
        for dtype in (torch.float32, torch.float64):
            model = self.reference(dtype)
            histories[dtype] = self.train_reference(model)
            finals[dtype] = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        torch_losses = np.array([h[0] for h in histories[torch.float32]])
        torch64_losses = np.array([h[0] for h in histories[torch.float64]])
        schedule = np.array([h[1] for h in histories[torch.float32]])
        try:
            rows = ref.read_loss_csv(os.path.join(dump, "loss.csv"))
        except (ValueError, OSError) as e:
            self.fail("trajectory", str(e))
            self.fail("lr", str(e))
            rows = None
        if rows is not None and [r[0] for r in rows] != list(range(1, TRAJ_STEPS + 1)):
            msg = f"loss.csv has steps {[r[0] for r in rows]}, want 1..{TRAJ_STEPS}"
            self.fail("trajectory", msg)
            self.fail("lr", msg)
            rows = None
        if rows is not None:
            sp_losses = np.array([r[1] for r in rows])
            rel = np.abs(sp_losses - torch_losses) / np.abs(torch_losses)
            t = int(np.argmax(rel))
            noise = float(np.max(np.abs(torch_losses - torch64_losses) / np.abs(torch64_losses)))
            self.check("trajectory", float(rel.max()) <= ref.rounding_bound(noise),
                       f"{TRAJ_STEPS} steps lr {TRAJ_LR:g} warmup {TRAJ_WARMUP}: max_t |sp-torch|/|torch| = "
                       f"{rel.max():.2e} at step {t + 1} (max abs {np.abs(sp_losses - torch_losses).max():.2e}; "
                       f"tol {ref.rounding_bound(noise):.2g} relative; torch f32 vs f64 {noise:.2e}; "
                       f"loss {torch_losses[0]:.4f} -> {torch_losses[-1]:.4f}; sp-run {seconds:.2f} s)")
            sp_lrs = np.array([r[2] for r in rows])
            lr_rel = np.abs(sp_lrs - schedule) / schedule
            self.check("lr", float(lr_rel.max()) <= TOL_LR,
                       f"loss.csv lr column vs the schedule: max rel {lr_rel.max():.2e} (tol {TOL_LR:g}; "
                       f"steps 1,5,6,20: {', '.join(f'{sp_lrs[i]:.4g}' for i in (0, 4, 5, TRAJ_STEPS - 1))})")
        # final weights: exactly the parameters, and all of them together close to torch's
        weight_dir = os.path.join(dump, "weights")
        f32, f64 = finals[torch.float32], finals[torch.float64]
        names = list(f32)
        have = npy_names(weight_dir)
        problems = []
        if have != set(names):
            problems.append(name_differences("weight", have, set(names)))
        weights = {}
        for n in names:
            if n in have:
                try:
                    weights[n] = load_dumped(os.path.join(weight_dir, n + ".npy"), f32[n].shape)
                except (ValueError, OSError) as e:
                    problems.append(str(e))
        err, tol = float("inf"), 0.0
        if weights and not problems:
            err = ref.global_rel_l2(weights, f32)
            tol = ref.rounding_bound(ref.global_rel_l2(f32, f64))
            worst = max(weights, key=lambda n: ref.rel_err(weights[n], f32[n]))
            detail = (f"after {TRAJ_STEPS} steps, all {len(names)} params: ||sp-torch||/||torch|| = {err:.2e} "
                      f"(tol {tol:.2g}; torch f32 vs f64 {ref.global_rel_l2(f32, f64):.2e}; worst single "
                      f"max|sp-torch|/max|torch| {ref.rel_err(weights[worst], f32[worst]):.1e} ({worst}), "
                      f"not checked: Adam amplifies rounding where a gradient is ~0)")
        else:
            detail = f"{len(weights)}/{len(names)} weight files read"
        self.check("weights", not problems and err <= tol,
                   detail + (f"; {'; '.join(problems)}" if problems else ""))

    # -- bad data (committed model only) --------------------------------------------------------------

    def check_bad_data(self):
        short = os.path.join(self.dir, "short.bin")
        self.tokens[:self.seq].tofile(short)  # S tokens: one fewer than a single row needs
        self.expect_rejection("rejects-short-data", short, f"{self.seq} tokens (< S + 1)",
                              ["short.bin", "token"], "names neither the file nor tokens")
        position = 4321
        bad = self.tokens.copy()
        bad[position] = self.vocab  # the first id that is out of range
        path = os.path.join(self.dir, "bad-token.bin")
        bad.tofile(path)
        self.expect_rejection("rejects-bad-token", path, f"id {self.vocab} at token {position}",
                              [str(position), str(2 * position)],  # the token index or the byte offset
                              f"does not name position {position}")

    def expect_rejection(self, what, data, describe, any_of, otherwise):
        """sp-run on a bad token file exits with an error whose message holds one of `any_of`."""
        proc, error = run([self.args.sp_run, self.plan, "--data", data, "--steps", "1",
                           "--threads", str(self.args.threads), "--log-dir", os.path.join(self.dir, "bad-log")])
        rejected = proc is not None and proc.returncode > 0
        text = ((proc.stderr or "") + (proc.stdout or "")).lower() if proc else ""
        relevant = any(word.lower() in text for word in any_of)
        self.check(what, rejected and relevant,
                   f"{describe}: " +
                   (f"exit {proc.returncode}: {last_line(proc)}" if rejected else (error or "sp-run exited 0")) +
                   ("" if relevant or not rejected else f" (the message {otherwise})"))

    def run_all(self):
        try:
            error = self.prepare()
        except Exception:  # noqa: BLE001  an export failure is a test failure, not a crash
            error = f"setup failed: {traceback.format_exc(limit=2).strip().splitlines()[-1]}"
        if error:
            self.fail("compile", error)
            return
        source = "export" if self.case.export else os.path.relpath(self.onnx_path, ref.REPO_ROOT)
        f = self.facts
        self.check("compile", True,
                   f"{source} -> plan (L {f['layers']} h {f['hidden']} heads {f['heads']} s {self.seq} "
                   f"v {self.vocab} b {self.batch}, {'tied' if f['tied'] else 'untied'}, opset {f['opset']})")
        stages = [("step1", self.check_step1)]
        if self.case.trajectory:
            stages.append(("trajectory", self.check_trajectory))
        if self.case.export is None:
            stages.append(("bad-data", self.check_bad_data))
        for name, stage in stages:
            try:
                stage()
            except Exception:  # noqa: BLE001  report and go on with the other checks
                self.fail(name, f"the check crashed: {traceback.format_exc(limit=3).strip().splitlines()[-1]}")


def executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sp-bin", required=True, help="directory holding sp-compile and sp-run")
    p.add_argument("--workdir", required=True, help="directory for models, plans and dumps (created if missing)")
    p.add_argument("--threads", type=int, default=2, help="sp-run --threads and torch threads (default 2)")
    p.add_argument("--only", help="run only the cases whose name contains this string")
    args = p.parse_args(argv)
    args.sp_compile = os.path.abspath(os.path.join(args.sp_bin, "sp-compile"))
    args.sp_run = os.path.abspath(os.path.join(args.sp_bin, "sp-run"))
    for tool in (args.sp_compile, args.sp_run):
        if not executable(tool):
            p.exit(2, f"error: {tool} not found or not executable: build it first, or pass the build's bin/ "
                      "directory as --sp-bin\n")
    return args


def main(argv=None):
    args = parse_args(argv)
    if uncovered(CASES):
        sys.exit(f"error: the test matrix misses {uncovered(CASES)}")
    torch.set_num_threads(args.threads)
    os.makedirs(args.workdir, exist_ok=True)
    results = Results()
    start = time.perf_counter()
    for case in CASES:
        if args.only and args.only not in case.name:
            continue
        ModelCheck(case, args, results).run_all()
    print(f"({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"{results.passed} passed, {results.failed} failed")
    sys.exit(1 if results.failed else 0)


if __name__ == "__main__":
    main()
