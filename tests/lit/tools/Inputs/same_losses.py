"""Usage: same_losses.py REF.csv RUN.csv [RUN.csv ...]

Whether sp-run loss.csv files hold the same training: the columns a rerun
reproduces bit for bit (step, loss, lr, grad_norm, val_loss: everything
before the timings tokens_per_s, model_flops_per_s and mfu, which differ
from run to run) must be equal as text, row for row. Prints one line per
difference and exits 1 if there is any.
"""
import csv
import sys

REPRODUCED = ("step", "loss", "lr", "grad_norm", "val_loss")


def rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REPRODUCED if c not in (reader.fieldnames or [])]
        if missing:
            sys.exit("%s: no column %s" % (path, ", ".join(missing)))
        return [tuple(r[c] for c in REPRODUCED) for r in reader]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ref = rows(sys.argv[1])
    bad = 0
    for path in sys.argv[2:]:
        run = rows(path)
        if len(run) != len(ref):
            print("%s: %d rows, %s has %d" % (path, len(run), sys.argv[1],
                                              len(ref)))
            bad += 1
            continue
        for a, b in zip(ref, run):
            if a != b:
                print("%s: step %s: %s, %s has %s" %
                      (path, b[0], dict(zip(REPRODUCED, b)), sys.argv[1],
                       dict(zip(REPRODUCED, a))))
                bad += 1
                break
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
