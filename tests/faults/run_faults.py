#!/usr/bin/env python3
"""Fault tests of sp-run (docs/reliability.md): kill -9 and resume, signals
and --checkpoint-on-exit, dead and stopped MPI ranks, directory locks, a full
disk and an unwritable directory.

    run_faults.py --sp-bin build/bin --workdir DIR --test NAME [--mpiexec mpirun]

NAME is one of:
  kill-resume   kill -9 at 12 moments per layout (one device, t = 2 + SP on
                thread ranks, p = 2 with 2 microbatches), half of them while a
                checkpoint is being written (SP_TEST_CHECKPOINT_DELAY_MS slows
                the writer down), resuming after each: the final checkpoint
                (every rank's data file) and loss.csv (all but its timings)
                are byte for byte those of an uninterrupted run, and every loss a killed run logged
                equals the uninterrupted run's at that step
  signals       SIGINT and SIGTERM (one device and thread ranks): exit 130 or
                143 with one line, the logs written; --checkpoint-on-exit
                saves the last step, and resuming from it reproduces an
                uninterrupted run; a signal during a checkpoint write lets it
                commit; a second signal exits at once and leaves the last
                checkpoint whole
  mpi           (needs mpirun) kill -9 of one of 4 sp-run ranks and SIGSTOP of
                one with --comm-timeout 3: every rank exits non-zero (the
                seconds are printed); SIGTERM to every rank of an MPI run with
                --checkpoint-on-exit (they agree on the step) and through
                mpirun; SIGTERM while a rank is stopped (the others leave the
                blocked collective within the 10 s grace); a checkpoint written
                by 4 MPI processes resumes on thread ranks bit for bit
  locks         a second run on a checkpoint or log directory in use is
                refused naming it; after kill -9 of the holder the directory
                is free (the kernel drops the lock)
  disk          an unwritable directory (a path through a regular file) and a
                full disk (RLIMIT_FSIZE: EFBIG; and a 2 MiB tmpfs, ENOSPC,
                where mounting is allowed) end the run with one error line
                naming the reason, and the last checkpoint stays whole and
                resumes bit for bit

Nothing here asserts a time except the issue's bound: after SIGSTOP with
--comm-timeout 3 every other rank is gone within 3 + 30 s. Runs that could hang
are bounded by generous timeouts (a hang fails the test).
"""
import argparse
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

ARGS = None
FAILURES = []


def log(msg):
    print(msg, flush=True)


def check(cond, msg):
    if cond:
        return True
    FAILURES.append(msg)
    log("FAIL: " + msg)
    return False


def sp(tool):
    return os.path.join(ARGS.sp_bin, tool)


def stacks(pid):
    """Every thread's state (D: waiting on the disk) and stack (gdb, when
    installed) of process pid: what a hung run was waiting for."""
    states = []
    try:
        for tid in sorted(os.listdir("/proc/%d/task" % pid)):
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
    except OSError:
        pass
    head = "thread states: %s" % " ".join(states)
    if not shutil.which("gdb"):
        return head + " (no gdb to show the stacks)"
    r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex",
                        "thread apply all bt 30"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                       text=True, timeout=120)
    return "\n".join([head] + [l for l in r.stdout.splitlines()
                               if l.startswith(("Thread ", "#"))])


