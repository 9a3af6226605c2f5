#!/usr/bin/python3
"""CPU benchmark harness: gpt-train against an equivalent PyTorch training step, in one run, on this machine.

    compare.py [--configs S,M,124M] [--dtypes fp32,bf16] [--threads K] [--layouts] [--recompute] [--no-throughput]
               [--attention-lengths T,... [--baseline-gpt-train PATH]]
               [--gpt-train PATH] [--gemm-peak PATH] [--work-dir DIR] [--openblas-coretype NAME]
               [--steps-scale X] [--timeout SECONDS] [--wait-idle SECONDS] [--idle-threshold F]

Throughput part (default): measures the machine's GEMM peak (bench/gemm_peak: gpt-train's oneDNN matmul
in fp32 and bf16, with the ISA oneDNN picked; bench/torch_gemm_peak.py: PyTorch's bf16 and fp32 matmul), then for
every config and dtype runs `gpt-train train` on random tokens and scripts/bench_torch.py (the same
architecture, AdamW with gpt-train's defaults, global-norm clipping at 1.0), each under /usr/bin/time -v,
one right after the other. Both get OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = K and OMP_WAIT_POLICY=PASSIVE.
One microbatch per step on both sides (micro batch = global batch = the config's batch).

Layout part (--layouts): config M in fp32 under mpirun at (tp,pp,dp) = (1,1,1) with K and with 1 thread,
and (1,1,2), (2,1,1), (1,2,1), (1,2,1) interleaved, with one thread per rank; global batch 8 in
microbatches of 2 for every layout, so each does the same arithmetic per step (1 warmup + 3 timed steps).
Reports tokens/s and the per-rank communication volume that gpt-train's byte counters log, next to the
volume the layout implies.

Attention part (--attention-lengths T,...): a 4-layer model (hidden 256, 4 heads of 64, vocab 8192) at
each sequence length T with 4096 tokens per step (batch 4096 / T), in every dtype: gpt-train (fused
attention), a baseline gpt-train given by --baseline-gpt-train (e.g. a build of the commit before fused
attention, whose attention kept the [B, H, T, T] softmax), and PyTorch's step (bench_torch.py, which
materialises the softmax too); tokens/s and peak RSS of each.

Recomputation part (--recompute): for every config and dtype, gpt-train again with training.recompute =
selective (the GELU output recomputed; model/transformer_block.h) and full (each block's forward rerun
before its backward); the table shows the step time each costs and the memory it saves against recompute = none
(the throughput run, or a fresh one under --no-throughput): the trainer's own allocation peak of the
step, and the process's peak RSS.

Definitions (printed with the tables):
  tokens/s   tokens per step / mean step time over the timed steps (the first `warmup` steps are dropped;
             bench_torch.py reports the same statistic); gpt-train's median step is shown as well.
  GFLOP/s    Megatron's model FLOPs per step, 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) with V the padded
             vocabulary (app/flops.h, the number gpt-train logs as TFLOP/s/device), times steps per
             second. The same formula for both sides; it counts the full (unmasked) attention products.
  % peak     achieved GFLOP/s / the machine's measured GEMM peak of the same dtype: the fastest of
             PyTorch's matmul and gpt-train's oneDNN matmul.
  peak RSS   maximum resident set size of the process (per rank), from /usr/bin/time -v.
  CPU %      the process's CPU time / wall time (/usr/bin/time); well under 100 x K means other work on
             the machine took cores during the run, and the load column is the 1-minute load before it.
             On a shared machine, --wait-idle S holds each run back (up to S seconds) until the cores are
             idle, so that runs start on a quiet machine.
Results also go to DIR/results.json.
"""

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (layers, hidden, heads, seq, batch, vocab, warmup steps, timed steps)
CONFIGS = {
    "S": (4, 256, 4, 256, 8, 8192, 2, 6),
    "M": (6, 384, 6, 256, 8, 50304, 2, 5),
    "124M": (12, 768, 12, 1024, 4, 50257, 1, 2),
}

# (label, tp, pp, vpp, dp, threads per rank); threads None = the --threads value.
LAYOUTS = [
    ("(1,1,1)", 1, 1, 1, 1, None),
    ("(1,1,1) 1 thread", 1, 1, 1, 1, 1),
    ("(1,1,2)", 1, 1, 1, 2, 1),
    ("(2,1,1)", 2, 1, 1, 1, 1),
    ("(1,2,1)", 1, 2, 1, 1, 1),
    # Config M has 6 layers: layers must divide by pp * vpp, so the interleaved run uses vpp = 3.
    ("(1,2,1) vpp=3", 1, 2, 3, 1, 1),
]
LAYOUT_GLOBAL_BATCH, LAYOUT_MICRO_BATCH = 8, 2
LAYOUT_WARMUP, LAYOUT_STEPS = 1, 3


