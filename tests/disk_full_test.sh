#!/usr/bin/env bash
# A full disk under HDF5 writes. On a small tmpfs, with filler files leaving various amounts of space:
# training on 1 and 2 ranks whose checkpoint does not fit, and `prep` whose shards do not fit, must exit
# with status 1 (never by a signal) and a message naming the file under the full file system. A failed
# save leaves no incomplete iter_NNNNNNN directory (at most an iter_NNNNNNN.tmp staging directory), and
# the checkpoint saved before it stays the one `latest` names and evaluates (also when the failing save is
# written in the background: checkpoint.async_save, the default); every shard prep completed
# before the failure holds what a run on a roomy disk writes. Mounting needs root: skipped (77) otherwise.
# Usage: disk_full_test.sh GPT_TRAIN SRC_DIR
source "$(dirname "$0")/cli_test_lib.sh"

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: mounting a small tmpfs needs root"; exit 77
fi
TRAIN=(--config "$CFG" --set logging.metrics_file= --set eval.interval=0 --set checkpoint.save_interval=1)

# The size of one checkpoint of this model, on a roomy disk; the tmpfs holds two and a bit.
if ! timeout 120 "$BIN" "${TRAIN[@]}" --set training.train_iters=1 --set checkpoint.dir="$TMP/ref" \
    >"$TMP/ref.log" 2>&1; then
  echo "FAIL: training the reference checkpoint"; tail -5 "$TMP/ref.log"; exit 1
fi
size=$(du -sk "$TMP/ref/iter_0000001" | cut -f1)
echo "one checkpoint: $size KiB"
MNT=$TMP/full
mkdir -p "$MNT"
if ! mount -t tmpfs -o size=$((2 * size + 1024))k tmpfs "$MNT" 2>"$TMP/mount.err"; then
  echo "SKIP: cannot mount a tmpfs: $(cat "$TMP/mount.err")"; exit 77
fi
trap 'umount "$MNT" 2>/dev/null; rm -rf "$TMP"' EXIT