def run(cmd, timeout=120, env=None, preexec_fn=None):
    """Runs cmd to completion; returns (rc, stdout, stderr). A run still
    going after timeout seconds is a hang: its threads' stacks are logged,
    then it is killed and the test fails."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=env,
                         preexec_fn=preexec_fn, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        log("HANG: still running after %d s: %s\n%s" %
            (timeout, " ".join(cmd), stacks(p.pid)))
        p.kill()
        out, err = p.communicate()
        raise RuntimeError("timed out after %d s: %s\n%s%s" %
                           (timeout, " ".join(cmd), out, err))
    return p.returncode, out, err


def must(cmd, timeout=120, env=None):
    rc, out, err = run(cmd, timeout=timeout, env=env)
    if rc != 0:
        raise RuntimeError("command failed (%d): %s\n%s%s" %
                           (rc, " ".join(cmd), out, err))
    return out, err


class Proc:
    """A background sp-run (or mpirun) whose stderr lines are collected."""

    def __init__(self, cmd, env=None, new_session=False):
        self.cmd = cmd
        self.lines = []
        self.lock = threading.Lock()
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, env=env,
                                  text=True, start_new_session=new_session)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stderr:
            with self.lock:
                self.lines.append(line.rstrip("\n"))

    def text(self):
        with self.lock:
            return list(self.lines)

    def last_step(self):
        """The last step its progress lines reported (0 if none)."""
        for line in reversed(self.text()):
            m = re.match(r"step (\d+)/", line)
            if m:
                return int(m.group(1))
        return 0

    def wait_for_step(self, step, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            if self.last_step() >= step:
                return True
            if self.p.poll() is not None:
                return False
            time.sleep(0.01)
        return False

    def wait(self, timeout):
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log("HANG: still running after %d s: %s\n%s" %
                (timeout, " ".join(self.cmd), stacks(self.p.pid)))
            self.p.kill()
            self.p.wait()
            rc = None
        self.reader.join(timeout=5)
        return rc


# ---------------------------------------------------------------------------
# Setup: data and plans


# Made anew on every run (both take well under a second): a plan or data file
# left in the work directory by an older build would test that build's
# format, or be refused by this one.
def setup():
    os.makedirs(ARGS.workdir, exist_ok=True)
    data = os.path.join(ARGS.workdir, "data.bin")
    must([sp("sp-tokenize"), os.path.join(ARGS.models, "data",
                                          "python-reference.txt"),
          "-o", data, "--quiet"])
    return data


def plan(name, *flags):
    path = os.path.join(ARGS.workdir, "plan-" + name)
    must([sp("sp-compile"), os.path.join(ARGS.models, "tiny",
                                         "gpt-tiny.onnx"),
          "-o", path, "--quiet"] + list(flags))
    return path


PLANS = {
    "one device": [],
    "t = 2 + SP (threads)": ["--tp", "2", "--sp"],
    "p = 2, 2 microbatches (threads)": ["--pp", "2", "--microbatches", "2"],
}


def fresh(*parts):
    path = os.path.join(ARGS.workdir, *parts)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


# ---------------------------------------------------------------------------
# Checkpoints as files


def index_of(ck):
    try:
        with open(os.path.join(ck, "checkpoint.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def named_files(ck):
    idx = index_of(ck)
    return set() if idx is None else {s["data"] for s in idx["shards"]}


def data_files(ck):
    try:
        return {f for f in os.listdir(ck)
                if f.startswith("tensors") and f.endswith(".bin")}
    except OSError:
        return set()


def shard_bytes(ck):
    """Every rank's data, in rank order."""
    idx = index_of(ck)
    out = []
    for s in idx["shards"]:
        with open(os.path.join(ck, s["data"]), "rb") as f:
            out.append(f.read())
    return out


def same_checkpoint(a, b, what):
    ia, ib = index_of(a), index_of(b)
    ok = check(ia is not None and ib is not None,
               "%s: a checkpoint is missing (%s, %s)" % (what, a, b))
    if not ok:
        return False
    for key in ("step", "seed", "plan_fingerprint", "ranks", "losses"):
        ok &= check(ia[key] == ib[key], "%s: checkpoint '%s' differs" %
                    (what, key))
    sa, sb = shard_bytes(a), shard_bytes(b)
    ok &= check(len(sa) == len(sb) and all(x == y for x, y in zip(sa, sb)),
                "%s: the checkpoint's tensor data differ" % what)
    return ok


def loss_rows(csv):
    """step -> the columns a rerun reproduces (loss, lr, grad_norm,
    val_loss), as text; the timings after them differ from run to run."""
    rows = {}
    try:
        with open(csv) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split(",")
                rows[int(fields[0])] = tuple(fields[1:5])
    except OSError:
        pass
    return rows


def read(path):
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------------------
# kill -9 and resume

EVERY = 5
KILLS = 12
# Kill k aims at checkpoint step EVERY * k; the run goes two checkpoints past
# the last one, so that a random kill after checkpoint EVERY * (KILLS - 1)
# (a sleep of up to one checkpoint interval) cannot come after the run ends.
# With STEPS = EVERY * KILLS it could, and then only KILLS - 1 kills landed.
STEPS = EVERY * (KILLS + 2)
DELAY_MS = 90


