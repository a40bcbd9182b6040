#!/usr/bin/python3
"""Milliseconds per step of each op in an `sp-run --trace` file: the compute and communication
events of every rank summed by op name and divided by the traced steps, largest first.

    build/bin/sp-run PLAN --data DATA --steps 8 --trace t.json
    /usr/bin/python3 tools/trace_ops.py t.json --steps 8 [--top 12]
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, required=True, help="the steps the trace holds (sp-run --steps)")
    ap.add_argument("--top", type=int, default=12, help="ops to list (default 12)")
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    us = collections.Counter()
    for e in events:
        if e.get("ph") == "X":
            us[e.get("name", "").split(" ")[0]] += e["dur"]
    print(f"{sum(us.values()) / 1000 / args.steps:.2f} ms per step in all")
    for op, t in us.most_common(args.top):
        print(f"  {op:<28} {t / 1000 / args.steps:8.2f} ms/step")


if __name__ == "__main__":
    main()