def padded_vocab(vocab, tp=1, divisible_by=128):
    multiple = divisible_by * tp
    return (vocab + multiple - 1) // multiple * multiple


def model_flops_per_step(batch, seq, layers, hidden, vocab):
    """Megatron's model FLOPs for one step (app/flops.h)."""
    return 72.0 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


def parameter_count(layers, hidden, seq, vocab_padded, ffn=None):
    ffn = ffn or 4 * hidden
    per_layer = 4 * hidden + (3 * hidden * hidden + 3 * hidden) + (hidden * hidden + hidden) + \
        (ffn * hidden + ffn) + (hidden * ffn + hidden)
    return vocab_padded * hidden + seq * hidden + layers * per_layer + 2 * hidden


# ---- running a measured process ----

TIME_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
TIME_CPU = re.compile(r"Percent of CPU this job got: (\d+)%")


def read_time_file(path):
    """(peak RSS in MB, CPU percent) from a /usr/bin/time -v report."""
    try:
        text = open(path).read()
    except OSError:
        return None, None
    rss, cpu = TIME_RSS.search(text), TIME_CPU.search(text)
    return (int(rss.group(1)) / 1024.0 if rss else None), (int(cpu.group(1)) if cpu else None)


def run_logged(cmd, env, log_path, timeout):
    """Runs cmd (its own process group) with stdout+stderr to log_path; returns (exit code or 'timeout', s)."""
    start = time.time()
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    return rc, time.time() - start


