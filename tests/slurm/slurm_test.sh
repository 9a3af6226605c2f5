#!/usr/bin/env bash
# The real Slurm test: starts munged, slurmctld and slurmd on this machine (one node "localhost", two
# CPUs, oversubscribed) from a generated slurm.conf with every state, spool, pid and log file under a
# temporary directory; submits a 4-rank gpt-train job with sbatch whose step runs through srun --mpi=pmix
# and scripts/slurm/requeue-on-signal.sh; checks that it trains and checkpoints; sends the batch shell
# SIGUSR1 exactly as `sbatch --signal=B:USR1@...` does before a time limit; checks that every rank stopped
# after the same step with a checkpoint, that the job requeued itself, ran again, resumed from the
# checkpoint and finished, and that its final loss equals an uninterrupted run's. Stops the daemons it
# started, by pid. Exits 77 (ctest: skipped) only when the Slurm or munge programs are not installed.
# usage: slurm_test.sh GPT_TRAIN SOURCE_DIR MPIRUN
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # the daemons live here; a non-root PATH may lack it

for cmd in munged mungekey slurmctld slurmd sbatch srun scontrol squeue scancel sinfo; do
  if ! command -v "$cmd" >/dev/null 2>&1; then
    echo "SKIP: $cmd is not installed (scripts/install-deps.sh installs slurm-wlm and munge)"
    exit 77
  fi
done

GPT_TRAIN=$(realpath "$1")
SRC=$(realpath "$2")
MPIRUN=${3:-mpirun}
ITERS=60         # long enough that the signal lands mid-run (a step takes ~0.1 s here)
SAVE_INTERVAL=5

# An outer Slurm job's variables must not leak into the jobs submitted here.
for v in $(compgen -e | grep '^SLURM_' || true); do unset "$v"; done

T=$(mktemp -d /tmp/gpt_slurm_test.XXXXXX)
chmod 755 "$T"  # munged refuses a socket directory that others can write to
DAEMON_PIDS=()
JOB=""

log() { echo "slurm_test: $*"; }

fail() {
  echo "FAIL: $*"
  for f in job.out slurmctld.log slurmd.log munged.log; do
    [ -f "$T/$f" ] && { echo "---- $f (last 40 lines)"; tail -n 40 "$T/$f"; }
  done
  exit 1
}