def kill_resume():
    data = setup()
    rng = random.Random(12)
    for layout, flags in PLANS.items():
        p = plan(re.sub(r"\W+", "-", layout).strip("-"), *flags)
        ref = fresh("kill", layout.split()[0] + "-ref" + str(len(flags)))
        base = [sp("sp-run"), p, "--data", data, "--steps", str(STEPS),
                "--checkpoint-every", str(EVERY), "--threads", "1"]
        t0 = time.time()
        must(base + ["--checkpoint", ref + "/ck", "--log-dir", ref + "/log"])
        ref_seconds = time.time() - t0
        ref_index = index_of(ref + "/ck")
        chain = fresh("kill", layout.split()[0] + "-chain" + str(len(flags)))
        ck, logdir = chain + "/ck", chain + "/log"
        env = dict(os.environ, SP_TEST_CHECKPOINT_DELAY_MS=str(DELAY_MS))
        phases = {}
        kills = 0
        snapshots = []
        attempt = 0
        interval = EVERY * ref_seconds / STEPS + DELAY_MS / 1000.0
        while kills < KILLS and attempt < 3 * KILLS:
            attempt += 1
            before = data_files(ck)
            resume = ["--resume"] if index_of(ck) else []
            proc = subprocess.Popen(base + ["--checkpoint", ck, "--log-dir",
                                             logdir] + resume,
                                    stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL, env=env)
            # Kill k aims at checkpoint step EVERY * (k + 1): the kills move
            # along the run. Even kills land inside that checkpoint's write
            # (its data file exists, the index does not name it yet: kill
            # within the writer's pauses); odd ones at a random moment after
            # the previous checkpoint committed.
            target = EVERY * (kills + 1)
            mid_write = kills % 2 == 0
            deadline = time.time() + 60
            while time.time() < deadline and proc.poll() is None:
                if mid_write:
                    if any(re.match(r"tensors-%d\b" % target, f) for f in
                           data_files(ck) - named_files(ck) - before):
                        time.sleep(rng.uniform(0, DELAY_MS * 1.1) / 1000)
                        break
                elif (index_of(ck) or {}).get("step", 0) >= target - EVERY:
                    time.sleep(rng.uniform(0, interval))
                    break
                time.sleep(0.002)
            if proc.poll() is not None:
                check(proc.returncode == 0, "%s: attempt %d exited %s" %
                      (layout, attempt, proc.returncode))
                break  # finished before the kill
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            # Where the kill landed, from what the writer left.
            named = named_files(ck)
            idx = index_of(ck)
            step = idx["step"] if idx else 0
            left = data_files(ck) - named - before
            tmp = [f for f in os.listdir(ck) if f.startswith(".checkpoint")] \
                if os.path.isdir(ck) else []
            later = [f for f in left
                     if int(re.match(r"tensors-(\d+)", f).group(1)) > step]
            def whole(f):
                m = re.search(r"-rank(\d+)", f)
                want = ref_index["shards"][int(m.group(1)) if m else 0]
                return os.path.getsize(os.path.join(ck, f)) == \
                    want["data_bytes"]
            if tmp:
                phase = "writing the index"
            elif later and not all(whole(f) for f in later):
                phase = "in the middle of a data file"
            elif later:
                phase = "data written, before the commit"
            elif left:
                phase = "after the commit, old files not yet removed"
            else:
                phase = "between checkpoints"
            phases[phase] = phases.get(phase, 0) + 1
            snapshots.append(loss_rows(logdir + "/loss.csv"))
            log("  %s: kill %d (%s) at checkpoint step %d: %s" %
                (layout, kills, "mid-write" if mid_write else "random", step,
                 phase))
        # To the end (also when the last kill came after the final
        # checkpoint: the resume then only writes the logs and cleans up).
        resume = ["--resume"] if index_of(ck) else []
        rc, out, err = run(base + ["--checkpoint", ck, "--log-dir", logdir] +
                           resume, timeout=300)
        check(rc == 0, "%s: the final resume failed: %s" % (layout, err[-500:]))
        same = same_checkpoint(ref + "/ck", ck, layout)
        csv_same = check(loss_rows(ref + "/log/loss.csv") ==
                         loss_rows(logdir + "/loss.csv"),
                         "%s: loss.csv differs from the uninterrupted run" %
                         layout)
        ref_rows = loss_rows(ref + "/log/loss.csv")
        overlap = 0
        for snap in snapshots:
            for s, row in snap.items():
                overlap += 1
                check(ref_rows.get(s) == row,
                      "%s: a killed run logged step %d as %s, the "
                      "uninterrupted run %s" % (layout, s, row,
                                                ref_rows.get(s)))
        check(sorted(os.listdir(ck)) == sorted([".sp-run.lock",
                                                "checkpoint.json"] +
                                               list(named_files(ck))),
              "%s: leftovers in the checkpoint directory: %s" %
              (layout, sorted(os.listdir(ck))))
        during = sum(n for k, n in phases.items()
                     if k != "between checkpoints")
        check(kills == KILLS, "%s: only %d kills landed" % (layout, kills))
        check(during >= 1, "%s: no kill landed during a checkpoint write" %
              layout)
        log("%s: %d kills (%s); final checkpoint and loss.csv %s the "
            "uninterrupted run's; %d logged losses of killed runs equal" %
            (layout, kills, ", ".join("%d %s" % (n, k) for k, n in
                                      sorted(phases.items())),
             "byte-identical to" if same and csv_same else "DIFFERENT from",
             overlap))


# ---------------------------------------------------------------------------
# Signals


def stop_line(lines):
    return next((l for l in reversed(lines) if l.startswith("sp-run:")), "")