def cpu_idle_fraction(seconds):
    """Fraction of all cores' time spent idle over the next `seconds` (from /proc/stat)."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total
    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_for_idle(args):
    """Waits (up to --wait-idle seconds) until the machine is idle enough to measure; returns seconds waited."""
    start = time.time()
    while time.time() - start < args.wait_idle:
        if cpu_idle_fraction(2.0) >= args.idle_threshold:
            break
    return time.time() - start


def load_average():
    try:
        return float(open("/proc/loadavg").read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def thread_env(threads, coretype):
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def last_json_line(path):
    with open(path) as f:
        for line in reversed(f.read().splitlines()):
            if line.startswith("{"):
                return json.loads(line)
    raise RuntimeError(f"{path}: no JSON result line")


# ---- the two sides ----

def gpt_train_args(args, layers, hidden, heads, seq, vocab, global_batch, micro_batch, iters, dtype, metrics,
                   tp=1, pp=1, vpp=1, recompute="none"):
    sets = {
        "model.num_layers": layers, "model.hidden_size": hidden, "model.num_heads": heads,
        "model.ffn_hidden_size": 0, "model.seq_length": seq, "model.vocab_size": vocab,
        "training.micro_batch_size": micro_batch, "training.global_batch_size": global_batch,
        "training.train_iters": iters, "training.recompute": recompute, "training.threads": 0,
        "data.synthetic": "random", "precision.dtype": dtype,
        "parallel.tensor": tp, "parallel.pipeline": pp, "parallel.virtual_pipeline": vpp, "parallel.data": 0,
        # bench_torch.py: AdamW lr 1e-4 (constant), wd 0.1, betas (0.9, 0.95), eps 1e-8, clip 1.0.
        "optimizer.lr": 1e-4, "optimizer.min_lr": 1e-4, "optimizer.warmup_iters": 0,
        "optimizer.weight_decay": 0.1, "optimizer.beta1": 0.9, "optimizer.beta2": 0.95, "optimizer.eps": 1e-8,
        "optimizer.clip_grad": 1.0,
        "eval.interval": 0, "logging.interval": 1, "logging.metrics_file": metrics,
    }
    cmd = [args.gpt_train, "train", "--config", os.path.join(REPO, "configs", "tiny-cpu.yaml")]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def summarize_metrics(metrics, warmup):
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    rows = [r for r in rows if r.get("event", "train") == "train"]
    timed = rows[warmup:]
    if not timed:
        raise RuntimeError(f"{metrics}: no timed iterations (got {len(rows)}, warmup {warmup})")
    ms = [r["ms_per_iter"] for r in timed]
    return {"step_ms": statistics.mean(ms), "median_step_ms": statistics.median(ms),
            "final_loss": timed[-1]["loss"], "mem_peak_mb": timed[-1].get("mem_peak_bytes", 0) / 2 ** 20,
            "logged_tflops": statistics.median(r["tflops_per_device"] for r in timed)}


def run_ours(args, name, dtype, out_dir, recompute="none", binary=None, impl="gpt-train"):
    layers, hidden, heads, seq, batch, vocab, warmup, steps = CONFIGS[name]
    steps = max(1, round(steps * args.steps_scale))
    tag = f"{name}-{dtype}-{impl}" + ("" if recompute == "none" else f"-recompute-{recompute}")
    metrics, time_file = os.path.join(out_dir, tag + ".jsonl"), os.path.join(out_dir, tag + ".time")
    for path in (metrics, time_file):
        if os.path.exists(path):
            os.remove(path)  # the metrics writer appends
    cmd = ["/usr/bin/time", "-v", "-o", time_file] + gpt_train_args(
        args, layers, hidden, heads, seq, vocab, batch, batch, warmup + steps, dtype, metrics, recompute=recompute)
    if binary:
        cmd[cmd.index(args.gpt_train)] = binary
    waited = wait_for_idle(args)
    result = {"impl": impl, "config": name, "dtype": dtype, "recompute": recompute, "load_before": load_average(),
              "waited_for_idle_s": waited, "command": shlex.join(cmd)}
    rc, wall = run_logged(cmd, thread_env(args.threads, args.openblas_coretype), os.path.join(out_dir, tag + ".log"),
                          args.timeout)
    result.update(rc=rc, wall_s=wall)
    result["peak_rss_mb"], result["cpu_percent"] = read_time_file(time_file)
    if rc == 0:
        result.update(summarize_metrics(metrics, warmup))
        result["tokens_per_s"] = batch * seq / (result["step_ms"] / 1e3)
        result["median_tokens_per_s"] = batch * seq / (result["median_step_ms"] / 1e3)
    return result


JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def torch_env(args):
    """PyTorch's environment: the thread settings, plus jemalloc keeping freed memory (--torch-malloc).

    PyTorch's CPU tensors come from malloc, and glibc serves every block over 32 MiB with a fresh mmap that
    is unmapped again on free, so each step page-faults (and the kernel zeroes) its whole working set; on
    this VM that tripled PyTorch's step time. jemalloc told never to return memory (the usual advice for
    PyTorch on CPUs) behaves like gpt-train's block pool and is the stronger peer, so it is the default.
    """
    env = thread_env(args.threads, args.openblas_coretype)
    if args.torch_malloc == "jemalloc":
        env["LD_PRELOAD"] = JEMALLOC
        env["MALLOC_CONF"] = "dirty_decay_ms:-1,muzzy_decay_ms:-1,retain:true"
    return env


def run_torch(args, name, dtype, out_dir):
    layers, hidden, heads, seq, batch, vocab, warmup, steps = CONFIGS[name]
    steps = max(1, round(steps * args.steps_scale))
    tag = f"{name}-{dtype}-pytorch"
    time_file, log = os.path.join(out_dir, tag + ".time"), os.path.join(out_dir, tag + ".log")
    cmd = ["/usr/bin/time", "-v", "-o", time_file, "/usr/bin/python3", os.path.join(REPO, "scripts", "bench_torch.py"),
           "--layers", str(layers), "--hidden", str(hidden), "--heads", str(heads), "--seq", str(seq),
           "--batch", str(batch), "--vocab", str(vocab), "--steps", str(steps), "--warmup", str(warmup),
           "--threads", str(args.threads), "--dtype", dtype, "--json"]
    waited = wait_for_idle(args)
    result = {"impl": "pytorch", "config": name, "dtype": dtype, "load_before": load_average(),
              "waited_for_idle_s": waited, "command": shlex.join(cmd), "malloc": args.torch_malloc}
    rc, wall = run_logged(cmd, torch_env(args), log, args.timeout)
    result.update(rc=rc, wall_s=wall)
    result["peak_rss_mb"], result["cpu_percent"] = read_time_file(time_file)
    if rc == 0:
        line = last_json_line(log)
        result.update(tokens_per_s=line["tokens_per_s"], step_ms=line["step_ms"], final_loss=line["final_loss"],
                      parameters=line["parameters"])
    return result


def measure_peaks(args, out_dir):
    env = thread_env(args.threads, args.openblas_coretype)
    peaks = {}
    rc, _ = run_logged([args.gemm_peak, "--threads", str(args.threads), "--sizes", "1024,2048", "--min-seconds", "1",
                        "--json"], env, os.path.join(out_dir, "gemm_peak.log"), 600)
    if rc == 0:
        peaks["gpt_train"] = last_json_line(os.path.join(out_dir, "gemm_peak.log"))
    rc, _ = run_logged(["/usr/bin/python3", os.path.join(REPO, "bench", "torch_gemm_peak.py"), "--threads",
                        str(args.threads), "--sizes", "1024,2048", "--min-seconds", "1"], env,
                       os.path.join(out_dir, "torch_gemm_peak.log"), 600)
    if rc == 0:
        peaks["torch"] = last_json_line(os.path.join(out_dir, "torch_gemm_peak.log"))
    ob, tg = peaks.get("gpt_train", {}), peaks.get("torch", {})
    # The machine's peak per dtype: the fastest GEMM measured here, whoever's it is.
    candidates = {
        "fp32": {"PyTorch fp32 matmul": tg.get("fp32_gflops"),
                 "gpt-train fp32 matmul (oneDNN)": ob.get("gpt_train_f32_gflops")},
        "bf16": {"PyTorch bf16 matmul (oneDNN)": tg.get("bf16_gflops"),
                 "gpt-train bf16 matmul (oneDNN)": ob.get("gpt_train_bf16_gflops")},
    }
    for dtype, rates in candidates.items():
        rates = {k: v for k, v in rates.items() if v}
        source = max(rates, key=rates.get) if rates else None
        peaks.update({f"{dtype}_all": rates, f"{dtype}_source": source,
                      f"{dtype}_gflops": rates[source] if rates else None})
    return peaks


def best_peaks(first, second):
    """The higher of two peak measurements, figure by figure."""
    best = dict(second)
    for key in ("fp32_gflops", "bf16_gflops"):
        values = [p[key] for p in (first, second) if p.get(key)]
        best[key] = max(values) if values else None
    for dtype in ("fp32", "bf16"):
        if first.get(f"{dtype}_gflops") and first[f"{dtype}_gflops"] == best[f"{dtype}_gflops"]:
            best[f"{dtype}_source"] = first.get(f"{dtype}_source")
        best[f"{dtype}_all"] = {k: max(p.get(f"{dtype}_all", {}).get(k) or 0 for p in (first, second))
                                for k in set(first.get(f"{dtype}_all", {})) | set(second.get(f"{dtype}_all", {}))}
    for side, key in (("gpt_train", "gpt_train_f32_gflops"), ("torch", "bf16_gflops")):
        if first.get(side, {}).get(key, 0) > second.get(side, {}).get(key, 0):
            best[side] = first[side]
    best["measurements"] = [first, second]
    return best


# ---- layouts ----

def theoretical_layout_bytes(layout, layers, hidden, seq, vocab):
    """Bytes per step per rank that gpt-train's counters should show for config M at this layout.

    The counters (parallel/comm/mpi_communicator.cpp) add the buffer size once per collective call (an
    all-reduce of N bytes counts N whatever the algorithm moves; a ring all-reduce sends and receives
    2 (n-1)/n N per rank, which for n = 2 is N) and add the tensor size for every posted send and every
    posted receive, so a p2p transfer counts on both ranks.
    """
    _, tp, pp, vpp, dp, _ = layout
    b, s, h = LAYOUT_MICRO_BATCH, seq, hidden
    mb_per_rank = LAYOUT_GLOBAL_BATCH // (LAYOUT_MICRO_BATCH * dp)
    act = b * s * h * 4
    out = {"tp": 0.0, "pp": 0.0, "dp": 0.0, "embedding": 0.0}
    vp = padded_vocab(vocab, tp)
    if tp > 1:
        # Per microbatch: 2 all-reduces forward (attention and MLP outputs) and 2 backward (their inputs)
        # per layer, the vocab-parallel embedding's forward all-reduce, the LM head input's backward
        # all-reduce, and the cross-entropy's three [b*s] all-reduces (max, target logit, sum of exps).
        out["tp"] = mb_per_rank * ((4 * layers + 2) * act + 3 * b * s * 4)
    if pp > 1:
        boundaries = pp * vpp - 1  # chunk-to-chunk hand-overs per microbatch, each crossing ranks
        # Each boundary: activations forward, their gradient backward; rank 0 takes part in `ends` ends.
        ends = 2 * boundaries / pp  # average over ranks; exact for pp = 2
        out["pp"] = mb_per_rank * 2 * ends * act
        # Tied word embedding: its gradient is all-reduced between the first and last stage every step
        # (the embedding group, which the log line does not show).
        out["embedding"] = vp * h * 4 / tp
    if dp > 1:
        out["dp"] = parameter_count(layers, h, s, vp) * 4 / (tp * pp)
    return out


LAYOUT_LINE = re.compile(r"layout tp=(\d+) pp=(\d+) vpp=(\d+) dp=(\d+) \| rank 0 time in communication: "
                         r"tp ([\d.]+)% \(([\d.]+) MB/step\) pp ([\d.]+)% \(([\d.]+) MB/step\) "
                         r"dp ([\d.]+)% \(([\d.]+) MB/step\)")


def run_layout(args, layout, out_dir):
    label, tp, pp, vpp, dp, threads = layout
    threads = threads or args.threads
    layers, hidden, heads, seq, _, vocab, _, _ = CONFIGS["M"]
    warmup, steps = LAYOUT_WARMUP, max(1, round(LAYOUT_STEPS * args.steps_scale))
    world = tp * pp * dp
    tag = "layout-" + re.sub(r"[^0-9a-z]+", "_", label.lower()).strip("_")
    metrics, log = os.path.join(out_dir, tag + ".jsonl"), os.path.join(out_dir, tag + ".log")
    time_prefix = os.path.join(out_dir, tag + ".time")
    for path in [metrics] + [f"{time_prefix}.{r}" for r in range(world)]:
        if os.path.exists(path):
            os.remove(path)
    train = gpt_train_args(args, layers, hidden, heads, seq, vocab, LAYOUT_GLOBAL_BATCH, LAYOUT_MICRO_BATCH,
                           warmup + steps, "fp32", metrics, tp=tp, pp=pp, vpp=vpp)
    # Each rank runs under its own /usr/bin/time, writing to a file named after its MPI rank.
    ranked = "exec /usr/bin/time -v -o " + shlex.quote(time_prefix) + ".$OMPI_COMM_WORLD_RANK " + shlex.join(train)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(world)]
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY") + \
            (("OPENBLAS_CORETYPE",) if args.openblas_coretype else ()):
        cmd += ["-x", var]
    cmd += ["sh", "-c", ranked]
    waited = wait_for_idle(args)
    result = {"layout": label, "tp": tp, "pp": pp, "vpp": vpp, "dp": dp, "threads_per_rank": threads,
              "load_before": load_average(), "waited_for_idle_s": waited, "command": shlex.join(cmd)}
    rc, wall = run_logged(cmd, thread_env(threads, args.openblas_coretype), log, args.timeout)
    result.update(rc=rc, wall_s=wall)
    rss = [read_time_file(f"{time_prefix}.{r}")[0] for r in range(world)]
    result["peak_rss_mb_per_rank"] = rss
    if rc != 0:
        return result
    result.update(summarize_metrics(metrics, warmup))
    result["tokens_per_s"] = LAYOUT_GLOBAL_BATCH * seq / (result["step_ms"] / 1e3)
    comm = [m.groups() for m in LAYOUT_LINE.finditer(open(log).read())][warmup:]
    if comm:
        result["comm_percent"] = {k: statistics.median(float(c[i]) for c in comm)
                                  for k, i in (("tp", 4), ("pp", 6), ("dp", 8))}
        result["comm_mb_per_step"] = {k: statistics.median(float(c[i]) for c in comm)
                                      for k, i in (("tp", 5), ("pp", 7), ("dp", 9))}
    result["theory_mb_per_step"] = {k: v / 1e6 for k, v in
                                    theoretical_layout_bytes(layout, layers, hidden, seq, vocab).items()}
    return result


# ---- tables ----

def fmt(value, spec=".0f", none="-"):
    return none if value is None else format(value, spec)


def print_table_head(head):
    print(head)
    print("|" + "---|" * (head.count("|") - 1))


def cpu_description():
    """The CPU model, family/model numbers and the vector extensions that matter here, from /proc/cpuinfo."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
    except OSError:
        return "unknown CPU"
    flags = set(info.get("flags", "").split())
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return (f"{info.get('model name', 'unknown CPU')} (family {info.get('cpu family', '?')}, model "
            f"{info.get('model', '?')}; {', '.join(isa) or 'no AVX2'}; {os.cpu_count()} logical CPUs)")