cleanup() {
  local rc=$?
  set +e
  if [ -n "$JOB" ]; then scancel "$JOB" 2>/dev/null; fi
  # Let slurmd end the job's steps before the daemons go.
  for _ in $(seq 1 50); do
    [ -z "$(squeue -h 2>/dev/null)" ] && break
    sleep 0.2
  done
  for ((i = ${#DAEMON_PIDS[@]} - 1; i >= 0; i--)); do kill -TERM "${DAEMON_PIDS[i]}" 2>/dev/null; done
  for pid in "${DAEMON_PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  # Anything this test started that outlived the daemons (job steps carry our SLURM_CONF).
  for p in /proc/[0-9]*; do
    if grep -qas "SLURM_CONF=$T/slurm.conf" "$p/environ"; then kill -KILL "${p#/proc/}" 2>/dev/null; fi
  done
  if [ "$rc" -eq 0 ]; then rm -rf "$T"; else echo "slurm_test: kept $T for inspection"; fi
}
trap cleanup EXIT

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ---- munge ----
mungekey -c -k "$T/munge.key" >/dev/null 2>&1 || { dd if=/dev/urandom of="$T/munge.key" bs=1 count=1024 2>/dev/null; }
chmod 400 "$T/munge.key"
munged -F -f --key-file="$T/munge.key" --socket="$T/munge.sock" --pid-file="$T/munged.pid" \
  --log-file="$T/munged.log" --seed-file="$T/munged.seed" >"$T/munged.out" 2>&1 &
DAEMON_PIDS+=($!)
for _ in $(seq 1 50); do [ -S "$T/munge.sock" ] && break; sleep 0.1; done
[ -S "$T/munge.sock" ] || fail "munged did not create its socket: $(cat "$T/munged.out")"

# ---- slurm.conf ----
mkdir -p "$T/state" "$T/spool"
CTLD_PORT=$(free_port)
SLURMD_PORT=$(free_port)
while [ "$SLURMD_PORT" = "$CTLD_PORT" ]; do SLURMD_PORT=$(free_port); done
cat >"$T/slurm.conf" <<EOF
ClusterName=gpttest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge.sock
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MinJobAge=600
KillWait=30
NodeName=localhost CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
export SLURM_CONF="$T/slurm.conf"

# ---- slurmctld, slurmd ----
slurmctld -D -c -f "$SLURM_CONF" >"$T/slurmctld.out" 2>&1 &
DAEMON_PIDS+=($!)
slurmd -D -c -N localhost -f "$SLURM_CONF" >"$T/slurmd.out" 2>&1 &
DAEMON_PIDS+=($!)
state=""
for _ in $(seq 1 120); do
  state=$(sinfo -h -n localhost -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "$state" = idle ] || fail "node localhost is '$state', not idle, 60 s after starting the daemons"
log "daemons up (slurmctld port $CTLD_PORT, slurmd port $SLURMD_PORT), node idle"

srun --mpi=list 2>&1 | grep -qw pmix || fail "Slurm's pmix MPI plugin is missing (srun --mpi=list)"

# ---- the job ----
CKPT="$T/ckpt"
TRAIN_ARGS=(train --config "$SRC/configs/tiny-cpu.yaml" --set parallel.pipeline=2
  --set training.train_iters=$ITERS --set checkpoint.dir="$CKPT" --set checkpoint.save_interval=$SAVE_INTERVAL
  --set logging.interval=1 --set eval.interval=0 --set training.step_timeout_s=60)
cat >"$T/job.sbatch" <<EOF
#!/bin/bash
#SBATCH --job-name=gpt-slurm-test
#SBATCH --ntasks=4
#SBATCH --overcommit
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=$T/job.out
#SBATCH --signal=B:USR1@30
set -euo pipefail
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
source "$SRC/scripts/slurm/requeue-on-signal.sh"
srun_with_requeue srun --ntasks=4 --overcommit --mpi=pmix --kill-on-bad-exit=1 \\
  "$GPT_TRAIN" ${TRAIN_ARGS[*]@Q} --set logging.metrics_file="$T/metrics.jsonl"
EOF
JOB=$(sbatch --parsable "$T/job.sbatch")
log "submitted job $JOB"

job_field() { scontrol show job "$JOB" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1; }
job_ended() {
  case "$(job_field JobState)" in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED) return 0 ;;
  esac
  return 1
}
last_iteration() { grep -oE 'iteration +[0-9]+/' "$T/job.out" 2>/dev/null | tail -n 1 | grep -oE '[0-9]+' || echo 0; }

# Trains and checkpoints: wait for the periodic checkpoint at iteration 5 and a couple more steps. (The
# time limits in this file are generous: ctest may run this next to other multi-rank tests on two cores.)
deadline=$((SECONDS + 180))
while [ $SECONDS -lt $deadline ]; do
  [ "$(last_iteration)" -ge $((SAVE_INTERVAL + 2)) ] && [ -f "$CKPT/latest" ] && break
  job_ended && break
  sleep 0.2
done
[ -f "$CKPT/latest" ] || fail "no checkpoint after iteration $(last_iteration) (job state $(job_field JobState))"
log "running: iteration $(last_iteration), checkpoint $(cat "$CKPT/latest")"

# Slurm's warning before the time limit: SIGUSR1 to the batch shell only (what --signal=B:USR1 sends).
scancel --signal=USR1 --batch "$JOB"
log "sent SIGUSR1 to the batch shell"

# The job requeues itself: it leaves RUNNING with one restart, then waits for its begin time.
deadline=$((SECONDS + 120))
while [ $SECONDS -lt $deadline ]; do
  [ "$(job_field Restarts)" = 1 ] && break
  job_ended && break
  sleep 0.2
done
[ "$(job_field Restarts)" = 1 ] || fail "job was not requeued (state $(job_field JobState), restarts $(job_field Restarts))"
log "requeued (state $(job_field JobState)); releasing Slurm's requeue delay"
# A requeued job becomes eligible only after a delay; once it is pending again, start it in 2 s instead.
# Not "now": slurmd revoked the first run's credential at the requeue, and a new credential issued within
# the same second counts as revoked too ("Job credential revoked": the batch job is then killed).
deadline=$((SECONDS + 60))
while [ $SECONDS -lt $deadline ] && [ "$(job_field JobState)" != PENDING ]; do sleep 0.2; done
scontrol update JobId="$JOB" StartTime=now+2 >/dev/null 2>&1 || log "could not move the start time; waiting for Slurm's delay"

deadline=$((SECONDS + 240))
while [ $SECONDS -lt $deadline ]; do
  job_ended && break
  sleep 0.2
done
st=$(job_field JobState)
[ "$st" = COMPLETED ] || fail "job ended in state $st (exit code $(job_field ExitCode)), not COMPLETED"
[ "$(job_field ExitCode)" = 0:0 ] || fail "job exit code $(job_field ExitCode)"
log "job completed after $(job_field Restarts) requeue"

# ---- what the output says ----
OUT="$T/job.out"
run1=$(sed -n '/run 1 starting/,/run 2 starting/p' "$OUT")
run2=$(sed -n '/run 2 starting/,$p' "$OUT")
[ -n "$run1" ] && [ -n "$run2" ] || fail "the output does not show two runs"
grep -q "launcher Slurm" <<<"$run1" || fail "rank discovery did not see Slurm"
grep -q "saved checkpoint .*iter_0000005 at iteration 5" <<<"$run1" || fail "no periodic checkpoint at iteration 5"
stop_line=$(grep -E "stop requested \(SIGUSR1\): stopping after iteration [0-9]+" <<<"$run1") ||
  fail "run 1 did not stop on SIGUSR1"
K=$(grep -oE "after iteration [0-9]+" <<<"$stop_line" | grep -oE '[0-9]+')
[ "$K" -lt "$ITERS" ] || fail "run 1 reached the end before the signal"
received=$(grep -c "received SIGUSR1: finishing the current step" <<<"$run1" || true)
[ "$received" -eq 4 ] || fail "$received of 4 ranks got SIGUSR1"
grep -q "saved checkpoint .*iter_$(printf %07d "$K") at iteration $K" <<<"$run1" || fail "no checkpoint at the stop ($K)"
grep -q "requeuing job $JOB" <<<"$run1" || fail "the batch script did not requeue"
grep -q "loaded checkpoint .*iter_$(printf %07d "$K") (iteration $K" <<<"$run2" || fail "run 2 did not resume from iteration $K"
first2=$(grep -oE 'iteration +[0-9]+/' <<<"$run2" | head -n 1 | grep -oE '[0-9]+')
last2=$(grep -oE 'iteration +[0-9]+/' <<<"$run2" | tail -n 1 | grep -oE '[0-9]+')
[ "$first2" = $((K + 1)) ] && [ "$last2" = "$ITERS" ] ||
  fail "run 2 logged iterations $first2..$last2, expected $((K + 1))..$ITERS"
grep -q "srun_with_requeue: step finished" <<<"$run2" || fail "run 2 did not finish cleanly"
[ "$(cat "$CKPT/latest")" = "iter_$(printf %07d "$ITERS")" ] || fail "latest is $(cat "$CKPT/latest"), not iteration $ITERS"
log "run 1 stopped after iteration $K with a checkpoint; run 2 resumed at $((K + 1)) and finished at $ITERS"

# ---- the interrupted run ends where an uninterrupted one does ----
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  "$MPIRUN" --oversubscribe --bind-to none -np 4 "$GPT_TRAIN" "${TRAIN_ARGS[@]}" --set checkpoint.dir= --set checkpoint.save_interval=0 \
  --set logging.metrics_file="$T/reference.jsonl" >"$T/reference.out" 2>&1 || fail "reference run failed: $(tail -n 20 "$T/reference.out")"
/usr/bin/python3 - "$T/metrics.jsonl" "$T/reference.jsonl" "$ITERS" <<'EOF' || fail "final loss differs from the uninterrupted run"
import json, sys
def final(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if r.get("iteration") == int(sys.argv[3]) and "split" not in r]
    return rows[-1]["loss"]
resumed, reference = final(sys.argv[1]), final(sys.argv[2])
print(f"slurm_test: final loss {resumed!r} (requeued) vs {reference!r} (uninterrupted)")
sys.exit(0 if abs(resumed - reference) <= 1e-6 * abs(reference) else 1)
EOF
echo "slurm_test: PASS"
