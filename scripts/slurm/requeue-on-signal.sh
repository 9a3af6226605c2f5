#!/usr/bin/env bash
# Sourced by Slurm batch scripts: defines srun_with_requeue, which runs one job step (an srun command
# line) so that the job survives its time limit and preemption warnings:
#  - SIGUSR1 to the batch shell (sbatch --signal=B:USR1@SECONDS, or `scancel --signal=USR1 --batch JOB`)
#    is forwarded to the step; gpt-train finishes the current step on every rank, writes a checkpoint to
#    checkpoint.dir and exits 0; the job is then requeued (scontrol requeue) and, when it runs again,
#    gpt-train resumes from checkpoint.dir's `latest` on its own.
#  - SIGTERM to the batch shell (scancel, time limit, preemption) is not forwarded: Slurm delivers it
#    to every task itself, and gpt-train treats it like SIGUSR1. The job is not requeued.
#  - a step that fails exits the batch script with its status, and the job is not requeued.
# Usage (in a batch script with #SBATCH --requeue and --open-mode=append):
#   source scripts/slurm/requeue-on-signal.sh
#   srun_with_requeue srun --mpi=pmix --kill-on-bad-exit=1 gpt-train train --config ...

srun_with_requeue() {
  local step_pid rc
  _gpt_stop_signal=""
  trap '_gpt_stop_signal=USR1; echo "srun_with_requeue: SIGUSR1: asking the step to checkpoint and stop"; kill -USR1 "$step_pid" 2>/dev/null || true' USR1
  trap '_gpt_stop_signal=TERM; echo "srun_with_requeue: SIGTERM: the step stops by itself, not requeuing"' TERM
  echo "srun_with_requeue: job ${SLURM_JOB_ID:-?} run $(( ${SLURM_RESTART_COUNT:-0} + 1 )) starting: $*"
  "$@" &
  step_pid=$!
  while :; do
    rc=0
    wait "$step_pid" || rc=$?  # (not a bare wait: under set -e an interrupted wait would end the script)
    # A trapped signal interrupts `wait` with status > 128 while the step still runs (or is not yet
    # reaped); wait again for its real status.
    if [ "$rc" -gt 128 ] && kill -0 "$step_pid" 2>/dev/null; then continue; fi
    break
  done
  trap - USR1 TERM
  if [ "$rc" -ne 0 ]; then
    echo "srun_with_requeue: step exited with status $rc; not requeuing"
    return "$rc"
  fi
  if [ "$_gpt_stop_signal" = USR1 ]; then
    if [ -z "${SLURM_JOB_ID:-}" ]; then
      echo "srun_with_requeue: stopped after SIGUSR1 outside Slurm; nothing to requeue"
      return 0
    fi
    echo "srun_with_requeue: step checkpointed and stopped; requeuing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    return $?
  fi
  echo "srun_with_requeue: step finished"
  return 0
}