def print_throughput(rows, peaks, threads):
    malloc = next((r.get("malloc") for r in rows if r["impl"] == "pytorch"), None)
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    print(f"\nCPU: {cpu_description()}" + (f"; ONEDNN_MAX_CPU_ISA={cap} for every process" if cap else ""))
    print(f"\nThroughput, {threads} threads per process (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = {threads}, "
          f"OMP_WAIT_POLICY=PASSIVE for both; PyTorch's malloc: {malloc})")
    ob = peaks.get("gpt_train", {})
    print(f"GEMM peak: fp32 {fmt(peaks.get('fp32_gflops'), '.1f')} GFLOP/s ({peaks.get('fp32_source')}; all: "
          f"{', '.join(f'{k} {v:.1f}' for k, v in peaks.get('fp32_all', {}).items())}; gpt-train's oneDNN ISA "
          f"{ob.get('isa', '?')}); bf16 {fmt(peaks.get('bf16_gflops'), '.1f')} GFLOP/s ({peaks.get('bf16_source')}; "
          f"all: {', '.join(f'{k} {v:.1f}' for k, v in peaks.get('bf16_all', {}).items())})")
    print("GFLOP/s = 72 B s l h^2 (1 + s/6h + V/12lh) per step (Megatron, V padded) x steps/s; tokens/s from the "
          "mean timed step\n")
    head = ("| config | dtype | gpt-train tok/s (median) | PyTorch tok/s | ratio | gpt-train GFLOP/s | % peak | "
            "PyTorch GFLOP/s | % peak | gpt-train RSS MB | PyTorch RSS MB | CPU % | load |")
    print_table_head(head)
    by_key = {(r["config"], r["dtype"], r["impl"]): r for r in rows}
    for name in CONFIGS:
        layers, hidden, heads, seq, batch, vocab, _, _ = CONFIGS[name]
        flops = model_flops_per_step(batch, seq, layers, hidden, padded_vocab(vocab))
        for dtype in ("fp32", "bf16"):
            ours, torch = by_key.get((name, dtype, "gpt-train")), by_key.get((name, dtype, "pytorch"))
            if not ours and not torch:
                continue
            peak = peaks.get("fp32_gflops" if dtype == "fp32" else "bf16_gflops")

            def cells(r):
                if not r or r.get("rc") != 0:
                    return ["failed" if r else "-", "-", "-"]
                gf = flops * r["tokens_per_s"] / (batch * seq) / 1e9
                r["gflops"] = gf
                r["fraction_of_peak"] = gf / peak if peak else None
                return [fmt(r["tokens_per_s"]), fmt(gf, ".1f"), fmt(100 * gf / peak, ".0f") + "%" if peak else "-"]

            o, t = cells(ours), cells(torch)
            ratio = (ours["tokens_per_s"] / torch["tokens_per_s"]
                     if ours and torch and ours.get("rc") == 0 and torch.get("rc") == 0 else None)
            median = f" ({fmt(ours.get('median_tokens_per_s'))})" if ours and ours.get("rc") == 0 else ""
            load = "/".join(fmt(r.get("load_before"), ".1f") for r in (ours, torch) if r)
            cpu = "/".join(fmt(r.get("cpu_percent")) for r in (ours, torch) if r)
            print(f"| {name} | {dtype} | {o[0]}{median} | {t[0]} | {fmt(ratio, '.2f')}x | {o[1]} | {o[2]} | {t[1]} | "
                  f"{t[2]} | {fmt(ours and ours.get('peak_rss_mb'))} | {fmt(torch and torch.get('peak_rss_mb'))} | "
                  f"{cpu} | {load} |")


