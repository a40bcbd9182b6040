#!/usr/bin/python3
"""Runs the bad-input catalogue: every case under tests/bad-inputs/cases.

  run_bad_inputs.py --bin BUILD/bin --workdir DIR [--filter TEXT] [-v]

Each case (cases/<tool>/<name>.case, see README.md) runs one command that
must be refused. It passes when the command
  - exits with status 1 (not 0, not another code, not a signal),
  - prints as the first line of its stderr exactly the case's 'error:' line
    (after the placeholders are replaced by their paths; @INT@, @HEX@ and
    @ANY@ stand for any integer, any 0x hex number and any text),
  - prints nothing that means a crash (a stack dump, 'terminate called', an
    assertion, a sanitizer report), and
  - writes nothing: its temporary folder (its working directory), the shared
    fixtures, the committed inputs and the models folder are as they were
    before it ran (no new file or folder, no hidden .tmp-* leftover, no file
    changed or removed).
A case with a 'known-bug:' line documents a bug not fixed yet: it is run and
reported, and fails the test only once it passes (drop the line then). The
fixtures (bad ONNX models from make_models.py, a plan of gpt-tiny, a token
file, a checkpoint) are made once in DIR/fixtures. Prints one summary line
and, for every case that failed, what was wrong; exits 1 if any did.
Needs /usr/bin/python3 (numpy and onnx for make_models.py).
"""
import argparse
import hashlib
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CASES = os.path.join(HERE, "cases")
INPUTS = os.path.join(HERE, "inputs")
MODELS = os.path.join(REPO, "models")

# Output that means the tool crashed or hit a bug rather than refusing input.
CRASH_MARKERS = ["Stack dump", "PLEASE submit a bug report", "terminate called",
                 "Assertion", "assertion failed", "AddressSanitizer",
                 "UndefinedBehaviorSanitizer", "runtime error:", "Segmentation fault",
                 "Aborted", "core dumped"]
CASE_TIMEOUT_S = 300  # only a guard against a hang; cases take well under a second


class Case:
    def __init__(self, path):
        self.path = path
        self.tool = os.path.basename(os.path.dirname(path))
        self.name = self.tool + "/" + os.path.basename(path)[:-len(".case")]
        self.description = ""
        self.setup, self.run, self.error = [], None, None
        self.skip_as_root, self.known_bug = None, None
        with open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                if line.startswith("#"):
                    if not self.description:
                        self.description = line.lstrip("# ")
                    continue
                key, sep, value = line.partition(":")
                value = value.strip()
                keys = ("setup", "run", "error", "skip-as-root", "known-bug")
                if not sep or key not in keys:
                    raise SystemExit(f"{path}:{number}: expected one of "
                                     f"{', '.join(k + ':' for k in keys)} got {line!r}")
                if key == "setup":
                    self.setup.append(value)
                elif key == "skip-as-root":
                    self.skip_as_root = value
                elif key == "known-bug":
                    self.known_bug = value
                elif getattr(self, key) is not None:
                    raise SystemExit(f"{path}:{number}: a second '{key}:' line")
                else:
                    setattr(self, key, value)
        if not self.run or not self.error:
            raise SystemExit(f"{path}: a case needs one 'run:' and one 'error:' line")
        if not shlex.split(self.run)[0].startswith("@BIN@/" + self.tool):
            raise SystemExit(f"{path}: 'run:' must start with @BIN@/{self.tool}")


# Wildcards of an 'error:' line, for what follows from the plan's layout or
# the build rather than from the bad input: numbers (arena sizes, buffer
# numbers, byte offsets), fingerprints, and lists that grow (the supported
# ops, the registered passes).
WILDCARDS = {"@INT@": "-?[0-9]+", "@HEX@": "0x[0-9a-f]+", "@ANY@": ".*"}


def line_matches(expected, line):
    """expected (placeholders replaced) equals line, wildcards aside."""
    if not any(w in expected for w in WILDCARDS):
        return expected == line
    pattern = re.escape(expected)
    for wildcard, regex in WILDCARDS.items():
        pattern = pattern.replace(re.escape(wildcard), regex)
    return re.fullmatch(pattern, line) is not None


def substitute(text, places, quote):
    for key, value in places.items():
        text = text.replace("@" + key + "@", shlex.quote(value) if quote else value)
    return text


def snapshot(root, hash_files):
    """Every entry under root: kind, size, mtime and (hash_files) content."""
    state = {}
    if not os.path.exists(root):
        return state
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                state[rel] = ("dir",)
            elif stat.S_ISREG(st.st_mode):
                digest = ""
                if hash_files:
                    with open(path, "rb") as f:
                        digest = hashlib.sha1(f.read()).hexdigest()
                state[rel] = ("file", st.st_size, st.st_mtime_ns, digest)
            else:
                state[rel] = ("other", st.st_mode)
    return state


def compare(before, after, label):
    problems = []
    for rel in sorted(set(after) - set(before)):
        problems.append(f"wrote {label}/{rel}")
    for rel in sorted(set(before) - set(after)):
        problems.append(f"removed {label}/{rel}")
    for rel in sorted(set(before) & set(after)):
        if before[rel] != after[rel]:
            problems.append(f"changed {label}/{rel}")
    return problems


def run_checked(cmd, what, **kw):
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"bad-inputs: making the fixtures failed at {what}: "
                         f"{' '.join(cmd)}\n{r.stdout}{r.stderr}")


