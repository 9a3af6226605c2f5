#!/usr/bin/python3
"""Plots a gpt-train metrics file (logging.metrics_file, JSON lines) as one PNG.

    plot_metrics.py METRICS.jsonl [-o FILE.png] [--title TEXT]

Panels: training loss with the validation/test loss at evaluation points (and their perplexity on a
second axis); learning rate and gradient norm; tokens/s and MFU (or TFLOP/s per device when the run
logged no MFU); and the fp16 loss scale when it ever differs from 1. The default output is the metrics
file's name with .png.

Resumed runs append to the same file, so iterations repeat after a restart. The latest record wins: when
an iteration at or below one already seen appears, everything from that iteration on is dropped and the
new records replace it (a run resumed from iteration 100 after reaching 140 shows its own 101..140).
Lines that are not JSON objects, and events other than "train" and "eval", are skipped; a file with no
training records is an error (exit status 2, the file named).
"""
import argparse
import json
import sys


def read_metrics(path):
    """Returns (train, evals): train = {iteration: record}; evals = {split: {iteration: record}}."""
    train, evals = {}, {}
    last = None
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        sys.exit(f"plot_metrics.py: {path}: {e.strerror}")
    with f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("iteration"), int):
                continue
            it, event = rec["iteration"], rec.get("event", "train")
            if event == "train":
                if last is not None and it <= last:  # a restart: the new records replace from here on
                    for table in [train] + list(evals.values()):
                        for stale in [i for i in table if i >= it]:
                            del table[stale]
                train[it] = rec
                last = it
            elif event == "eval":
                evals.setdefault(rec.get("split", "valid"), {})[it] = rec
    if not train:
        print(f"plot_metrics.py: {path}: no training records (lines with \"event\": \"train\")", file=sys.stderr)
        sys.exit(2)
    return train, evals


def series(table, key):
    its = sorted(i for i in table if isinstance(table[i].get(key), (int, float)))
    return its, [table[i][key] for i in its]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics")
    parser.add_argument("-o", "--output")
    parser.add_argument("--title")
    args = parser.parse_args(argv)
    output = args.output or (args.metrics.rsplit(".", 1)[0] + ".png")
    train, evals = read_metrics(args.metrics)

    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    scale_its, scales = series(train, "loss_scale")
    show_scale = any(s != 1 for s in scales)
    rows = 4 if show_scale else 3
    fig, axes = plt.subplots(rows, 1, figsize=(9, 3 * rows), sharex=True)

    ax = axes[0]
    ax.plot(*series(train, "loss"), label="train loss", lw=1)
    ppl_ax = None
    for split, table in sorted(evals.items()):
        its, losses = series(table, "loss")
        (line,) = ax.plot(its, losses, "o-", label=f"{split} loss", ms=4)
        its, ppl = series(table, "perplexity")
        if its:  # the split's perplexity in its loss line's colour, on a second axis
            ppl_ax = ppl_ax or ax.twinx()
            ppl_ax.plot(its, ppl, "x--", label=f"{split} perplexity", ms=4, alpha=0.6, color=line.get_color())
    ax.set_ylabel("loss")
    ax.legend(loc="upper right")
    if ppl_ax:
        ppl_ax.set_ylabel("perplexity")
        ppl_ax.legend(loc="center right")

    ax = axes[1]
    ax.plot(*series(train, "lr"), label="learning rate", color="tab:green")
    ax.set_ylabel("learning rate")
    gn = ax.twinx()
    gn.plot(*series(train, "grad_norm"), label="grad norm", color="tab:red", lw=1)
    gn.set_ylabel("grad norm")
    ax.legend(loc="upper left")
    gn.legend(loc="upper right")

    ax = axes[2]
    ax.plot(*series(train, "tokens_per_s"), label="tokens/s", color="tab:purple")
    ax.set_ylabel("tokens/s")
    rate = ax.twinx()
    mfu_its, mfu = series(train, "mfu")
    if mfu_its:
        rate.plot(mfu_its, [100 * m for m in mfu], label="MFU %", color="tab:orange")
        rate.set_ylabel("MFU %")
    else:
        rate.plot(*series(train, "tflops_per_device"), label="TFLOP/s per device", color="tab:orange")
        rate.set_ylabel("TFLOP/s per device")
    ax.legend(loc="upper left")
    rate.legend(loc="upper right")

    if show_scale:
        ax = axes[3]
        ax.semilogy(scale_its, scales, label="loss scale", color="tab:brown")
        ax.set_ylabel("loss scale")
        ax.legend(loc="upper right")
    axes[-1].set_xlabel("iteration")
    fig.suptitle(args.title or args.metrics)
    fig.tight_layout()
    try:
        fig.savefig(output, dpi=100)
    except OSError as e:
        sys.exit(f"plot_metrics.py: {output}: {e.strerror}")
    print(f"plot_metrics.py: wrote {output} ({len(train)} iterations, "
          f"{sum(len(t) for t in evals.values())} evaluations)")


if __name__ == "__main__":
    main()
