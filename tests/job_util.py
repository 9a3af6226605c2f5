"""Helpers for the process-level tests (signal_test.py, failure_test.py, slurm/slurm_test.sh's checks):
start a multi-rank gpt-train job under mpirun with its output in a file, find each rank's process, wait
for log lines, and clean up every process the job started, whatever happens."""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid

ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+)")


class Job:
    """One mpirun job. Its ranks carry GPT_TEST_JOB=<id> in their environment, so they can be found in
    /proc (their rank comes from OMPI_COMM_WORLD_RANK) and killed even after mpirun is gone."""

    def __init__(self, mpirun, gpt_train, np, config, sets, workdir, name, mpirun_args=(), argv=None, extra_env=None):
        self.id = uuid.uuid4().hex
        self.name = name
        self.log_path = os.path.join(workdir, name + ".log")
        env = dict(os.environ)
        env.update(GPT_TEST_JOB=self.id, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        env.update(extra_env or {})
        if argv is None:  # else a launch script given whole, e.g. scripts/mpirun-example.sh
            argv = [mpirun, "--oversubscribe", "--bind-to", "none", "-x", "GPT_TEST_JOB", *mpirun_args,
                    "-np", str(np), gpt_train, "train", "--config", config]
            for s in sets:
                argv += ["--set", s]
        self.argv = argv
        self.log = open(self.log_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)

    def output(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def elapsed(self):
        return time.monotonic() - self.started

    def rank_pids(self):
        """{rank: pid} of this job's live rank processes."""
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{entry}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if state == b"Z" or ("GPT_TEST_JOB=" + self.id).encode() not in env:
                continue
            for item in env:
                if item.startswith(b"OMPI_COMM_WORLD_RANK="):
                    found[int(item.split(b"=", 1)[1])] = int(entry)
        return found

    def wait_for_ranks(self, np, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.rank_pids()
            if len(pids) == np:
                return pids
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: {np} rank processes did not appear; output:\n{self.output()}")

    def last_iteration(self):
        found = ITERATION.findall(self.output())
        return int(found[-1][0]) if found else 0

    def wait_for_iteration(self, at_least, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.last_iteration() >= at_least:
                return self.last_iteration()
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: iteration {at_least} not reached; output:\n{self.output()}")

    def wait_for_text(self, pattern, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.output()):
                return
            if self.proc.poll() is not None and not re.search(pattern, self.output()):
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: /{pattern}/ not in output:\n{self.output()}")

    def wait(self, timeout):
        """The exit status, or None when the job still runs after `timeout` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def expect_failed_within(self, since, bound_s, what):
        """Asserts that the job exits non-zero within `bound_s` seconds of `since` (a monotonic time) and
        leaves no rank behind; returns (output, seconds it took)."""
        rc = self.wait(max(1.0, bound_s - (time.monotonic() - since)))
        out = self.output()
        took = time.monotonic() - since
        assert rc is not None, f"{self.name}: job still running {bound_s} s after {what}:\n{out[-6000:]}"
        assert rc != 0, f"{self.name}: job exited 0 after {what}:\n{out}"
        deadline = time.monotonic() + 10
        while self.rank_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not self.rank_pids(), f"{self.name}: ranks {sorted(self.rank_pids())} still alive after {what}"
        return out, took

    def cleanup(self):
        """Kills whatever is left of the job: mpirun's session and any rank it left behind."""
        for pid in self.rank_pids().values():
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        self.log.close()


def latest_checkpoint_iteration(ckpt_dir):
    """The iteration `latest` names in a checkpoint directory, or None."""
    path = os.path.join(ckpt_dir, "latest")
    if not os.path.exists(path):
        return None
    name = open(path).read().strip()
    m = re.fullmatch(r"iter_(\d+)", name)
    assert m, f"{path} holds {name!r}"
    assert os.path.isdir(os.path.join(ckpt_dir, name)), f"{path} names {name}, which does not exist"
    return int(m.group(1))


class Checks:
    """Runs named cases, prints one line per case and the closing count line."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def run(self, name, fn):
        t0 = time.monotonic()
        try:
            fn()
        except AssertionError as e:
            self.failed += 1
            print(f"FAIL {name} ({time.monotonic() - t0:.1f} s): {e}", flush=True)
            return
        self.passed += 1
        print(f"ok   {name} ({time.monotonic() - t0:.1f} s)", flush=True)

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed", flush=True)
        sys.exit(1 if self.failed else 0)


def make_workdir(prefix):
    return tempfile.mkdtemp(prefix=prefix)
