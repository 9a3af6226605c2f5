#!/usr/bin/env bash
# Checkpoint save and load time and bytes, against the disk's own speed measured in the same run on the
# same filesystem: config M (6 layers, hidden 384, 6 heads, seq 256, vocab 50304; 30M parameters) and a
# ~1B-parameter GPT (22 layers, hidden 1792, 16 heads, seq 256, vocab 50304; 0.94B parameters: fp32
# weights + Adam moments = 12 bytes per parameter on disk, ~16 GB of memory while training, which is
# what a 24 GB machine shared with other work can hold; --layers N changes the layer count).
#
# Each case trains one step with checkpoint.dir set and synchronous saves (the training-step stall of
# asynchronous ones is scripts/bench_checkpoint_async.sh's; the save after the last step is timed by gpt-train
# itself: rank files written and fsynced, metadata, rename, `latest`), then evicts the checkpoint from
# the page cache and starts again from it (the load is timed likewise: index validation, reads, CRC
# checks, copies into the model). The disk is shared and its speed drifts, so dd runs right before and
# right after each save and load (a write of the same number of bytes with conv=fdatasync, and a cold
# read of that file) and the ratio uses the mean of the two. Config M runs three times.
#
# usage: scripts/bench_checkpoint.sh [--only M|1B] [--layers N] [BUILD_DIR] [WORK_DIR]
#   BUILD_DIR defaults to ./build; WORK_DIR (default: a new directory under $TMPDIR or /tmp) needs about
#   twice the largest checkpoint free (~25 GB for the 1B case). Results are printed as a table.
set -euo pipefail

only=""
big_layers=22
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --only) only="$2"; shift 2 ;;
    --layers) big_layers="$2"; shift 2 ;;
    *) echo "bench_checkpoint: unknown option $1" >&2; exit 2 ;;
  esac
done
build="${1:-build}"
work="${2:-$(mktemp -d "${TMPDIR:-/tmp}/gpt_ckpt_bench.XXXXXX")}"
gpt="$build/gpt-train"
[[ -x "$gpt" ]] || { echo "bench_checkpoint: $gpt not found (build first, or pass BUILD_DIR)" >&2; exit 1; }
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Drops files' pages from the page cache (clean pages only; everything here was fsynced).
evict() { for f in "$@"; do dd if="$f" iflag=nocache count=0 status=none; done; }

# dd's own "N bytes ... copied, S s, R MB/s" line -> seconds.
dd_seconds() { sed -n 's/.* copied, \([0-9.e+-]*\) s,.*/\1/p' | tail -1; }

# A dd write of $1 bytes with conv=fdatasync, then a cold read of it: prints "write_MB/s read_MB/s".
dd_speeds() {
  local blocks=$(( ($1 + 4194303) / 4194304 ))
  local w r
  w=$(dd if=/dev/zero of="$work/dd.bin" bs=4M count=$blocks conv=fdatasync 2>&1 | dd_seconds)
  evict "$work/dd.bin"
  r=$(dd if="$work/dd.bin" of=/dev/null bs=4M 2>&1 | dd_seconds)
  rm -f "$work/dd.bin"
  awk -v b=$(( blocks * 4194304 )) -v w="$w" -v r="$r" 'BEGIN { printf "%.1f %.1f", b / w / 1e6, b / r / 1e6 }'
}

# "BYTES SECONDS" from gpt-train's "saved checkpoint ..." or "loaded checkpoint ..." log line.
logged() {
  grep -o "$1 checkpoint .*: [0-9]* bytes in [0-9.]* s" "$2" | tail -1 |
    sed 's/.*: \([0-9]*\) bytes in \([0-9.]*\) s/\1 \2/'
}

header() {
  echo "checkpoint I/O on $(df -h --output=source,fstype "$work" | tail -1 | tr -s ' ') ($(getconf _NPROCESSORS_ONLN) cores), one rank"
  printf "%-4s %10s %8s %8s %8s %6s | %8s %8s %8s %6s\n" case MB "save s" MB/s "dd w" ratio "load s" MB/s "dd r" ratio
}

# Rows are printed as they are measured (to stdout; progress goes to stderr).
run_case() {
  local name=$1 layers=$2 hidden=$3 heads=$4 rep=$5
  local dir="$work/$name" cfg="$work/$name.yaml"
  rm -rf "$dir"
  printf '%s\n' \
    "model: {num_layers: $layers, hidden_size: $hidden, num_heads: $heads, seq_length: 256, vocab_size: 50304}" \
    "training: {micro_batch_size: 1, global_batch_size: 1, train_iters: 1}" \
    "checkpoint: {dir: $dir, keep_last: 1, async_save: false}" \
    "logging: {interval: 1}" > "$cfg"
  # Parameters x 12 bytes (fp32 values and two moments): what dd writes before the save.
  local estimate
  estimate=$(awk -v l="$layers" -v h="$hidden" 'BEGIN { printf "%d", (12 * l * h * h + 50304 * h + 256 * h) * 12 }')
  local dd_w1 dd_r1 dd_w2 dd_r2 dd_w3 dd_r3 bytes save_s load_bytes load_s
  echo "== $name (run $rep): dd, one training step and its save, dd" >&2
  read -r dd_w1 dd_r1 <<< "$(dd_speeds "$estimate")"
  "$gpt" train --config "$cfg" > "$work/$name.save.log" 2>&1 || { cat "$work/$name.save.log" >&2; exit 1; }
  read -r bytes save_s <<< "$(logged saved "$work/$name.save.log")"
  read -r dd_w2 dd_r2 <<< "$(dd_speeds "$bytes")"

  echo "== $name (run $rep): load with the page cache evicted, dd" >&2
  evict "$dir"/iter_*/*
  "$gpt" train --config "$cfg" > "$work/$name.load.log" 2>&1 || { cat "$work/$name.load.log" >&2; exit 1; }
  read -r load_bytes load_s <<< "$(logged loaded "$work/$name.load.log")"
  read -r dd_w3 dd_r3 <<< "$(dd_speeds "$bytes")"
  rm -rf "$dir"
  awk -v n="$name" -v b="$bytes" -v s="$save_s" -v lb="$load_bytes" -v l="$load_s" \
                 -v w1="$dd_w1" -v w2="$dd_w2" -v r2="$dd_r2" -v r3="$dd_r3" 'BEGIN {
      sw = b / s / 1e6; dw = (w1 + w2) / 2; lr = lb / l / 1e6; dr = (r2 + r3) / 2;
      printf "%-4s %10.1f %8.2f %8.0f %8.0f %6.2f | %8.2f %8.0f %8.0f %6.2f\n",
             n, b / 1e6, s, sw, dw, sw / dw, l, lr, dr, lr / dr }'
}

header
if [[ -z "$only" || "$only" == "M" ]]; then for rep in 1 2 3; do run_case M 6 384 6 "$rep"; done; fi
if [[ -z "$only" || "$only" == "1B" ]]; then run_case 1B "$big_layers" 1792 16 1; fi
echo "(MB/s: checkpoint bytes / time; dd w: sequential write with conv=fdatasync, dd r: cold sequential read,"
echo " each the mean of the runs just before and after; ratio = checkpoint / dd)"
