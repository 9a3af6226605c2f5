"""A failing rank ends an 8-rank gpt-train job (tensor 2 x pipeline 2 x data 2) under mpirun within a
bounded time, with a message naming a rank, and leaves no process behind:
- one rank killed with SIGKILL;
- one rank that reads bad input (a token id outside the vocabulary in the data shard);
- one rank that stops responding (SIGSTOP): the other ranks' watchdogs fire after training.step_timeout_s;
- mpirun itself killed: the orphaned ranks notice their launcher is gone and exit.
usage: failure_test.py MPIRUN GPT_TRAIN SOURCE_DIR"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_util import Checks, Job, make_workdir  # noqa: E402

MPIRUN, GPT_TRAIN, SOURCE_DIR = sys.argv[1:4]
CONFIG = os.path.join(SOURCE_DIR, "configs", "tiny-cpu.yaml")
NP = 8
BOUND_S = 60  # the job must be gone this long after the failure
WORK = make_workdir("gpt_failure_test_")
SETS = ["parallel.tensor=2", "parallel.pipeline=2", "training.micro_batch_size=2", "training.train_iters=100000",
        "logging.interval=1", "logging.metrics_file=", "eval.interval=0", "training.step_timeout_s=5"]


def start(name, extra=()):
    return Job(MPIRUN, GPT_TRAIN, NP, CONFIG, SETS + list(extra), WORK, name)


def killed_rank():
    job = start("sigkill")
    try:
        pids = job.wait_for_ranks(NP)
        job.wait_for_iteration(3)
        t0 = time.monotonic()
        os.kill(pids[3], signal.SIGKILL)
        out, took = job.expect_failed_within(t0, BOUND_S, "SIGKILL of rank 3")
        # mpirun names the rank that died.
        assert re.search(r"rank 3 with PID \d+ on node \S+ exited on signal 9", out), out
        print(f"     job ended {took:.1f} s after rank 3 was killed")
    finally:
        job.cleanup()


def make_bad_shard():
    """A byte-level shard from generated text, then one token in every 997 set to 300 (>= the vocabulary
    of 257): only the ranks whose samples cover such a token fail, and only when they read it."""
    text = os.path.join(WORK, "corpus.txt")
    with open(text, "w") as f:
        for i in range(4000):
            f.write(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7919 % 1000}\n")
    prefix = os.path.join(WORK, "shards", "bad")
    subprocess.run([GPT_TRAIN, "prep", "--input", text, "--output-prefix", prefix, "--tokenizer", "bytes",
                    "--workers", "1"], check=True, stdout=subprocess.DEVNULL)
    shards = sorted(f for f in os.listdir(os.path.dirname(prefix)) if f.endswith(".h5"))
    assert shards, "prep wrote no shard"
    path = os.path.join(os.path.dirname(prefix), shards[0])
    code = ("import h5py,sys\n"
            "f=h5py.File(sys.argv[1],'r+'); t=f['tokens']; n=t.shape[0]\n"
            "for i in range(500, n, 997): t[i]=300\n"
            "f.close()\n")
    subprocess.run(["/usr/bin/python3", "-c", code, path], check=True)
    return prefix


def bad_input_rank():
    prefix = make_bad_shard()
    job = start("bad_token", [f"data.train=[{prefix}]", "data.tokenizer=bytes", "model.vocab_size=257",
                              "data.split=100,0,0"])
    try:
        t0 = time.monotonic()
        out, took = job.expect_failed_within(t0, BOUND_S, "the bad token")
        m = re.search(r"gpt-train: \[rank (\d+)\] error: .*has id 300, outside its vocabulary of 257", out)
        assert m, out
        print(f"     rank {m.group(1)} reported the bad token; job ended after {took:.1f} s")
    finally:
        job.cleanup()


def stuck_rank():
    job = start("sigstop")
    try:
        pids = job.wait_for_ranks(NP)
        job.wait_for_iteration(3)
        t0 = time.monotonic()
        os.kill(pids[5], signal.SIGSTOP)
        out, took = job.expect_failed_within(t0, BOUND_S, "SIGSTOP of rank 5")
        m = re.search(r"gpt-train: \[rank (\d+)\] watchdog: iteration \d+ has made no progress for [\d.]+ s "
                      r"\(training.step_timeout_s = 5\)", out)
        assert m, out
        assert m.group(1) != "5", "the stopped rank cannot report"
        assert re.search(r"census: rank 5 stalled", out), out  # rank 0's census names it
        assert took >= 5, f"the watchdog fired after {took:.1f} s, before the 5 s timeout"
        print(f"     rank {m.group(1)}'s watchdog fired; job ended {took:.1f} s after rank 5 stopped")
    finally:
        job.cleanup()


def launcher_killed():
    job = start("mpirun_killed")
    try:
        job.wait_for_ranks(NP)
        job.wait_for_iteration(3)
        t0 = time.monotonic()
        os.kill(job.proc.pid, signal.SIGKILL)
        job.proc.wait()
        while job.rank_pids() and time.monotonic() - t0 < BOUND_S:
            time.sleep(0.1)
        left = job.rank_pids()
        assert not left, f"ranks {sorted(left)} still alive {BOUND_S} s after mpirun was killed"
        print(f"     orphaned ranks gone {time.monotonic() - t0:.1f} s after mpirun was killed")
    finally:
        job.cleanup()


checks = Checks()
checks.run("killed_rank_ends_the_job_naming_it", killed_rank)
checks.run("bad_input_on_one_rank_ends_the_job_naming_it", bad_input_rank)
checks.run("stuck_rank_is_caught_by_the_watchdog", stuck_rank)
checks.run("ranks_exit_when_mpirun_is_killed", launcher_killed)
shutil.rmtree(WORK, ignore_errors=True)
checks.finish()