def attention_config(T):
    return f"T{T}"


def print_attention(rows, lengths):
    print("\nAttention: 4 layers, hidden 256, 4 heads of 64, vocab 8192, 4096 tokens per step (batch 4096/T); "
          "fused = this gpt-train, materialised = --baseline-gpt-train; RSS = peak resident set size\n")
    head = ("| T | batch | dtype | fused tok/s | materialised tok/s | fused / materialised | PyTorch tok/s | "
            "fused / PyTorch | fused RSS MB | materialised RSS MB | PyTorch RSS MB | CPU % |")
    print_table_head(head)
    by_key = {(r["config"], r["dtype"], r["impl"]): r for r in rows}
    for T in lengths:
        name = attention_config(T)
        for dtype in ("fp32", "bf16"):
            f, m, t = (by_key.get((name, dtype, impl)) for impl in ("gpt-train", "materialized", "pytorch"))
            if not f and not m and not t:
                continue

            def tok(r):
                return r.get("tokens_per_s") if r and r.get("rc") == 0 else None

            def ratio(a, b):
                return fmt(tok(a) / tok(b), ".2f") + "x" if tok(a) and tok(b) else "-"

            cpu = "/".join(fmt(r.get("cpu_percent")) for r in (f, m, t) if r)
            print(f"| {T} | {CONFIGS[name][4]} | {dtype} | {fmt(tok(f))} | {fmt(tok(m))} | {ratio(f, m)} | "
                  f"{fmt(tok(t))} | {ratio(f, t)} | {fmt(f and f.get('peak_rss_mb'))} | "
                  f"{fmt(m and m.get('peak_rss_mb'))} | {fmt(t and t.get('peak_rss_mb'))} | {cpu} |")


