#!/usr/bin/env python3
"""Checks that runs are bit for bit the same as a reference run.

usage: same_dumps.py REF DUMP [DUMP ...]

Each DUMP (an sp-run --dump directory) must hold the reference's loss.csv
byte for byte and, for every grads/*.npy and weights/*.npy of the reference,
an array of the same dtype, shape and bits. Prints one line per DUMP:
"NAME: L losses, G gradients, W weights: bitwise", or what differs (and
exits 1).
"""
import os
import sys

import numpy as np


def arrays(root, kind):
    d = os.path.join(root, kind)
    return sorted(f for f in os.listdir(d) if f.endswith('.npy')) if os.path.isdir(d) else []


def reproduced(path):
    """loss.csv's rows without the timings (tokens_per_s and after), which
    differ from run to run."""
    with open(path) as f:
        return [line.split(',')[:5] for line in f.read().strip().splitlines()[1:]]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ref, runs = sys.argv[1], sys.argv[2:]
    ok = True
    ref_loss = reproduced(os.path.join(ref, 'loss.csv'))
    losses = len(ref_loss)
    for run in runs:
        name = os.path.basename(os.path.normpath(run))
        bad = []
        if reproduced(os.path.join(run, 'loss.csv')) != ref_loss:
            bad.append('loss.csv differs')
        counts = {}
        for kind in ('grads', 'weights'):
            files = arrays(ref, kind)
            counts[kind] = len(files)
            if not files:
                bad.append('the reference has no ' + kind)
            for f in files:
                a = np.load(os.path.join(ref, kind, f))
                path = os.path.join(run, kind, f)
                if not os.path.exists(path):
                    bad.append(kind + '/' + f + ' is missing')
                    continue
                b = np.load(path)
                if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
                    diff = np.abs(a.astype(np.float64) - b.astype(np.float64)).max() \
                        if a.shape == b.shape else float('nan')
                    bad.append('%s/%s differs (largest difference %.3g)' % (kind, f, diff))
        if bad:
            ok = False
            print('%s: %s' % (name, '; '.join(bad)))
        else:
            print('%s: %d losses, %d gradients, %d weights: bitwise'
                  % (name, losses, counts['grads'], counts['weights']))
    sys.exit(0 if ok else 1)


if __name__ == '__main__':
    main()
