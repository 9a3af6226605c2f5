"""Asynchronous checkpoint saves (checkpoint.async_save, the default) on real 2-rank jobs under mpirun,
with writes held at known points by GPT_TRAIN_FAULT_CHECKPOINT_PAUSE:
- SIGKILL of one rank (rank 1, or rank 0, which commits) while the background write of iteration 6 is
  before its file, in the middle of it, or done and durable but not committed: `latest` still names
  iteration 4, iterations 2 and 4 are both there (keep_last 2: nothing was pruned), no iter_0000006
  exists, and the next run resumes from iteration 4;
- SIGTERM while a write is in flight: the run waits for it, commits it, saves its last step too and
  exits 0;
- the log of each save gives the blocking copy and the background write apart.
usage: async_checkpoint_test.py MPIRUN GPT_TRAIN SOURCE_DIR"""
import os
import re
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_util import Checks, Job, latest_checkpoint_iteration, make_workdir  # noqa: E402

MPIRUN, GPT_TRAIN, SOURCE_DIR = sys.argv[1:4]
CONFIG = os.path.join(SOURCE_DIR, "configs", "tiny-cpu.yaml")
WORK = make_workdir("gpt_async_ckpt_test_")
NP = 2


def sets(ckpt, train_iters, save_interval=2, keep_last=2):
    return ["parallel.tensor=2", f"training.train_iters={train_iters}", "logging.interval=1",
            "logging.metrics_file=", "eval.interval=0", f"checkpoint.dir={ckpt}",
            f"checkpoint.save_interval={save_interval}", f"checkpoint.keep_last={keep_last}",
            "checkpoint.async_save=true", "training.step_timeout_s=120"]


def iteration_dirs(ckpt):
    return sorted(n for n in os.listdir(ckpt) if re.fullmatch(r"iter_\d+", n))


def sigkill_during_background_write(point, victim):
    def case():
        ckpt = os.path.join(WORK, f"kill_{point}_{victim}")
        job = Job(MPIRUN, GPT_TRAIN, NP, CONFIG, sets(ckpt, 100000), WORK, f"kill_{point}_{victim}",
                  extra_env={"GPT_TRAIN_FAULT_CHECKPOINT_PAUSE": f"{point}@{victim}:120/6"})
        try:
            pids = job.wait_for_ranks(NP)
            job.wait_for_text(rf"\[rank {victim}\] GPT_TRAIN_FAULT_CHECKPOINT_PAUSE: checkpoint write of iteration 6 "
                              rf"paused at {point}", timeout=120)
            # Training goes on while the write is held: a step after the save is logged.
            job.wait_for_iteration(7, timeout=60)
            os.kill(pids[victim], signal.SIGKILL)
            rc = job.wait(60)
            out = job.output()
            assert rc is not None and rc != 0, f"status {rc} after SIGKILL of rank {victim}:\n{out[-4000:]}"
        finally:
            job.cleanup()
        assert "saved checkpoint" in out and re.search(r"blocking copy [0-9.]+ s .*background write [0-9.]+ s", out), \
            f"no save log line with the copy and the write apart:\n{out[-4000:]}"
        assert latest_checkpoint_iteration(ckpt) == 4, f"latest is {latest_checkpoint_iteration(ckpt)}"
        dirs = iteration_dirs(ckpt)
        assert dirs == ["iter_0000002", "iter_0000004"], f"checkpoints after the kill: {dirs} (pruned or committed)"
        # The next run resumes from the last committed checkpoint and finishes.
        again = Job(MPIRUN, GPT_TRAIN, NP, CONFIG, sets(ckpt, 6), WORK, f"kill_{point}_{victim}_resume")
        try:
            rc = again.wait(120)
            out = again.output()
            assert rc == 0, f"resumed run: status {rc}\n{out[-4000:]}"
        finally:
            again.cleanup()
        assert re.search(r"loaded checkpoint \S*iter_0000004", out), out[-4000:]
        its = [int(i) for i, _ in re.findall(r"iteration\s+(\d+)/\s*(\d+)", out)]
        assert its and its[0] == 5 and its[-1] == 6, f"iterations {its} after resuming at 4"
        assert latest_checkpoint_iteration(ckpt) == 6
    return case


def sigterm_while_a_write_is_in_flight():
    ckpt = os.path.join(WORK, "term")
    # Steps take milliseconds: saves 200 steps apart leave the signal time to land before the next save,
    # which would wait for the held write itself.
    job = Job(MPIRUN, GPT_TRAIN, NP, CONFIG, sets(ckpt, 100000, save_interval=200, keep_last=0), WORK, "term",
              extra_env={"GPT_TRAIN_FAULT_CHECKPOINT_PAUSE": "mid_file@*:15/200"})
    try:
        pids = job.wait_for_ranks(NP)
        job.wait_for_text(r"checkpoint write of iteration 200 paused at mid_file", timeout=120)
        job.wait_for_iteration(201, timeout=60)
        for pid in pids.values():  # as Slurm does (mpirun follows its own SIGTERM with SIGKILL)
            os.kill(pid, signal.SIGTERM)
        rc = job.wait(60)
        out = job.output()
        assert rc == 0, f"status {rc} after SIGTERM with a write in flight:\n{out[-4000:]}"
    finally:
        job.cleanup()
    last = job.last_iteration()
    assert 201 <= last < 400, f"stopped after iteration {last}"
    assert latest_checkpoint_iteration(ckpt) == last, f"latest {latest_checkpoint_iteration(ckpt)}, last step {last}"
    assert "iter_0000200" in iteration_dirs(ckpt), f"the save in flight was not committed: {iteration_dirs(ckpt)}"
    assert os.path.exists(os.path.join(ckpt, "iter_0000200", "metadata.yaml"))
    # The stop came while iteration 200's write was held, which then committed before the stop step's save.
    stop = out.find("stop requested (SIGTERM)")
    commit200 = out.find("saved checkpoint " + os.path.join(ckpt, "iter_0000200"))
    start_last = out.find(f"checkpoint of iteration {last}: copied")
    assert 0 <= stop < commit200 < start_last, \
        f"stop logged at {stop}, iteration 200 committed at {commit200}, last save started at {start_last}"


checks = Checks()
for point, victim in [("before_file", 1), ("mid_file", 1), ("after_fsync", 1), ("after_fsync", 0)]:
    checks.run(f"sigkill_rank_{victim}_at_{point}_resumes_the_last_committed_checkpoint",
               sigkill_during_background_write(point, victim))
checks.run("sigterm_while_a_write_is_in_flight_commits_it_and_exits_0", sigterm_while_a_write_is_in_flight)
checks.finish()
