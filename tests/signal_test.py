"""Stop signals on a running 4-rank gpt-train job (tensor 2 x pipeline 2) under mpirun:
- SIGTERM to one rank only: every rank stops after the same step, a checkpoint of that step is written,
  the job exits 0; a new run resumes from it;
- SIGUSR1 to mpirun (which forwards it to every rank): the same;
- SIGTERM to scripts/mpirun-example.sh (which passes it to mpirun as SIGUSR1): the same;
- a second SIGTERM to a rank that is already stopping (held inside its step by a stopped peer) ends it at
  once, with a message naming the rank, and no checkpoint is written;
- the same signal twice in quick succession (a launcher's echo) is one request: the job still finishes
  its step, checkpoints and exits 0.
usage: signal_test.py MPIRUN GPT_TRAIN SOURCE_DIR"""
import os
import re
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_util import Checks, Job, latest_checkpoint_iteration, make_workdir  # noqa: E402

MPIRUN, GPT_TRAIN, SOURCE_DIR = sys.argv[1:4]
CONFIG = os.path.join(SOURCE_DIR, "configs", "tiny-cpu.yaml")
NP = 4
WORK = make_workdir("gpt_signal_test_")


def sets(ckpt, train_iters=100000):
    return ["parallel.tensor=2", "parallel.pipeline=2", f"training.train_iters={train_iters}",
            "logging.interval=1", "logging.metrics_file=", "eval.interval=0", f"checkpoint.dir={ckpt}",
            "checkpoint.save_interval=0", "training.step_timeout_s=60"]


def start(name, ckpt, **kw):
    return Job(MPIRUN, GPT_TRAIN, NP, CONFIG, sets(ckpt, **kw), WORK, name)


def expect_clean_stop(job, ckpt, signal_name, signalled_ranks):
    rc = job.wait(30)
    out = job.output()
    assert rc is not None, f"still running 30 s after {signal_name}:\n{out}"
    assert rc == 0, f"exit status {rc} after {signal_name}:\n{out}"
    for r in signalled_ranks:
        assert f"[rank {r}] received {signal_name}: finishing the current step" in out, out
    saved = latest_checkpoint_iteration(ckpt)
    assert saved is not None, f"no checkpoint in {ckpt} after {signal_name}:\n{out}"
    assert saved == job.last_iteration(), f"checkpoint of iteration {saved}, last logged {job.last_iteration()}"
    assert re.search(rf"stop requested \({signal_name}\)", out), out
    return saved


def sigterm_to_one_rank():
    ckpt = os.path.join(WORK, "ckpt_term")
    job = start("term_one_rank", ckpt)
    try:
        pids = job.wait_for_ranks(NP)
        job.wait_for_iteration(3)
        os.kill(pids[2], signal.SIGTERM)
        saved = expect_clean_stop(job, ckpt, "SIGTERM", [2])
        assert saved >= 3
        # Only rank 2 was signalled, so the others stopped because they agreed on its request.
        for r in (0, 1, 3):
            assert f"[rank {r}] received" not in job.output()
    finally:
        job.cleanup()
    # A new run resumes from that checkpoint and continues with the next iteration.
    again = start("term_one_rank_resume", ckpt, train_iters=saved + 2)
    try:
        rc = again.wait(60)
        out = again.output()
        assert rc == 0, f"resumed run: status {rc}\n{out}"
        its = [int(i) for i, _ in re.findall(r"iteration\s+(\d+)/\s*(\d+)", out)]
        assert its and its[0] == saved + 1 and its[-1] == saved + 2, f"iterations {its} after resuming at {saved}"
    finally:
        again.cleanup()


def sigusr1_to_mpirun():
    ckpt = os.path.join(WORK, "ckpt_usr1")
    job = start("usr1_mpirun", ckpt)
    try:
        job.wait_for_ranks(NP)
        job.wait_for_iteration(3)
        os.kill(job.proc.pid, signal.SIGUSR1)
        expect_clean_stop(job, ckpt, "SIGUSR1", range(NP))
    finally:
        job.cleanup()


