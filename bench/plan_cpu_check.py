#!/usr/bin/python3
"""The planner's predictions against real CPU runs of config M on this machine.

    plan_cpu_check.py [--gpt-train PATH] [--steps N] [--work-dir DIR] [--wait-idle SECONDS]

1. `gpt-train plan --probe` measures this machine's CPU backend with one thread per device (GEMM rate in
   fp32 and bf16, the attention core, the memory-bound kernels of a block, a memcpy for the intra-node
   link) and writes a hardware file (DIR/cpu-probe.yaml).
2. Config M (6 layers, hidden 384, 6 heads, seq 256, vocab 50304, global batch 8 in microbatches of 2,
   fp32) is trained for 1 warm-up + N timed steps at (tp, pp, dp) = (1,1,1), (2,1,1), (1,2,1), (1,1,2),
   one thread per rank, under mpirun.
3. `gpt-train plan --json` with that hardware file predicts each layout's step time and memory.
The table shows measured (the fastest timed step, wall clock: a shared machine only slows steps down)
against predicted, and the fullest rank's memory peak from the trainer's counters against the start-up
prediction for its stage. The load column is the 1-minute load average when each run started: on a
machine that was busy the measured times are too slow, and the script says so. Exit status 1 when a
prediction is more than 20% off.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG_M = """backend: cpu
model: {{num_layers: 6, hidden_size: 384, num_heads: 6, seq_length: 256, vocab_size: 50304}}
parallel: {{tensor: {tp}, pipeline: {pp}, data: {dp}}}
training: {{micro_batch_size: 2, global_batch_size: 8, train_iters: {iters}, threads: 1}}
precision: {{dtype: fp32}}
eval: {{interval: 0}}
logging: {{interval: 1, metrics_file: {metrics}}}
"""

LAYOUTS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)]


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def wait_idle(limit_s, ncpu):
    deadline = time.time() + limit_s
    while time.time() < deadline and load1() > 0.5 * ncpu:
        time.sleep(5)


def env1():
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    return env


def run_layout(gpt_train, work, tp, pp, dp, steps):
    name = f"tp{tp}_pp{pp}_dp{dp}"
    metrics = os.path.join(work, name + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cfg = os.path.join(work, name + ".yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG_M.format(tp=tp, pp=pp, dp=dp, iters=steps + 1, metrics=metrics))
    world = tp * pp * dp
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(world),
           gpt_train, "train", "--config", cfg]
    load = load1()
    t0 = time.time()
    p = subprocess.run(cmd, env=env1(), capture_output=True, text=True)
    wall = time.time() - t0
    log = p.stdout + p.stderr
    with open(os.path.join(work, name + ".log"), "w") as f:
        f.write(log)
    if p.returncode != 0:
        raise RuntimeError(f"{name}: gpt-train failed ({p.returncode}); see {name}.log")
    rows = [json.loads(line) for line in open(metrics) if '"loss"' in line and '"split"' not in line]
    step_ms = [r["ms_per_iter"] if "ms_per_iter" in r else 1e3 * 8 * 256 / r["tokens_per_s"] for r in rows[1:]]
    # The log's memory figure is the fullest rank's; the start-up prediction prints each distinct stage.
    unit = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}
    stages = re.findall(r"pipeline stage \d+ of \d+: .* = ([0-9.]+) (GiB|MiB|KiB)", log)
    pred_mem = max(float(v) * unit[u] for v, u in stages) if stages else None
    meas_mem = rows[-1].get("mem_peak_bytes")
    # A shared machine only ever slows a step down: the fastest timed step is the least disturbed.
    return dict(layout=(tp, pp, dp), step_ms=min(step_ms), median_step_ms=statistics.median(step_ms),
                load=load, wall_s=wall, predicted_mem=pred_mem, measured_mem=meas_mem)


def predict(gpt_train, work, hw, tp, pp, dp):
    cfg = os.path.join(work, f"tp{tp}_pp{pp}_dp{dp}.yaml")
    p = subprocess.run([gpt_train, "plan", "--config", cfg, "--gpus", str(tp * pp * dp), "--gpus-per-node",
                        str(tp * pp * dp), "--hardware", hw, "--json", "--recompute", "none",
                        "--distributed-optimizer", "off"], capture_output=True, text=True, check=True)
    plan = json.loads(p.stdout)
    for e in plan["layouts"]:
        if (e["tp"], e["pp"], e["dp"], e["vpp"], e["micro_batch"]) == (tp, pp, dp, 1, 2):
            return e
    raise RuntimeError(f"layout {tp},{pp},{dp} not in the plan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpt-train", default=os.path.join(REPO, "build", "gpt-train"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--work-dir", default=os.path.join(REPO, "runs", "plan-cpu-check"))
    ap.add_argument("--wait-idle", type=float, default=0, help="wait up to this long for an idle machine per run")
    a = ap.parse_args()
    os.makedirs(a.work_dir, exist_ok=True)
    ncpu = os.cpu_count() or 1
    hw = os.path.join(a.work_dir, "cpu-probe.yaml")
    wait_idle(a.wait_idle, ncpu)
    subprocess.run([a.gpt_train, "plan", "--probe", hw, "--threads", "1", "--gpus-per-node", "2"], check=True,
                   capture_output=True, env=env1())
    results = []
    for tp, pp, dp in LAYOUTS:
        wait_idle(a.wait_idle, ncpu)
        r = run_layout(a.gpt_train, a.work_dir, tp, pp, dp, a.steps)
        r["plan"] = predict(a.gpt_train, a.work_dir, hw, tp, pp, dp)
        results.append(r)
    print("config M fp32, global batch 8 in microbatches of 2, one thread per rank; hardware from "
          "'gpt-train plan --probe'\n")
    print("| layout | load | measured step (fastest, wall) | median step | predicted step | error | "
          "memory measured (fullest rank) | predicted | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    bad = busy = False
    for r in results:
        pred_ms = 1e3 * r["plan"]["step_time_s"]
        et = pred_ms / r["step_ms"] - 1
        em = r["predicted_mem"] / r["measured_mem"] - 1 if r["predicted_mem"] and r["measured_mem"] else float("nan")
        busy = busy or r["load"] > 0.75 * ncpu
        bad = bad or abs(et) > 0.20 or not abs(em) <= 0.20
        print(f"| {r['layout']} | {r['load']:.1f} | {r['step_ms']:.0f} ms | {r['median_step_ms']:.0f} ms | "
              f"{pred_ms:.0f} ms | {100 * et:+.1f}% | {r['measured_mem'] / 2**20:.1f} MiB | "
              f"{r['predicted_mem'] / 2**20:.1f} MiB | {100 * em:+.2f}% |")
    if busy:
        print(f"\nwarning: some runs started with a load above {0.75 * ncpu:.1f} on {ncpu} cores; their measured "
              "steps are slowed by other work (use --wait-idle)")
    with open(os.path.join(a.work_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