def signals():
    data = setup()
    p1 = plan("one-device")
    p2 = plan("t-2-SP-threads", "--tp", "2", "--sp")
    # A constant learning rate (min-lr = lr): the schedule does not depend on
    # --steps, so a stopped run resumed to S + 5 steps can be compared with an
    # uninterrupted run of S + 5.
    const = ["--min-lr", "1e-3", "--threads", "1", "--data", data]

    # SIGINT, nothing to save: 130, one line, the log up to that step.
    d = fresh("sig", "int")
    proc = Proc([sp("sp-run"), p1, "--steps", "1000000", "--log-dir",
                 d + "/log"] + const)
    check(proc.wait_for_step(5), "SIGINT: the run did not start")
    proc.p.send_signal(signal.SIGINT)
    rc = proc.wait(60)
    line = stop_line(proc.text())
    m = re.match(r"sp-run: interrupted by SIGINT after step (\d+) of 1000000; "
                 r"no checkpoint \(--checkpoint-on-exit saves one\)$", line)
    check(rc == 130, "SIGINT: exit code %s, expected 130" % rc)
    if check(m, "SIGINT: unexpected last line %r" % line):
        stopped = int(m.group(1))
        check(len(loss_rows(d + "/log/loss.csv")) == stopped,
              "SIGINT: loss.csv does not hold the %d steps" % stopped)
        log("SIGINT: exit 130 after step %d: %s" % (stopped, line))

    # SIGTERM with --checkpoint-on-exit, one device and thread ranks: the
    # checkpoint holds the last step, and resuming reproduces an
    # uninterrupted run bit for bit.
    for layout, p in (("one device", p1), ("t = 2 + SP (threads)", p2)):
        d = fresh("sig", "term" + str(p == p2))
        proc = Proc([sp("sp-run"), p, "--steps", "1000000", "--checkpoint",
                     d + "/ck", "--checkpoint-on-exit", "--log-dir",
                     d + "/log"] + const)
        check(proc.wait_for_step(8), "SIGTERM: the run did not start")
        proc.p.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        line = stop_line(proc.text())
        m = re.match(r"sp-run: interrupted by SIGTERM after step (\d+) of "
                     r"1000000; wrote checkpoint '.*' \(step (\d+)\); continue "
                     r"with --resume$", line)
        check(rc == 143, "%s: SIGTERM: exit code %s, expected 143" %
              (layout, rc))
        if not check(m and m.group(1) == m.group(2),
                     "%s: SIGTERM: unexpected last line %r" % (layout, line)):
            continue
        stopped = int(m.group(1))
        check(index_of(d + "/ck")["step"] == stopped,
              "%s: the checkpoint is not at step %d" % (layout, stopped))
        end = stopped + 5
        must([sp("sp-run"), p, "--steps", str(end), "--checkpoint", d + "/ck",
              "--checkpoint-every", "1000", "--resume", "--log-dir",
              d + "/log"] + const)
        must([sp("sp-run"), p, "--steps", str(end), "--checkpoint",
              d + "/ref-ck", "--checkpoint-every", "1000", "--log-dir",
              d + "/ref-log"] + const)
        same = same_checkpoint(d + "/ref-ck", d + "/ck", layout + " SIGTERM")
        csv = check(loss_rows(d + "/ref-log/loss.csv") ==
                    loss_rows(d + "/log/loss.csv"),
                    "%s: SIGTERM: loss.csv differs" % layout)
        log("%s: SIGTERM: exit 143 after step %d with its checkpoint; resumed "
            "to %d: %s an uninterrupted run" %
            (layout, stopped, end,
             "byte-identical to" if same and csv else "DIFFERENT from"))

    # A signal while a checkpoint is being written: the write commits, then
    # the run stops (the checkpoint holds the step just written).
    d = fresh("sig", "during")
    env = dict(os.environ, SP_TEST_CHECKPOINT_DELAY_MS="1500")
    proc = Proc([sp("sp-run"), p1, "--steps", "1000000", "--checkpoint",
                 d + "/ck", "--checkpoint-every", "5", "--checkpoint-on-exit",
                 "--log-dir", d + "/log"] + const, env=env)
    deadline = time.time() + 60
    while time.time() < deadline and not data_files(d + "/ck"):
        time.sleep(0.002)
    proc.p.send_signal(signal.SIGTERM)
    rc = proc.wait(60)
    line = stop_line(proc.text())
    check(rc == 143, "SIGTERM during a write: exit code %s" % rc)
    check(re.match(r"sp-run: interrupted by SIGTERM after step 5 of 1000000; "
                   r"the last step is in checkpoint '.*' \(step 5\)", line),
          "SIGTERM during a write: unexpected last line %r" % line)
    check((index_of(d + "/ck") or {}).get("step") == 5,
          "SIGTERM during a write: the write of step 5 did not commit")
    log("SIGTERM during a checkpoint write: it committed, then: " + line)

    # A second signal exits at once, even mid-write; the checkpoint stays
    # whole (the previous one: the one being written never committed).
    d = fresh("sig", "second")
    proc = Proc([sp("sp-run"), p1, "--steps", "1000000", "--checkpoint",
                 d + "/ck", "--checkpoint-every", "5", "--log-dir",
                 d + "/log"] + const, env=env)
    deadline = time.time() + 60
    while time.time() < deadline and len(data_files(d + "/ck")) < 2:
        time.sleep(0.002)  # the second write (step 10) has begun
    proc.p.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    proc.p.send_signal(signal.SIGTERM)
    rc = proc.wait(60)
    line = stop_line(proc.text())
    check(rc == 143, "second SIGTERM: exit code %s" % rc)
    check("second signal: exiting at once" in line,
          "second SIGTERM: unexpected last line %r" % line)
    # The write of step 10 was 0.1 s into its 1.5 s: it never committed
    # (10 only if this machine stalled past its commit, still whole).
    step = (index_of(d + "/ck") or {}).get("step")
    check(step in (5, 10), "second SIGTERM: the checkpoint is at step %s" %
          step)
    rc, out, err = run([sp("sp-run"), p1, "--steps", "12", "--checkpoint",
                        d + "/ck", "--checkpoint-every", "12", "--resume",
                        "--log-dir", d + "/log"] + const)
    check(rc == 0, "second SIGTERM: resuming failed: %s" % err[-300:])
    log("second SIGTERM mid-write: exit 143 at once (%s); the checkpoint of "
        "step %s stayed whole and resumes" % (line, step))