def second_signal_exits_at_once():
    ckpt = os.path.join(WORK, "ckpt_second")
    job = start("second_signal", ckpt)
    try:
        pids = job.wait_for_ranks(NP)
        job.wait_for_iteration(3)
        # With rank 3 stopped, rank 1 cannot finish its step: it is still stopping when the second
        # signal arrives.
        os.kill(pids[3], signal.SIGSTOP)
        os.kill(pids[1], signal.SIGTERM)
        job.wait_for_text(r"\[rank 1\] received SIGTERM: finishing the current step")
        time.sleep(1.5)  # past the one-second window in which a repeat counts as the same request
        assert 1 in job.rank_pids(), "rank 1 ended after the first signal"
        sent = time.monotonic()
        os.kill(pids[1], signal.SIGTERM)
        while 1 in job.rank_pids() and time.monotonic() - sent < 10:
            time.sleep(0.02)
        gone_after = time.monotonic() - sent
        assert gone_after < 2, f"rank 1 still alive {gone_after:.1f} s after the second signal"
        os.kill(pids[3], signal.SIGCONT)
        rc = job.wait(30)
        out = job.output()
        assert rc is not None and rc != 0, f"status {rc}: the job should fail after an immediate exit\n{out}"
        assert "[rank 1] received SIGTERM while already stopping (first signal: SIGTERM): exiting at once" in out, out
        assert latest_checkpoint_iteration(ckpt) is None, "a checkpoint was written"
    finally:
        job.cleanup()


def repeated_signal_is_one_request():
    ckpt = os.path.join(WORK, "ckpt_repeat")
    job = start("repeated_signal", ckpt)
    try:
        pids = job.wait_for_ranks(NP)
        job.wait_for_iteration(3)
        os.kill(pids[3], signal.SIGSTOP)
        os.kill(pids[1], signal.SIGTERM)
        time.sleep(0.05)
        os.kill(pids[1], signal.SIGTERM)
        time.sleep(1.5)
        assert 1 in job.rank_pids(), "rank 1 ended on a repeat of the same signal\n" + job.output()
        os.kill(pids[3], signal.SIGCONT)
        expect_clean_stop(job, ckpt, "SIGTERM", [1])
        assert "while already stopping" not in job.output()
    finally:
        job.cleanup()


def sigterm_to_the_mpirun_example():
    """scripts/mpirun-example.sh turns SIGTERM to itself into SIGUSR1 to mpirun: a graceful stop."""
    ckpt = os.path.join(WORK, "ckpt_example")
    argv = [os.path.join(SOURCE_DIR, "scripts", "mpirun-example.sh")]
    for s in sets(ckpt):
        argv += ["--set", s]
    job = Job(MPIRUN, GPT_TRAIN, NP, CONFIG, [], WORK, "mpirun_example", argv=argv,
              extra_env={"GPT_TRAIN": GPT_TRAIN, "CONFIG": CONFIG, "NP": str(NP)})
    try:
        job.wait_for_ranks(NP)
        job.wait_for_iteration(3)
        os.kill(job.proc.pid, signal.SIGTERM)
        expect_clean_stop(job, ckpt, "SIGUSR1", range(NP))
    finally:
        job.cleanup()


checks = Checks()
checks.run("sigterm_to_one_rank_stops_every_rank_with_a_checkpoint", sigterm_to_one_rank)
checks.run("sigusr1_to_mpirun_stops_every_rank_with_a_checkpoint", sigusr1_to_mpirun)
checks.run("sigterm_to_the_mpirun_example_stops_gracefully", sigterm_to_the_mpirun_example)
checks.run("second_signal_exits_at_once", second_signal_exits_at_once)
checks.run("quick_repeat_of_a_signal_is_one_request", repeated_signal_is_one_request)
shutil.rmtree(WORK, ignore_errors=True)
checks.finish()
