"""Faults a user or a cluster throws at gpt-train, each run as a real job under mpirun, checking that
nothing is lost, nothing hangs and the message names what went wrong:
- a deleted `latest` next to complete checkpoints: the next run (keep_last 1) resumes the newest one and
  says why, instead of starting again from iteration 0 and pruning it;
- divergence: a run whose loss is NaN at every step stops non-zero without saving, and the last
  checkpoint stays; fp16 overflow skips while the loss scale backs off do not stop a run;
- stalls: a rank stopped (SIGSTOP) during evaluation, start-up, a checkpoint save or a checkpoint load, a
  rank stuck computing, and rank 0 stopped: the job ends within a bound and the census names the stalled
  rank; without MPI_THREAD_MULTIPLE (GPT_TRAIN_MPI_THREADS=funneled) there is no census, and the job still
  ends within the bound;
- ranks started with different configs (an MPMD launch): refused at start-up, naming ranks and keys;
- start-up checks: an unwritable checkpoint.dir, a missing data.valid and a validation split too small
  for one sequence fail before the first step;
- the checkpoint directory lock: a second run on the same directory is refused, naming the holder; a
  lock left by a killed run is taken over with a warning.
usage: fault_injection_test.py MPIRUN GPT_TRAIN SOURCE_DIR"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_util import Checks, Job, latest_checkpoint_iteration, make_workdir  # noqa: E402

MPIRUN, GPT_TRAIN, SOURCE_DIR = sys.argv[1:4]
CONFIG = os.path.join(SOURCE_DIR, "configs", "tiny-cpu.yaml")
WORK = make_workdir("gpt_fault_test_")
QUIET = ["logging.metrics_file=", "logging.interval=1", "eval.interval=0"]
BOUND_S = 60  # a stalled job must be gone this long after the stall


def run(name, np, sets, timeout=120, extra_env=None, argv=None):
    """Runs a job to its end; returns (exit status, output)."""
    job = Job(MPIRUN, GPT_TRAIN, np, CONFIG, QUIET + sets, WORK, name, extra_env=extra_env, argv=argv)
    try:
        rc = job.wait(timeout)
        assert rc is not None, f"{name}: still running after {timeout} s:\n{job.output()}"
        return rc, job.output()
    finally:
        job.cleanup()


def expect(pattern, text, what):
    assert re.search(pattern, text), f"{what}: /{pattern}/ not in output:\n{text[-6000:]}"


# ---- a lost `latest` ----

def missing_latest_resumes_the_newest_checkpoint():
    ckpt = os.path.join(WORK, "no-latest")
    rc, out = run("no-latest-1", 2, [f"checkpoint.dir={ckpt}", "checkpoint.save_interval=10", "training.train_iters=10"])
    assert rc == 0, out
    os.remove(os.path.join(ckpt, "latest"))
    rc, out = run("no-latest-2", 2, [f"checkpoint.dir={ckpt}", "checkpoint.keep_last=1", "training.train_iters=12"])
    assert rc == 0, out
    expect(r"latest is missing: resuming from the most recently saved complete checkpoint, iter_0000010 \(index, "
           r"rank files and checksums verified\)", out, "the log says latest was missing")
    assert "starting from iteration 0" not in out, out
    assert not re.search(r"iteration\s+1/", out), "training started again from iteration 0"
    assert latest_checkpoint_iteration(ckpt) == 12


# ---- divergence ----

def divergence_stops_without_saving():
    ckpt = os.path.join(WORK, "diverge")
    rc, out = run("diverge", 2, [f"checkpoint.dir={ckpt}", "checkpoint.save_interval=2", "training.train_iters=100",
                                 "optimizer.lr=1e3", "optimizer.warmup_iters=0", "training.max_nonfinite_steps=3"])
    assert rc != 0, f"a diverged run exited 0:\n{out}"
    expect(r"training diverged: 3 consecutive steps \(iterations (\d+) to (\d+)\)", out, "divergence message")
    first_bad = int(re.search(r"iterations (\d+) to", out).group(1))
    saved = [int(n[5:]) for n in os.listdir(ckpt) if re.fullmatch(r"iter_\d+", n)]
    assert saved and max(saved) < first_bad, f"saved {sorted(saved)}, first non-finite step {first_bad}"
    assert latest_checkpoint_iteration(ckpt) == max(saved)
    assert "iteration 100/" not in out


def fp16_backoff_skips_do_not_stop_a_run():
    rc, out = run("fp16", 1, ["precision.dtype=fp16", "training.train_iters=30", "training.max_nonfinite_steps=1"])
    assert rc == 0, f"fp16 run stopped:\n{out[-4000:]}"
    expect(r"gradients overflowed \(loss scale", out, "an overflow skip while backing off")


# ---- stalls ----

def stalled(name, stall, sets, np=4, extra_env=None):
    env = {"GPT_TRAIN_FAULT_STALL": stall, **(extra_env or {})}
    forwarded = [arg for key in env for arg in ("-x", key)]
    job = Job(MPIRUN, GPT_TRAIN, np, CONFIG, QUIET + ["parallel.tensor=2", "training.train_iters=1000",
                                                      "training.step_timeout_s=3", "training.startup_timeout_s=3"]
              + sets, WORK, name, mpirun_args=forwarded, extra_env=env)
    try:
        job.wait_for_text(r"GPT_TRAIN_FAULT_STALL: stalling", timeout=60)
        t0 = time.monotonic()
        out, took = job.expect_failed_within(t0, BOUND_S, "the stall")
        print(f"     {name}: job ended {took:.1f} s after the stall", flush=True)
        return out
    finally:
        job.cleanup()


def rank_stopped_during_evaluation():
    out = stalled("eval-stop", "evaluation batch@3", ["eval.interval=2", "eval.iters=4"])
    expect(r"census: rank 3 stalled: no answer to the watchdog census", out, "census naming rank 3")
    # The stopped rank's tensor-parallel peer waits inside a batch; the other data-parallel replica may
    # finish its batches first and wait in the reduction that ends the evaluation.
    expect(r"watchdog: evaluation (batch \d+ of 4|of the valid split) at iteration 2 has made no progress", out,
           "the phase")


def rank_stuck_computing_names_itself():
    out = stalled("spin", "iteration 3@2:spin", [])
    expect(r"\[rank 2\] watchdog: iteration 3 has made no progress for [\d.]+ s \(training.step_timeout_s = 3\); "
           r"this rank is computing, in no communication call: it is the stalled rank", out, "rank 2's own message")
    expect(r"census: rank 2 stalled: still computing while the other ranks wait for it", out, "census naming rank 2")
    assert not re.search(r"\[rank 2\][^\n]*another rank", out), out


def rank_zero_stopped():
    out = stalled("rank0-stop", "iteration 3@0", [])
    expect(r"census: rank 0 stalled: it did not answer", out, "the others naming rank 0")


def rank_stopped_during_startup():
    out = stalled("startup-stop", "start-up@1", [])
    expect(r"start-up has made no progress for [\d.]+ s \(training.startup_timeout_s = 3\)", out, "start-up phase")
    expect(r"census: rank 1 stalled", out, "census naming rank 1")


def rank_stopped_during_checkpoint_save():
    ckpt = os.path.join(WORK, "save-stall")
    out = stalled("save-stop", "saving the checkpoint@2", [f"checkpoint.dir={ckpt}", "checkpoint.save_interval=2"])
    expect(r"saving the checkpoint of iteration 2 has made no progress", out, "save phase")
    expect(r"census: rank 2 stalled", out, "census naming rank 2")
    assert latest_checkpoint_iteration(ckpt) is None, "a save that never finished was committed"


def rank_stopped_during_checkpoint_load():
    ckpt = os.path.join(WORK, "load-stall")
    rc, out = run("load-stall-save", 4, [f"checkpoint.dir={ckpt}", "parallel.tensor=2", "training.train_iters=2"])
    assert rc == 0, out
    out = stalled("load-stop", "loading a checkpoint@3", [f"checkpoint.dir={ckpt}"])
    expect(r"loading a checkpoint has made no progress for [\d.]+ s \(training.startup_timeout_s = 3\)", out,
           "load phase")
    expect(r"census: rank 3 stalled", out, "census naming rank 3")
    assert latest_checkpoint_iteration(ckpt) == 2, "the checkpoint being loaded was changed"


def stall_without_the_census():
    out = stalled("funneled", "iteration 3@1", [], extra_env={"GPT_TRAIN_MPI_THREADS": "funneled"})
    expect(r"watchdog: iteration 3 has made no progress for [\d.]+ s \(training.step_timeout_s = 3\); this rank is "
           r"waiting in communication", out, "a waiting rank's own report")
    assert "census:" not in out, out


# ---- configs that differ between ranks ----

def mpmd_configs_differ():
    for key, a, b in [("model.hidden_size", "64", "128"), ("training.train_iters", "5", "6")]:
        argv = [MPIRUN, "--oversubscribe", "--bind-to", "none"]
        for rank_sets in ([f"{key}={a}"], [f"{key}={b}"]):
            argv += ["-np", "2", GPT_TRAIN, "train", "--config", CONFIG]
            for s in QUIET + rank_sets:
                argv += ["--set", s]
            argv.append(":")
        rc, out = run("mpmd-" + key, 4, [], timeout=60, argv=argv[:-1])
        assert rc == 1, f"{key}: rc {rc}:\n{out}"
        expect(r"different configs: ranks 2, 3 differ from rank 0", out, key)
        expect(re.escape(f"{key}: rank 0 {a}, rank 2 {b}"), out, key)
        assert "double free" not in out and "iteration 1/" not in out, out


# ---- start-up checks ----

def startup_checks_fail_before_the_first_step():
    blocker = os.path.join(WORK, "a-file")
    open(blocker, "w").write("not a directory\n")
    shard = os.path.join(WORK, "tiny")
    text = os.path.join(WORK, "tiny.txt")
    open(text, "w").write("a short document\n\nanother one\n")
    subprocess.run([GPT_TRAIN, "prep", "--input", text, "--tokenizer", "bytes", "--output-prefix", shard],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    readme = os.path.join(WORK, "readme")
    subprocess.run([GPT_TRAIN, "prep", "--input", os.path.join(SOURCE_DIR, "README.md"), "--tokenizer", "bytes",
                    "--output-prefix", readme], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cases = [
        ("unwritable-dir", [f"checkpoint.dir={blocker}/ckpt"], r"checkpoint.dir: checkpoint directory \S+ cannot be"),
        ("missing-valid", [f"data.train=[{readme}]", f"data.valid=[{WORK}/no-such-shard]", "eval.interval=50"],
         r"data.valid: .*no-such-shard"),
        ("missing-valid-no-eval", [f"data.train=[{readme}]", f"data.valid=[{WORK}/no-such-shard]"],
         r"data.valid: .*no-such-shard"),
        ("tiny-valid", [f"data.train=[{readme}]", f"data.valid=[{shard}]", "eval.interval=50"],
         r"data.valid: .*fewer than seq_length \+ 1"),
        ("tiny-split", [f"data.train=[{readme}]", "data.split=999,1,0", "eval.interval=50"],
         r"data.split \(the validation split of data.train\): .*valid split"),
    ]
    for name, sets, pattern in cases:
        rc, out = run(name, 2, sets + ["training.train_iters=3", "model.vocab_size=257"], timeout=60)
        assert rc == 1, f"{name}: rc {rc}:\n{out}"
        expect(pattern, out, name)
        assert not re.search(r"iteration\s+1/", out), f"{name}: found after training started:\n{out}"


# ---- the checkpoint directory lock ----

def second_run_on_a_directory_is_refused_and_a_stale_lock_taken_over():
    ckpt = os.path.join(WORK, "locked")
    first = Job(MPIRUN, GPT_TRAIN, 2, CONFIG, QUIET + [f"checkpoint.dir={ckpt}", "training.train_iters=100000"],
                WORK, "lock-holder")
    try:
        first.wait_for_iteration(2)
        lock = open(os.path.join(ckpt, "gpt-train.lock")).read()
        rc, out = run("lock-second", 2, [f"checkpoint.dir={ckpt}", "training.train_iters=3"], timeout=60)
        assert rc == 1, out
        holder_pid = re.search(r"pid=(\d+)", lock).group(1)
        expect(rf"checkpoint directory {re.escape(ckpt)} is locked by another run: host \S+ pid {holder_pid}", out,
               "the holder")
        for pid in first.rank_pids().values():
            os.kill(pid, signal.SIGKILL)  # no clean exit: the lock stays behind
        first.wait(30)
    finally:
        first.cleanup()
    assert os.path.exists(os.path.join(ckpt, "gpt-train.lock"))
    rc, out = run("lock-stale", 2, [f"checkpoint.dir={ckpt}", "training.train_iters=3"], timeout=60)
    assert rc == 0, out
    expect(r"took over the stale lock .* that process is gone", out, "take-over warning")
    assert not os.path.exists(os.path.join(ckpt, "gpt-train.lock")), "lock left after a clean exit"


checks = Checks()
for name, fn in [("missing latest resumes the newest checkpoint", missing_latest_resumes_the_newest_checkpoint),
                 ("divergence stops without saving", divergence_stops_without_saving),
                 ("fp16 back-off skips do not stop a run", fp16_backoff_skips_do_not_stop_a_run),
                 ("rank stopped during evaluation", rank_stopped_during_evaluation),
                 ("rank stuck computing names itself", rank_stuck_computing_names_itself),
                 ("rank 0 stopped", rank_zero_stopped),
                 ("rank stopped during start-up", rank_stopped_during_startup),
                 ("rank stopped during a checkpoint save", rank_stopped_during_checkpoint_save),
                 ("rank stopped during a checkpoint load", rank_stopped_during_checkpoint_load),
                 ("a stall without the census", stall_without_the_census),
                 ("ranks with different configs", mpmd_configs_differ),
                 ("start-up checks", startup_checks_fail_before_the_first_step),
                 ("checkpoint directory lock", second_run_on_a_directory_is_refused_and_a_stale_lock_taken_over)]:
    checks.run(name, fn)
shutil.rmtree(WORK, ignore_errors=True)
checks.finish()
