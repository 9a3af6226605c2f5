#!/usr/bin/env bash
# Runs gpt-train under OpenMPI's mpirun, on this machine or on several hosts, with rank placement that
# keeps each tensor-parallel group on one host (consecutive ranks fill a host before the next one), and
# with graceful stopping: SIGTERM to this script is passed to mpirun as SIGUSR1, which mpirun forwards to
# every rank at once, so the job checkpoints after the current step and exits 0. (SIGTERM to mpirun
# itself also reaches the ranks, but only after mpirun's kill delay, followed by SIGKILL.)
#
#   scripts/mpirun-example.sh                                  # 2 ranks, configs/tiny-cpu.yaml
#   NP=4 scripts/mpirun-example.sh --set parallel.tensor=2 --set parallel.pipeline=2
#   HOSTFILE=hosts.txt NP=16 PER_HOST=8 CONFIG=configs/gpt2-1.3b.yaml \
#     scripts/mpirun-example.sh --set data.train=[/shared/data/train]
#
# Variables: GPT_TRAIN (default build/gpt-train), CONFIG (default configs/tiny-cpu.yaml), NP (ranks,
# default 2), PER_HOST (ranks per host, default NP; on GPU hosts the number of GPUs: a rank's local rank
# picks its GPU), HOSTFILE (an OpenMPI hostfile, e.g. "node01 slots=8" per line), THREADS (OpenMP
# threads per rank, default 1). Further arguments go to `gpt-train train`.
set -euo pipefail
cd "$(dirname "$0")/.."

GPT_TRAIN=${GPT_TRAIN:-build/gpt-train}
CONFIG=${CONFIG:-configs/tiny-cpu.yaml}
NP=${NP:-2}
PER_HOST=${PER_HOST:-$NP}
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=1

launch=(mpirun -np "$NP" --map-by "ppr:${PER_HOST}:node" --bind-to none
  -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x LD_LIBRARY_PATH -x PATH)
if [ -n "${HOSTFILE:-}" ]; then launch+=(--hostfile "$HOSTFILE"); fi
# One machine with fewer cores than ranks (a laptop, CI) needs oversubscription.
if [ -z "${HOSTFILE:-}" ] && [ "$NP" -gt "$(nproc)" ]; then launch+=(--oversubscribe); fi
if [ "$(id -u)" -eq 0 ]; then launch+=(--allow-run-as-root); fi

echo "mpirun-example: ${launch[*]} $GPT_TRAIN train --config $CONFIG $*"
"${launch[@]}" "$GPT_TRAIN" train --config "$CONFIG" "$@" &
mpirun_pid=$!
trap 'echo "mpirun-example: SIGTERM: asking every rank to checkpoint and stop"; kill -USR1 "$mpirun_pid" 2>/dev/null || true' TERM
while :; do
  rc=0
  wait "$mpirun_pid" || rc=$?  # (not a bare wait: under set -e an interrupted wait would end the script)
  # A trapped signal interrupts `wait` (status > 128) while mpirun still runs: wait again.
  if [ "$rc" -gt 128 ] && kill -0 "$mpirun_pid" 2>/dev/null; then continue; fi
  break
done
exit "$rc"