def make_fixtures(fix, bindir):
    """The shared inputs the cases read (never write)."""
    os.makedirs(fix)
    run_checked([sys.executable, os.path.join(HERE, "make_models.py"),
                 os.path.join(fix, "models"), "--models", MODELS], "make_models.py")
    run_checked([os.path.join(bindir, "sp-compile"), os.path.join(MODELS, "tiny", "gpt-tiny.onnx"),
                 "-o", os.path.join(fix, "plan"), "--quiet"], "the gpt-tiny plan")
    run_checked([os.path.join(bindir, "sp-tokenize"),
                 os.path.join(MODELS, "data", "python-reference.txt"),
                 "-o", os.path.join(fix, "data.bin"), "--quiet"], "the token file")
    # A checkpoint at step 2 of the plan; the plan folder stays as compiled.
    run_checked([os.path.join(bindir, "sp-run"), os.path.join(fix, "plan"),
                 "--data", os.path.join(fix, "data.bin"), "--steps", "2",
                 "--checkpoint-every", "2", "--checkpoint", os.path.join(fix, "ck"),
                 "--log-dir", os.path.join(fix, "ck-log")], "the checkpoint")
    # A plan whose parameters' data was never written (a weight-free graph).
    run_checked([os.path.join(bindir, "sp-compile"),
                 os.path.join(fix, "models", "gpt-1layer.onnx"),
                 "-o", os.path.join(fix, "plan-noweights"), "--quiet"], "the weight-free plan")


def run_case(case, places, watched, verbose):
    """Returns a list of problems (empty: the case passed)."""
    tmp = places["TMP"]
    os.makedirs(tmp)
    for command in case.setup:
        r = subprocess.run(substitute(command, places, quote=True), shell=True, cwd=tmp,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if r.returncode != 0:
            return [f"setup failed (status {r.returncode}): {command}\n"
                    f"      {(r.stdout + r.stderr).strip()}"]
    before = {label: snapshot(root, label == "@TMP@") for label, root in watched.items()}
    argv = [substitute(a, places, quote=False) for a in shlex.split(case.run)]
    env = dict(os.environ, CI="true")
    try:
        r = subprocess.run(argv, cwd=tmp, stdin=subprocess.DEVNULL, capture_output=True,
                           env=env, timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [f"did not finish in {CASE_TIMEOUT_S} s (a hang?)"]
    stderr = r.stderr.decode("utf-8", "replace")
    stdout = r.stdout.decode("utf-8", "replace")
    first = stderr.split("\n", 1)[0]
    expected = substitute(case.error, places, quote=False)
    problems = []
    if r.returncode < 0:
        problems.append(f"killed by signal {-r.returncode}")
    elif r.returncode != 1:
        problems.append(f"exit status {r.returncode}, expected 1")
    if not line_matches(expected, first):
        problems.append(f"first stderr line differs\n      expected: {expected}\n"
                        f"      got:      {first}")
    for marker in CRASH_MARKERS:
        if marker in stderr or marker in stdout:
            problems.append(f"output contains {marker!r}")
            break
    for label, root in watched.items():
        problems += compare(before[label], snapshot(root, label == "@TMP@"), label)
    if verbose:
        print(f"  {case.name}: status {r.returncode}: {first}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the folder of sp-compile, sp-run, ...")
    ap.add_argument("--workdir", required=True, help="scratch folder (emptied first)")
    ap.add_argument("--filter", default="", help="run only cases whose name contains this")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case's line")
    args = ap.parse_args()
    bindir = os.path.abspath(args.bin)
    work = os.path.abspath(args.workdir)

    cases = []
    for tool in sorted(os.listdir(CASES)):
        for name in sorted(os.listdir(os.path.join(CASES, tool))):
            if name.endswith(".case"):
                cases.append(Case(os.path.join(CASES, tool, name)))
    cases = [c for c in cases if args.filter in c.name]

    shutil.rmtree(work, ignore_errors=True)
    fix = os.path.join(work, "fixtures")
    make_fixtures(fix, bindir)
    watched = {"@FIX@": fix, "@INPUTS@": INPUTS, "@MODELS@": MODELS}
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0

    failed, skipped, known, per_tool = [], [], [], {}
    for case in cases:
        per_tool[case.tool] = per_tool.get(case.tool, 0) + 1
        if case.skip_as_root and is_root:
            skipped.append(case)
            continue
        tmp = os.path.join(work, "cases", case.name)
        places = {"BIN": bindir, "TMP": tmp, "FIX": fix, "INPUTS": INPUTS,
                  "MODELS": MODELS, "PYTHON": sys.executable}
        problems = run_case(case, places, dict(watched, **{"@TMP@": tmp}), args.verbose)
        if case.known_bug and problems:
            known.append((case, problems))
        elif case.known_bug:
            failed.append((case, ["passes now: the known bug is fixed; remove its "
                                  "'known-bug:' line"]))
        elif problems:
            failed.append((case, problems))

    ok = len(cases) - len(failed) - len(skipped) - len(known)
    tools = ", ".join(f"{n} {t}" for t, n in sorted(per_tool.items()))
    summary = f"{len(cases)} bad-input cases ({tools}): {ok} ok"
    if known:
        summary += f", {len(known)} known bugs"
    if skipped:
        summary += f", {len(skipped)} skipped as root"
    if failed:
        summary += f", {len(failed)} failed"
    print(summary)
    for case, problems in known:
        print(f"known bug {case.name}: {case.known_bug}")
        if args.verbose:
            for p in problems:
                print(f"    {p}")
    for case, problems in failed:
        print(f"FAIL {case.name} ({os.path.relpath(case.path, REPO)}): {case.description}")
        for p in problems:
            print(f"    {p}")
    return 1 if failed or not cases else 0


if __name__ == "__main__":
    sys.exit(main())
