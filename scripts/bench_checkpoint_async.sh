#!/usr/bin/env bash
# The training-step stall of a checkpoint save, synchronous against asynchronous (checkpoint.async_save),
# measured in one run on one rank of the CPU backend, for GPT-2 124M (configs/gpt2-124m.yaml: 1.5 GB of
# fp32 weights and Adam moments) and a 24-layer GPT-2 of the same width (210M parameters, a 2.5 GB
# checkpoint). Both at sequence length 128, one sequence per step, so a step takes about a second on
# two cores; the checkpoint's size is what matters here.
#
# Each case runs the same STEPS steps three times: with no saves, with a synchronous save every
# INTERVAL steps, and with an asynchronous one. STEPS is chosen so that the last periodic save comes a
# few steps before the end: the window measured, from the log line of the first save's step to that of
# the last step, holds the periodic saves and every step they overlap, and not the final save (which a
# run always waits for), nor the first steps, during which an asynchronous run sets up its snapshot
# buffer (a one-time cost: faulting in GBs of memory takes seconds on some machines). Reported per case:
#  - sync save: the mean time a synchronous save blocks training (gpt-train's own "in S s");
#  - async stall: the mean time an asynchronous save blocks training (its "blocking copy" plus "commit"),
#    and its ratio to the synchronous save (goal: at most 0.10);
#  - the window's seconds per step with no saves, with sync saves and with async saves, and the async
#    one's ratio to no saves (goal: at most 1.05): what the background write costs the steps it overlaps
#    (on two cores it competes with training for them), and a next save's wait for a write still running
#    when INTERVAL steps are shorter than the write;
#  - what each save added to the window against no saves, sync and async.
#
# usage: scripts/bench_checkpoint_async.sh [--only 124M|2G] [--interval K] [--saves N] [--repeat R]
#                                          [BUILD_DIR] [WORK_DIR]
#   defaults: both cases, a save every 10 steps, 3 saves in the window, each case once (--repeat: the
#   three runs of every case R times over, a row each: the machine's speed drifts between runs, so rows
#   measured back to back are the ones to compare); WORK_DIR (default: a new directory under $TMPDIR or
#   /tmp) needs about 6 GB free.
set -euo pipefail

only=""
interval=10
saves=3
repeat=1
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --only) only="$2"; shift 2 ;;
    --interval) interval="$2"; shift 2 ;;
    --saves) saves="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    *) echo "bench_checkpoint_async: unknown option $1" >&2; exit 2 ;;
  esac
done
build="${1:-build}"
work="${2:-$(mktemp -d "${TMPDIR:-/tmp}/gpt_ckpt_async_bench.XXXXXX")}"
gpt="$build/gpt-train"
src="$(cd "$(dirname "$0")/.." && pwd)"
[[ -x "$gpt" ]] || { echo "bench_checkpoint_async: $gpt not found (build first, or pass BUILD_DIR)" >&2; exit 1; }
mkdir -p "$work"
steps=$(( saves * interval + interval / 2 ))

# Seconds since the epoch of a log line's "[YYYY-MM-DD HH:MM:SS.mmm]" stamp.
stamp() { date -d "$(sed -n 's/^\[\([0-9-]* [0-9:.]*\)\].*/\1/p' <<< "$1")" +%s.%N; }

# window LOG: seconds from the log line of step INTERVAL (the first save follows it) to that of the last.
window() {
  local first last
  first=$(grep -m1 -E "iteration +$interval/" "$1")
  last=$(grep -m1 -E "iteration +$steps/" "$1")
  awk -v a="$(stamp "$first")" -v b="$(stamp "$last")" 'BEGIN { printf "%.3f", b - a }'
}