def print_recompute(rows):
    print("\nActivation recomputation (gpt-train, training.recompute): step time and memory against 'none'")
    print("peak MB = the trainer's allocation high-water mark of the step (tensors only; logged as mem_peak); "
          "RSS = /usr/bin/time's maximum resident set size\n")
    head = ("| config | dtype | recompute | tok/s | step ms | time cost | peak MB | saved MB | saved | RSS MB | "
            "CPU % |")
    print_table_head(head)
    by_key = {(r["config"], r["dtype"], r["recompute"]): r for r in rows}
    for name in CONFIGS:
        for dtype in ("fp32", "bf16"):
            base = by_key.get((name, dtype, "none"))
            for mode in ("none", "selective", "full"):
                r = by_key.get((name, dtype, mode))
                if not r:
                    continue
                if r.get("rc") != 0:
                    print(f"| {name} | {dtype} | {mode} | failed ({r.get('rc')}) |" + " - |" * 7)
                    continue
                ok = base and base.get("rc") == 0
                cost = fmt(100 * (r["step_ms"] / base["step_ms"] - 1), "+.1f") + "%" if ok else "-"
                saved = base["mem_peak_mb"] - r["mem_peak_mb"] if ok else None
                saved_pct = fmt(100 * saved / base["mem_peak_mb"], ".0f") + "%" if ok and base["mem_peak_mb"] else "-"
                print(f"| {name} | {dtype} | {mode} | {fmt(r['tokens_per_s'])} | {fmt(r['step_ms'])} | {cost} | "
                      f"{fmt(r['mem_peak_mb'])} | {fmt(saved)} | {saved_pct} | {fmt(r.get('peak_rss_mb'))} | "
                      f"{fmt(r.get('cpu_percent'))} |")