# leave_free <KiB>: empties the file system, then fills it up to that much free space.
leave_free() {
  rm -rf "${MNT:?}"/*
  local avail
  avail=$(df -k --output=avail "$MNT" | tail -1)
  if [ "$avail" -gt "$1" ]; then head -c $(((avail - $1) * 1024)) /dev/zero >"$MNT/filler"; fi
}

# expect_disk_full <name> <log pattern> command...: exit status 1 and the pattern in the output.
expect_disk_full() {
  local name=$1 pattern=$2 rc
  shift 2
  timeout 120 "$@" >"$TMP/$name.log" 2>&1
  rc=$?
  if [ $rc -ne 1 ] || ! grep -qE -e "$pattern" "$TMP/$name.log"; then
    echo "FAIL ($name): rc=$rc (expected 1), expected /$pattern/ in:"
    grep -v '^\[' "$TMP/$name.log" | tail -5 | sed 's/^/    /'
    fail=1
  else
    echo "ok ($name): $(grep -oE -e "$pattern.*" "$TMP/$name.log" | head -1 | cut -c1-160)"
  fi
}

# check_checkpoints <name> <dir> [<expected latest>]: every iter_NNNNNNN directory is complete, and
# `latest` names the expected one (none when not given).
check_checkpoints() {
  local name=$1 dir=$2 want=${3:-} d
  for d in "$dir"/iter_*; do
    [ -e "$d" ] || continue
    case $d in *.tmp) continue ;; esac
    if [ ! -f "$d/metadata.yaml" ]; then echo "FAIL ($name): incomplete checkpoint $d"; fail=1; fi
  done
  local latest=""
  [ -f "$dir/latest" ] && latest=$(cat "$dir/latest")
  if [ "$latest" != "$want" ]; then echo "FAIL ($name): latest is '$latest', expected '$want'"; fail=1; fi
}

# The first save fails at different points: creating the file, writing a dataset, the final flush.
for free in 4 $((size / 8)) $((size / 2)) $((size - 24)); do
  leave_free "$free"
  expect_disk_full "train_free_$free" "$MNT/ck/iter_0000001\.tmp/rank_00000\.h5: .*No space left on device" \
    "$BIN" "${TRAIN[@]}" --set training.train_iters=1 --set checkpoint.dir="$MNT/ck"
  check_checkpoints "train_free_$free" "$MNT/ck"
done

# Room for one checkpoint and a half: the second save fails, written synchronously or in the background
# (then reported at the next step); the run stops with status 1, `latest` still names the first, which
# keep_last 1 has not pruned and which stays intact and loadable.
for async in false true; do
  leave_free $((size * 3 / 2))
  expect_disk_full "train_second_async_$async" \
    "$( [ $async = true ] && echo 'written in the background\): .*')$MNT/ck/iter_0000002\.tmp/rank_0000[0-9]\.h5: .*No space left on device" \
    "$BIN" "${TRAIN[@]}" --set training.train_iters=6 --set checkpoint.keep_last=1 \
    --set checkpoint.async_save=$async --set checkpoint.dir="$MNT/ck"
  check_checkpoints "train_second_async_$async" "$MNT/ck" iter_0000001
  [ -f "$MNT/ck/iter_0000001/metadata.yaml" ] || { echo "FAIL (train_second_async_$async): iter_0000001 pruned"; fail=1; }
  if grep -q "iteration *6/" "$TMP/train_second_async_$async.log"; then
    echo "FAIL (train_second_async_$async): the run trained on to the end after the failed save"; fail=1
  fi
done
rm -f "$MNT/filler"
if timeout 60 "$BIN" eval --load "$MNT/ck" --iters 1 >"$TMP/eval.log" 2>&1 &&
   grep -q "loaded checkpoint $MNT/ck/iter_0000001" "$TMP/eval.log"; then
  echo "ok: the previous checkpoint evaluates"
else
  echo "FAIL: evaluating the checkpoint saved before the failed save"; tail -5 "$TMP/eval.log"; fail=1
fi

# Two ranks, each writing half of every tensor.
for free in $((size / 4)) $((size - 24)); do
  leave_free "$free"
  expect_disk_full "train_tp2_free_$free" "$MNT/ck/iter_0000001\.tmp/rank_0000[01]\.h5: .*No space left on device" \
    "${MPI[@]}" -np 2 "$BIN" "${TRAIN[@]}" --set parallel.tensor=2 --set training.train_iters=1 \
    --set checkpoint.dir="$MNT/ck"
  check_checkpoints "train_tp2_free_$free" "$MNT/ck"
done

# prep: about 40 shards of 20,000 tokens; the shards completed before the failure match a roomy run's.
/usr/bin/python3 -c "
import json, sys
with open(sys.argv[1], 'w') as f:
    for i in range(20000):
        f.write(json.dumps({'text': 'document %d: the quick brown fox jumps over the lazy dog' % i}) + '\n')
" "$TMP/docs.jsonl"
PREP=(prep --input "$TMP/docs.jsonl" --tokenizer bytes --shard-tokens 20000 --workers 2)
"$BIN" "${PREP[@]}" --output-prefix "$TMP/ref_data/p" >"$TMP/prep_ref.log" 2>&1 || {
  echo "FAIL: prep on a roomy disk"; tail -5 "$TMP/prep_ref.log"; exit 1
}
for free in 4 40 300 700; do
  leave_free "$free"
  expect_disk_full "prep_free_$free" "$MNT/data/p(_[0-9]{5}\.h5\.tmp|\.index\.json\.tmp).*No space left on device" \
    "$BIN" "${PREP[@]}" --output-prefix "$MNT/data/p"
  for left in "$MNT"/data/*.tmp; do
    if [ -e "$left" ]; then echo "FAIL (prep_free_$free): $left left behind"; fail=1; fi
  done
  if ! /usr/bin/python3 - "$TMP/ref_data" "$MNT"/data/p_*.h5 <<'PY'
import os, sys
try:
    import h5py, numpy as np
except ImportError:
    sys.exit(0)  # no h5py: the shards are not compared
ref, shards = sys.argv[1], [s for s in sys.argv[2:] if os.path.exists(s)]
for s in shards:
    with h5py.File(s, 'r') as got, h5py.File(os.path.join(ref, os.path.basename(s)), 'r') as want:
        for name in ('tokens', 'doc_offsets'):
            if not np.array_equal(got[name][:], want[name][:]):
                sys.exit('%s: %s differs from the same shard written on a roomy disk' % (s, name))
print('  %d completed shard(s) match' % len(shards))
PY
  then
    echo "FAIL (prep_free_$free)"; fail=1
  fi
done
exit $fail