# run NAME LAYERS MODE (none | sync | async): trains, leaves the log in $work/NAME.log.
run() {
  local name=$1 layers=$2 mode=$3 dir="$work/$1.ckpt"
  rm -rf "$dir"
  local sets=(--set backend=cpu --set model.num_layers="$layers" --set model.seq_length=128
              --set training.micro_batch_size=1 --set training.global_batch_size=1
              --set training.train_iters="$steps" --set optimizer.warmup_iters=1 --set logging.interval=1
              --set logging.metrics_file= --set eval.interval=0 --set checkpoint.keep_last=1)
  if [[ "$mode" == none ]]; then
    sets+=(--set checkpoint.dir= --set checkpoint.save_interval=0)
  else
    sets+=(--set checkpoint.dir="$dir" --set checkpoint.save_interval="$interval"
           --set checkpoint.async_save=$([[ "$mode" == async ]] && echo true || echo false))
  fi
  echo "== $name: $steps steps, saves: $mode" >&2
  OMP_NUM_THREADS=$(getconf _NPROCESSORS_ONLN) "$gpt" train --config "$src/configs/gpt2-124m.yaml" "${sets[@]}" \
    > "$work/$name.log" 2>&1 || { tail -20 "$work/$name.log" >&2; exit 1; }
  rm -rf "$dir"
}

# The mean of the periodic saves' (not the final one's) logged seconds: sync "in S s", async
# "blocking copy S s" + "commit S s"; and their size in MB.
sync_save_s() {
  grep -E "saved checkpoint .* at iteration [0-9]+:" "$1" | head -n "$saves" |
    sed 's/.* bytes in \([0-9.]*\) s.*/\1/' | awk '{ s += $1 } END { printf "%.3f", s / NR }'
}
async_stall_s() {
  grep -E "saved checkpoint .* at iteration [0-9]+:" "$1" | head -n "$saves" |
    sed 's/.*blocking copy \([0-9.]*\) s.*commit \([0-9.]*\) s.*/\1 \2/' |
    awk '{ s += $1 + $2 } END { printf "%.3f", s / NR }'
}
async_write_s() {
  grep -E "saved checkpoint .* at iteration [0-9]+:" "$1" | head -n "$saves" |
    sed 's/.*background write \([0-9.]*\) s.*/\1/' | awk '{ s += $1 } END { printf "%.3f", s / NR }'
}
checkpoint_mb() {
  grep -m1 -E "saved checkpoint .* at iteration [0-9]+:" "$1" | sed 's/.*: \([0-9]*\) bytes.*/\1/' |
    awk '{ printf "%.0f", $1 / 1e6 }'
}

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "checkpoint stall on $cpu ($(getconf _NPROCESSORS_ONLN) cores), $(df -h --output=source,fstype "$work" | tail -1 | tr -s ' '), one rank"
echo "a save every $interval steps, $saves saves in a window of $(( steps - interval )) steps"
printf "%-5s %6s | %8s %8s %8s %6s | %9s %9s %9s %6s | %8s %8s\n" case MB "sync s" "async s" "write s" ratio \
  "none s/st" "sync s/st" "async s/st" ratio "sync +s" "async +s"
case_row() {
  local name=$1 layers=$2
  run "$name-none" "$layers" none
  run "$name-sync" "$layers" sync
  run "$name-async" "$layers" async
  local per=$(( steps - interval ))
  awk -v n="$name" -v mb="$(checkpoint_mb "$work/$name-sync.log")" -v s="$(sync_save_s "$work/$name-sync.log")" \
      -v a="$(async_stall_s "$work/$name-async.log")" -v w="$(async_write_s "$work/$name-async.log")" \
      -v t0="$(window "$work/$name-none.log")" -v ts="$(window "$work/$name-sync.log")" \
      -v ta="$(window "$work/$name-async.log")" -v k="$per" -v sv="$saves" 'BEGIN {
    printf "%-5s %6d | %8.3f %8.3f %8.3f %6.3f | %9.3f %9.3f %9.3f %6.3f | %8.3f %8.3f\n",
           n, mb, s, a, w, a / s, t0 / k, ts / k, ta / k, ta / t0, (ts - t0) / sv, (ta - t0) / sv }'
}
for ((r = 1; r <= repeat; r++)); do
  if [[ -z "$only" || "$only" == "124M" ]]; then case_row 124M 12; fi
  if [[ -z "$only" || "$only" == "2G" ]]; then case_row 2G 24; fi
done
echo "(sync s: mean time a synchronous save blocks training; async s: the same for an asynchronous save (copy"
echo " + commit); write s: its background write; ratio: async s / sync s (goal <= 0.10). s/st: seconds per"
echo " step over the window, saves included; ratio: async / none (goal <= 1.05). +s: what each save added to"
echo " the window against no saves: blocking, waiting for a write still running, and the steps it slowed)"