def print_layouts(rows):
    print("\nParallel layouts, config M fp32, global batch 8 in microbatches of 2, one thread per rank unless "
          "noted")
    print("MB/step per rank as gpt-train's counters count them (measured on rank 0 | theory); 'emb' is the tied "
          "embedding all-reduce between first and last stage, which the log line does not include\n")
    head = ("| layout | threads/rank | tokens/s | vs (1,1,1) 1 thread | tp MB meas/theory | pp MB meas/theory | "
            "dp MB meas/theory | emb MB theory | comm time tp/pp/dp | peak RSS MB per rank |")
    print_table_head(head)
    base = next((r for r in rows if r["layout"] == "(1,1,1) 1 thread" and r.get("rc") == 0), None)
    for r in rows:
        if r.get("rc") != 0:
            print(f"| {r['layout']} | {r['threads_per_rank']} | failed ({r.get('rc')}) |" + " - |" * 7)
            continue
        meas, th = r.get("comm_mb_per_step", {}), r["theory_mb_per_step"]
        pct = r.get("comm_percent")
        rel = fmt(r["tokens_per_s"] / base["tokens_per_s"], ".2f") + "x" if base else "-"
        cols = [f"{fmt(meas.get(k), '.2f')} / {th[k]:.2f}" for k in ("tp", "pp", "dp")]
        comm = "/".join(fmt(pct[k], ".0f") + "%" for k in ("tp", "pp", "dp")) if pct else "-"
        rss = ", ".join(fmt(x) for x in r["peak_rss_mb_per_rank"])
        print(f"| {r['layout']} | {r['threads_per_rank']} | {fmt(r['tokens_per_s'])} | {rel} | {cols[0]} | "
              f"{cols[1]} | {cols[2]} | {th['embedding']:.2f} | {comm} | {rss} |")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="S,M,124M")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--layouts", action="store_true", help="also run the parallel-layout comparison")
    parser.add_argument("--recompute", action="store_true",
                        help="also run gpt-train with training.recompute=selective and full for each config and "
                             "dtype, and print the memory saved and the time it costs")
    parser.add_argument("--no-throughput", action="store_true", help="skip the gpt-train vs PyTorch part")
    parser.add_argument("--attention-lengths", default="",
                        help="comma-separated sequence lengths for the attention part (e.g. 256,1024,2048,4096)")
    parser.add_argument("--baseline-gpt-train", default="",
                        help="a gpt-train build with materialised attention, for the attention part")
    parser.add_argument("--gpt-train", default=os.path.join(REPO, "build", "gpt-train"))
    parser.add_argument("--gemm-peak", default=os.path.join(REPO, "build", "bench", "gemm_peak"))
    parser.add_argument("--work-dir", default=os.path.join(REPO, "runs", "bench"))
    parser.add_argument("--openblas-coretype", default="",
                        help="set OPENBLAS_CORETYPE for every process (e.g. SkylakeX); default: OpenBLAS's choice")
    parser.add_argument("--torch-malloc", choices=("jemalloc", "glibc"), default="jemalloc",
                        help="PyTorch's allocator: jemalloc keeping freed memory (default; needs libjemalloc2) or "
                             "glibc's malloc")
    parser.add_argument("--steps-scale", type=float, default=1.0, help="multiply every config's timed steps")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per process")
    parser.add_argument("--wait-idle", type=float, default=0,
                        help="before each run, wait up to this many seconds for the CPUs to be idle")
    parser.add_argument("--idle-threshold", type=float, default=0.85,
                        help="idle fraction of all cores (over 2 s) that counts as idle for --wait-idle")
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    try:
        args.attention_lengths = [int(t) for t in args.attention_lengths.split(",") if t]
    except ValueError:
        parser.error(f"--attention-lengths: expected integers, got {args.attention_lengths!r}")
    for T in args.attention_lengths:
        if not 0 < T <= 4096 or 4096 % T:
            parser.error(f"--attention-lengths: {T} must divide 4096")
        CONFIGS[attention_config(T)] = (4, 256, 4, T, 4096 // T, 8192, 1, 3)
    if args.baseline_gpt_train and not os.access(args.baseline_gpt_train, os.X_OK):
        parser.error(f"--baseline-gpt-train: {args.baseline_gpt_train} is not an executable")
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    for c in args.configs:
        if c not in CONFIGS:
            parser.error(f"--configs: unknown config {c!r} (known: {', '.join(CONFIGS)})")
    for d in args.dtypes:
        if d not in ("fp32", "bf16"):
            parser.error(f"--dtypes: unknown dtype {d!r} (fp32 or bf16)")
    if args.threads <= 0 or not args.steps_scale > 0 or not args.timeout > 0:
        parser.error("--threads, --steps-scale and --timeout must be positive")
    if args.wait_idle < 0 or not 0 < args.idle_threshold <= 1:
        parser.error("--wait-idle must not be negative and --idle-threshold must be in (0, 1]")
    if args.torch_malloc == "jemalloc" and not os.path.exists(JEMALLOC):
        parser.error(f"--torch-malloc jemalloc: {JEMALLOC} not found (apt-get install libjemalloc2, or pass "
                     "--torch-malloc glibc)")
    for path, what in ((args.gpt_train, "--gpt-train"), (args.gemm_peak, "--gemm-peak")):
        if not os.access(path, os.X_OK):
            parser.error(f"{what}: {path} is not an executable (build it first)")
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    results = {"threads": args.threads, "openblas_coretype": args.openblas_coretype or None, "cpu": cpu_description(),
               "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
               "started": time.strftime("%Y-%m-%d %H:%M:%S"), "throughput": [], "layouts": [], "recompute": [],
               "attention": []}
    out_json = os.path.join(args.work_dir, "results.json")

    def save():
        with open(out_json, "w") as f:
            json.dump(results, f, indent=1)

    if not args.no_throughput:
        results["peaks"] = measure_peaks(args, args.work_dir)
        save()
        for name in args.configs:
            for dtype in args.dtypes:
                for runner in (run_ours, run_torch):
                    r = runner(args, name, dtype, args.work_dir)
                    print(f"  {r['impl']} {name} {dtype}: rc={r['rc']} {fmt(r.get('tokens_per_s'))} tokens/s "
                          f"({r['wall_s']:.0f} s, load {fmt(r['load_before'], '.1f')})", file=sys.stderr, flush=True)
                    results["throughput"].append(r)
                    save()
        # Measured again after the runs and the better of the two kept: one measurement that happened to
        # share the cores with other work would understate the peak and overstate every % of peak.
        results["peaks"] = best_peaks(results["peaks"], measure_peaks(args, args.work_dir))
        save()
        print_throughput(results["throughput"], results["peaks"], args.threads)
    if args.attention_lengths:
        for T in args.attention_lengths:
            for dtype in args.dtypes:
                name = attention_config(T)
                runners = [lambda: run_ours(args, name, dtype, args.work_dir)]
                if args.baseline_gpt_train:
                    runners.append(lambda: run_ours(args, name, dtype, args.work_dir, binary=args.baseline_gpt_train,
                                                    impl="materialized"))
                runners.append(lambda: run_torch(args, name, dtype, args.work_dir))
                for runner in runners:
                    r = runner()
                    print(f"  {r['impl']} T={T} {dtype}: rc={r['rc']} {fmt(r.get('tokens_per_s'))} tokens/s "
                          f"({r['wall_s']:.0f} s)", file=sys.stderr, flush=True)
                    results["attention"].append(r)
                    save()
        print_attention(results["attention"], args.attention_lengths)
    if args.recompute:
        for name in args.configs:
            for dtype in args.dtypes:
                base = next((r for r in results["throughput"]
                             if r["impl"] == "gpt-train" and r["config"] == name and r["dtype"] == dtype), None)
                modes = ("selective", "full") if base else ("none", "selective", "full")
                if base:
                    results["recompute"].append(base)
                for mode in modes:
                    r = run_ours(args, name, dtype, args.work_dir, recompute=mode)
                    print(f"  gpt-train {name} {dtype} recompute={mode}: rc={r['rc']} {fmt(r.get('tokens_per_s'))} "
                          f"tokens/s ({r['wall_s']:.0f} s)", file=sys.stderr, flush=True)
                    results["recompute"].append(r)
                    save()
        print_recompute(results["recompute"])
    if args.layouts:
        for layout in LAYOUTS:
            r = run_layout(args, layout, args.work_dir)
            print(f"  layout {r['layout']}: rc={r['rc']} {fmt(r.get('tokens_per_s'))} tokens/s ({r['wall_s']:.0f} s)",
                  file=sys.stderr, flush=True)
            results["layouts"].append(r)
            save()
        print_layouts(results["layouts"])
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()
    print(f"\nresults: {out_json}; logs next to it")
    failed = [r for r in results["throughput"] + results["layouts"] + results["recompute"] if r.get("rc") != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