# ---------------------------------------------------------------------------
# MPI: dead and stopped ranks, signals


def mpi_flags():
    flags = []
    v = subprocess.run([ARGS.mpiexec, "--version"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True).stdout
    if re.search("Open MPI|OpenRTE|open-mpi", v):
        flags.append("--oversubscribe")
        if os.geteuid() == 0:
            flags.append("--allow-run-as-root")
    return flags


def mpi_env():
    return dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")


def rank_pids(marker):
    """{world rank: pid} of the sp-run processes whose command line holds
    marker (a path unique to the run)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
            if not argv or os.path.basename(argv[0]) != b"sp-run" or \
                    marker.encode() not in argv:
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0")
                           if b"=" in kv)
            rank = env.get(b"OMPI_COMM_WORLD_RANK", env.get(b"PMI_RANK"))
            if rank is not None:
                out[int(rank)] = int(pid)
        except (OSError, ValueError):
            pass
    return out


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_ranks(marker, n, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        pids = rank_pids(marker)
        if len(pids) == n:
            return pids
        time.sleep(0.05)
    return rank_pids(marker)


def mpi():
    if not ARGS.mpiexec or not shutil.which(ARGS.mpiexec):
        log("mpi: no mpirun; skipped")
        return
    data = setup()
    grid = plan("grid-t2-p2", "--tp", "2", "--sp", "--pp", "2",
                "--microbatches", "2")
    p2 = plan("t-2-SP-threads", "--tp", "2", "--sp")
    mpirun = [ARGS.mpiexec] + mpi_flags()
    const = ["--min-lr", "1e-3", "--threads", "1", "--data", data]

    # kill -9 of one rank of 4: the time until every rank has exited.
    d = fresh("mpi", "kill9")
    proc = Proc(mpirun + ["-np", "4", sp("sp-run"), grid, "--comm", "mpi",
                          "--steps", "1000000", "--log-dir", d + "/log"] +
                const, env=mpi_env())
    pids = wait_ranks(d + "/log", 4)
    started = check(len(pids) == 4 and proc.wait_for_step(10),
                    "kill -9: the 4 ranks did not start (%s)" % pids)
    if started:
        t0 = time.time()
        os.kill(pids[2], signal.SIGKILL)
        others = [pid for r, pid in pids.items() if r != 2]
        end = t0 + 120
        while time.time() < end and any(alive(pid) for pid in others):
            time.sleep(0.01)
        ranks_gone = time.time() - t0
        rc = proc.wait(120)
        job_gone = time.time() - t0
        check(not any(alive(pid) for pid in others),
              "kill -9: ranks still alive after 120 s")
        check(rc not in (0, None), "kill -9: mpirun exit code %s" % rc)
        log("MPI, 4 ranks (t = 2 + SP, p = 2), kill -9 of rank 2: every other "
            "rank gone %.2f s later, mpirun exited %s after %.2f s" %
            (ranks_gone, rc, job_gone))
    else:
        proc.p.kill()
        proc.wait(30)

    # SIGSTOP of one rank with --comm-timeout 3: the others end the job.
    d = fresh("mpi", "stop")
    proc = Proc(mpirun + ["-np", "4", sp("sp-run"), grid, "--comm", "mpi",
                          "--steps", "1000000", "--comm-timeout", "3",
                          "--log-dir", d + "/log"] + const, env=mpi_env())
    pids = wait_ranks(d + "/log", 4)
    started = check(len(pids) == 4 and proc.wait_for_step(10),
                    "SIGSTOP: the 4 ranks did not start (%s)" % pids)
    if started:
        t0 = time.time()
        os.kill(pids[1], signal.SIGSTOP)
        others = [pid for r, pid in pids.items() if r != 1]
        end = t0 + 120
        while time.time() < end and any(alive(pid) for pid in others):
            time.sleep(0.01)
        ranks_gone = time.time() - t0
        rc = proc.wait(120)
        job_gone = time.time() - t0
        if alive(pids[1]):
            os.kill(pids[1], signal.SIGKILL)
        text = "\n".join(proc.text())
        m = re.search(r"(mpi \d+/\d+): aborting the job: (timed out after 3.0 "
                      r"s in (\w+) waiting for [^\n]*)", text)
        check(not any(alive(pid) for pid in others),
              "SIGSTOP: ranks still alive after 120 s")
        check(rc not in (0, None), "SIGSTOP: mpirun exit code %s" % rc)
        check(m, "SIGSTOP: no rank named the collective it waited in:\n" +
              text[-2000:])
        check(ranks_gone <= 3 + 30, "SIGSTOP: the other ranks took %.1f s "
              "(bound: timeout 3 s + 30 s)" % ranks_gone)
        log("MPI, 4 ranks, SIGSTOP of rank 1 with --comm-timeout 3: every "
            "other rank gone %.2f s later, mpirun exited %s after %.2f s; %s" %
            (ranks_gone, rc, job_gone, m.group(0) if m else "?"))
    else:
        proc.p.kill()
        proc.wait(30)

    # SIGTERM to every rank process (as a batch scheduler does) with
    # --checkpoint-on-exit: they agree on the step, each saves its shard, and
    # the checkpoint resumes (on thread ranks) bit for bit.
    for how in ("every rank", "mpirun"):
        d = fresh("mpi", "term-" + how.replace(" ", "-"))
        grace = ["--mca", "odls_base_sigkill_timeout", "3"] \
            if how == "mpirun" and "--oversubscribe" in mpirun else []
        proc = Proc(mpirun + grace +
                    ["-np", "2", sp("sp-run"), p2, "--comm", "mpi", "--steps",
                     "1000000", "--checkpoint", d + "/ck",
                     "--checkpoint-on-exit", "--log-dir", d + "/log"] + const,
                    env=mpi_env())
        pids = wait_ranks(d + "/log", 2)
        if not check(len(pids) == 2 and proc.wait_for_step(8),
                     "SIGTERM to %s: the ranks did not start" % how):
            proc.p.kill()
            proc.wait(30)
            continue
        if how == "mpirun":
            # Open MPI forwards SIGTERM after odls_base_sigkill_timeout
            # seconds and sends SIGKILL as long after that (default 1 s;
            # started with 3 s, so that a slow disk's fsyncs fit).
            proc.p.send_signal(signal.SIGTERM)
        else:
            for pid in pids.values():
                os.kill(pid, signal.SIGTERM)
        rc = proc.wait(60)
        text = proc.text()
        line = next((l for l in text if "interrupted by SIGTERM" in l), "")
        m = re.match(r"sp-run: interrupted by SIGTERM after step (\d+) of "
                     r"1000000; wrote checkpoint '.*' \(step (\d+)\)", line)
        check(rc not in (0, None), "SIGTERM to %s: mpirun exit code %s" %
              (how, rc))
        if not check(m, "SIGTERM to %s: no stop line in:\n%s" %
                     (how, "\n".join(text[-20:]))):
            continue
        stopped = int(m.group(1))
        idx = index_of(d + "/ck")
        check(idx and idx["step"] == stopped and idx["ranks"] == 2,
              "SIGTERM to %s: the checkpoint is not the 2 ranks' step %d" %
              (how, stopped))
        end = stopped + 4
        must([sp("sp-run"), p2, "--steps", str(end), "--checkpoint", d + "/ck",
              "--checkpoint-every", "1000", "--resume", "--log-dir",
              d + "/log"] + const)
        must([sp("sp-run"), p2, "--steps", str(end), "--checkpoint",
              d + "/ref-ck", "--checkpoint-every", "1000", "--log-dir",
              d + "/ref-log"] + const)
        same = same_checkpoint(d + "/ref-ck", d + "/ck", "SIGTERM to " + how)
        log("MPI, 2 ranks, SIGTERM to %s: mpirun exit %s, stopped after step "
            "%d with a checkpoint of both ranks; resumed on threads: %s" %
            (how, rc, stopped,
             "byte-identical" if same else "DIFFERENT"))

    # A stopped rank does not hold a SIGTERM up: the other rank is blocked
    # in a collective; it leaves after the 10 s grace (the comm timeout is
    # 300 s).
    d = fresh("mpi", "blocked")
    proc = Proc(mpirun + ["-np", "2", sp("sp-run"), p2, "--comm", "mpi",
                          "--steps", "1000000", "--log-dir", d + "/log"] +
                const, env=mpi_env())
    pids = wait_ranks(d + "/log", 2)
    if check(len(pids) == 2 and proc.wait_for_step(8),
             "blocked: the ranks did not start"):
        os.kill(pids[1], signal.SIGSTOP)
        time.sleep(0.5)
        t0 = time.time()
        os.kill(pids[0], signal.SIGTERM)
        end = t0 + 120
        while time.time() < end and alive(pids[0]):
            time.sleep(0.01)
        gone = time.time() - t0
        os.kill(pids[1], signal.SIGKILL)
        rc = proc.wait(60)
        line = next((l for l in proc.text() if "did not finish" in l), "")
        check(not alive(pids[0]), "blocked: rank 0 still alive after 120 s")
        check(re.match(r"sp-run: rank 0: interrupted by SIGTERM; step \d+ did "
                       r"not finish within 10 s", line),
              "blocked: unexpected message %r" % line)
        log("MPI, SIGTERM to rank 0 while rank 1 is stopped: rank 0 left its "
            "blocked collective after %.2f s: %s" % (gone, line))
    else:
        proc.p.kill()
        proc.wait(30)

    # A checkpoint of 4 MPI processes (t = 2, p = 2) resumes on thread ranks
    # bit for bit.
    d = fresh("mpi", "ckpt")
    must(mpirun + ["-np", "4", sp("sp-run"), grid, "--comm", "mpi", "--steps",
                   "12", "--checkpoint-every", "6", "--checkpoint", d + "/ck",
                   "--log-dir", d + "/log"] + const, env=mpi_env())
    must([sp("sp-run"), grid, "--steps", "12", "--checkpoint-every", "6",
          "--checkpoint", d + "/ref-ck", "--log-dir", d + "/ref-log"] + const)
    same = same_checkpoint(d + "/ref-ck", d + "/ck", "MPI checkpoint")
    must([sp("sp-run"), grid, "--steps", "16", "--checkpoint-every", "16",
          "--checkpoint", d + "/ck", "--resume", "--log-dir", d + "/log"] +
         const)
    must([sp("sp-run"), grid, "--steps", "16", "--checkpoint-every", "16",
          "--checkpoint", d + "/ref-ck", "--resume", "--log-dir",
          d + "/ref-log"] + const)
    same &= same_checkpoint(d + "/ref-ck", d + "/ck", "MPI checkpoint resumed")
    log("a checkpoint of 4 MPI processes equals the thread ranks' and resumes "
        "on threads: %s" % ("byte-identical" if same else "DIFFERENT"))


# ---------------------------------------------------------------------------
# Locks


def locks():
    data = setup()
    p1 = plan("one-device")
    d = fresh("locks", "a")
    const = ["--threads", "1", "--data", data]
    holder = Proc([sp("sp-run"), p1, "--steps", "1000000", "--checkpoint",
                   d + "/ck", "--checkpoint-every", "50", "--log-dir",
                   d + "/log"] + const)
    check(holder.wait_for_step(3), "locks: the first run did not start")
    pid = holder.p.pid
    cases = [
        ("the same checkpoint directory", ["--checkpoint", d + "/ck",
                                           "--checkpoint-every", "5",
                                           "--log-dir", d + "/log2"],
         r"sp-run: error: checkpoint directory '%s': another sp-run \(pid %d\) "
         r"is using it; wait for that run to end or give this one another "
         r"--checkpoint DIR$" % (re.escape(d + "/ck"), pid)),
        ("the same log directory", ["--log-dir", d + "/log"],
         r"sp-run: error: log directory '%s': another sp-run \(pid %d\) is "
         r"using it; wait for that run to end or give this one another "
         r"--log-dir DIR$" % (re.escape(d + "/log"), pid)),
    ]
    for what, flags, want in cases:
        rc, out, err = run([sp("sp-run"), p1, "--steps", "3"] + flags + const)
        lines = err.strip().splitlines()
        check(rc == 1 and len(lines) == 1 and re.match(want, lines[0]),
              "locks: a second run on %s: exit %d, %r" % (what, rc, err))
        log("a second run on %s: refused: %s" % (what, lines[-1] if lines
                                                 else "?"))
    # The default log directory (PLAN/run) is a log directory like any other.
    first = Proc([sp("sp-run"), p1, "--steps", "1000000"] + const)
    check(first.wait_for_step(2), "locks: the plan-run did not start")
    rc, out, err = run([sp("sp-run"), p1, "--steps", "3"] + const)
    check(rc == 1 and "another sp-run (pid %d) is using it" % first.p.pid in err,
          "locks: a second run with the default log directory: %r" % err)
    first.p.send_signal(signal.SIGKILL)
    first.wait(30)
    # kill -9 of the holder frees its directories: no stale lock.
    holder.p.send_signal(signal.SIGKILL)
    holder.wait(30)
    rc, out, err = run([sp("sp-run"), p1, "--steps", "3", "--checkpoint",
                        d + "/ck", "--checkpoint-every", "3", "--log-dir",
                        d + "/log"] + const)
    check(rc == 0, "locks: after kill -9 of the holder the directories are "
          "still locked: %r" % err[-300:])
    check(os.path.exists(d + "/ck/.sp-run.lock"), "locks: no lock file")
    log("after kill -9 of the holder: a new run on its directories works (the "
        "lock file stays, unlocked)")


# ---------------------------------------------------------------------------
# Disks


def disk():
    data = setup()
    p1 = plan("one-device")
    const = ["--threads", "1", "--data", data, "--min-lr", "1e-3"]
    d = fresh("disk", "x")
    os.makedirs(d)
    with open(d + "/file", "w") as f:
        f.write("a regular file\n")
    # Unwritable: a path through a regular file (root ignores permissions).
    for flags, want in (
            (["--checkpoint", d + "/file/ck", "--checkpoint-every", "2",
              "--log-dir", d + "/log"],
             r"sp-run: error: checkpoint directory '.*file/ck': cannot create "
             r"it: Not a directory$"),
            (["--log-dir", d + "/file/log"],
             r"sp-run: error: log directory '.*file/log': cannot create it: "
             r"Not a directory$")):
        rc, out, err = run([sp("sp-run"), p1, "--steps", "3"] + flags + const)
        lines = err.strip().splitlines()
        check(rc == 1 and len(lines) == 1 and re.match(want, lines[0]),
              "unwritable: exit %d, %r" % (rc, err))
        log("unwritable directory: " + (lines[-1] if lines else "?"))

    # A file-size limit (EFBIG) below a checkpoint's size (1.4 MB): the write
    # of step 10 fails with one line, the checkpoint of step 5 stays, and
    # resuming from it reproduces an uninterrupted run.
    ref = fresh("disk", "ref")
    must([sp("sp-run"), p1, "--steps", "15", "--checkpoint-every", "5",
          "--checkpoint", ref + "/ck", "--log-dir", ref + "/log"] + const)
    d = fresh("disk", "fsize")
    must([sp("sp-run"), p1, "--steps", "5", "--checkpoint-every", "5",
          "--checkpoint", d + "/ck", "--log-dir", d + "/log"] + const)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (512 * 1024, 512 * 1024))
    rc, out, err = run([sp("sp-run"), p1, "--steps", "15", "--checkpoint-every",
                        "5", "--checkpoint", d + "/ck", "--resume", "--log-dir",
                        d + "/log"] + const, preexec_fn=limit)
    errors = [l for l in err.splitlines() if "error" in l]
    want = (r"sp-run: error: cannot write checkpoint '.*ck' \(step 10\): "
            r"tensors-10\.bin: File too large; '.*ck' still holds the "
            r"checkpoint of step 5$")
    check(rc == 1 and len(errors) == 1 and re.match(want, errors[0]),
          "file-size limit: exit %d, %r" % (rc, err[-500:]))
    check((index_of(d + "/ck") or {}).get("step") == 5 and
          data_files(d + "/ck") == {"tensors-5.bin"},
          "file-size limit: the checkpoint of step 5 was not left as it was: "
          "%s" % sorted(os.listdir(d + "/ck")))
    log("file-size limit (RLIMIT_FSIZE, EFBIG): " +
        (errors[0] if errors else "?"))
    must([sp("sp-run"), p1, "--steps", "15", "--checkpoint-every", "5",
          "--checkpoint", d + "/ck", "--resume", "--log-dir", d + "/log"] +
         const)
    same = same_checkpoint(ref + "/ck", d + "/ck", "after EFBIG")
    csv = check(loss_rows(ref + "/log/loss.csv") ==
                loss_rows(d + "/log/loss.csv"),
                "after EFBIG: loss.csv differs")
    log("resumed from the checkpoint it left: %s an uninterrupted run" %
        ("byte-identical to" if same and csv else "DIFFERENT from"))

    # A full file system (ENOSPC): a 2 MiB tmpfs holds one checkpoint (1.4
    # MB) but not a second beside it, which a write needs before the commit.
    mnt = fresh("disk", "tmpfs")
    os.makedirs(mnt)
    try:
        rc, out, err = run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs",
                            mnt])
    except OSError as e:  # no mount command
        rc, out, err = -1, "", str(e)
    if rc != 0:
        why = err.strip().splitlines()[-1] if err.strip() else "rc %d" % rc
        log("full disk (ENOSPC): skipped, cannot mount a tmpfs here (%s)" %
            why)
        return
    try:
        rc, out, err = run([sp("sp-run"), p1, "--steps", "10",
                            "--checkpoint-every", "5", "--checkpoint",
                            mnt + "/ck", "--log-dir", mnt + "/log"] + const)
        errors = [l for l in err.splitlines() if "error" in l]
        want = (r"sp-run: error: cannot write checkpoint '.*ck' \(step 10\): "
                r"tensors-10\.bin: No space left on device; '.*ck' still "
                r"holds the checkpoint of step 5$")
        check(rc == 1 and len(errors) == 1 and re.match(want, errors[0]),
              "ENOSPC: exit %d, %r" % (rc, err[-500:]))
        check((index_of(mnt + "/ck") or {}).get("step") == 5,
              "ENOSPC: the checkpoint of step 5 was not left as it was")
        log("full disk (2 MiB tmpfs, ENOSPC): " +
            (errors[0] if errors else "?"))
    finally:
        run(["umount", mnt])


TESTS = {"kill-resume": kill_resume, "signals": signals, "mpi": mpi,
         "locks": locks, "disk": disk}


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sp-bin", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--models",
                    default=os.path.join(os.path.dirname(os.path.abspath(
                        __file__)), "..", "..", "models"))
    ap.add_argument("--mpiexec", default="")
    ap.add_argument("--test", action="append", choices=sorted(TESTS))
    ARGS = ap.parse_args()
    ARGS.sp_bin = os.path.abspath(ARGS.sp_bin)
    ARGS.workdir = os.path.abspath(ARGS.workdir)
    for name in ARGS.test or sorted(TESTS):
        t0 = time.time()
        log("== %s" % name)
        TESTS[name]()
        log("-- %s: %.1f s" % (name, time.time() - t0))
    if FAILURES:
        log("%d failure(s):\n  %s" % (len(FAILURES), "\n  ".join(FAILURES)))
        return 1
    log("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
