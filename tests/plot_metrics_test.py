#!/usr/bin/python3
"""Test of scripts/plot_metrics.py: on a small metrics file written the way gpt-train writes it (a run to
iteration 8 with evaluations, then resumed from iteration 4 with fp16 loss scales), the script writes a
PNG; the resumed records replace the stale ones from iteration 5 on; a file without training records and a
missing file get a clear error naming the file.

    plot_metrics_test.py SOURCE_DIR
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile


def main():
    source = sys.argv[1]
    script = os.path.join(source, "scripts", "plot_metrics.py")
    spec = importlib.util.spec_from_file_location("plot_metrics", script)
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        with open(metrics, "w") as f:
            def train(it, loss, scale=1.0):
                f.write(json.dumps({"event": "train", "iteration": it, "loss": loss, "lr": 1e-3 * it,
                                    "grad_norm": 1.0 / it, "loss_scale": scale, "tokens_per_s": 1000 + it,
                                    "tflops_per_device": 0.1, "mfu": 0.01}) + "\n")
            for it in range(1, 9):
                train(it, 10.0 - it)
                if it % 4 == 0:
                    f.write(json.dumps({"event": "eval", "iteration": it, "split": "valid", "loss": 9.0 - it,
                                        "perplexity": 2.0 ** (9 - it)}) + "\n")
            f.write("not json: a line cut short by a crash\n")
            for it in range(5, 7):  # resumed from the checkpoint at iteration 4
                train(it, 100.0 + it, scale=2.0 ** (16 - it))
        train_recs, evals = plot.read_metrics(metrics)
        check(sorted(train_recs) == [1, 2, 3, 4, 5, 6], "records after the restart replace the stale ones")
        check(train_recs[5]["loss"] == 105.0 and train_recs[4]["loss"] == 6.0, "the latest record wins")
        check(sorted(evals.get("valid", {})) == [4], "the evaluation at 8 belonged to the abandoned records")

        png = os.path.join(tmp, "out.png")
        run = subprocess.run([sys.executable, script, metrics, "-o", png], capture_output=True, text=True)
        check(run.returncode == 0, f"plot exits 0 ({run.stderr.strip()})")
        ok = os.path.exists(png) and os.path.getsize(png) > 1000
        check(ok and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "a PNG is written")
        default = subprocess.run([sys.executable, script, metrics], capture_output=True, text=True)
        check(default.returncode == 0 and os.path.exists(os.path.join(tmp, "metrics.png")),
              "the default output is the metrics file's name with .png")

        empty = os.path.join(tmp, "empty.jsonl")
        with open(empty, "w") as f:
            f.write(json.dumps({"event": "eval", "iteration": 1, "split": "valid", "loss": 1.0}) + "\n")
        run = subprocess.run([sys.executable, script, empty], capture_output=True, text=True)
        check(run.returncode == 2 and "empty.jsonl" in run.stderr and "no training records" in run.stderr,
              f"no training records: a clear error ({run.stderr.strip()})")
        missing = os.path.join(tmp, "missing.jsonl")
        run = subprocess.run([sys.executable, script, missing], capture_output=True, text=True)
        check(run.returncode != 0 and "missing.jsonl" in run.stderr, f"a missing file is named ({run.stderr.strip()})")
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
