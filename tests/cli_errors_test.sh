#!/usr/bin/env bash
# End-to-end command line and start-up errors of the gpt-train binary: each subcommand's --help (exit 0,
# its own options), then each bad input must exit non-zero (2 for a bad command line), quickly, with a
# message naming the option, key, file or rule — never a crash or a hang. Then the paths those keys take:
# spaces and a leading ~. Usage: cli_errors_test.sh GPT_TRAIN SRC_DIR
source "$(dirname "$0")/cli_test_lib.sh"

# The overview and every subcommand's own --help exit 0 and name its own options; a bad command line
# exits 2 and names the subcommand.
expect_help "usage: gpt-train \[SUBCOMMAND\]" --help
expect_help "^  convert " help
for sub_and_flag in "train --load" "eval --random-init" "prep --output-prefix" "schedule --microbatches" \
    "config --dump" "plan --gpus-per-node" "convert --from" "generate --prompt-file"; do
  set -- $sub_and_flag
  expect_help "usage: gpt-train $1 \[options\]" "$1" --help
  expect_help "^  $2 " "$1" --help
  expect_help "^  $2 " help "$1"
  expect_exit 2 "unknown option --bogus for '$1'" "$BIN" "$1" --bogus
done
expect_exit 2 "unknown option --bogus for 'train'" "$BIN" --config "$CFG" --bogus 1
expect_exit 2 "--workers expects an integer, got 'two' \(see 'gpt-train prep --help'\)" "$BIN" prep --input "$SRC/README.md" \
  --output-prefix "$TMP/x" --workers two
expect_exit 2 "usage: gpt-train" "$BIN"

expect_error "unknown key 'model.hiden_size'" "$BIN" --config "$CFG" --set model.hiden_size=3
expect_error "model.hidden_size.*num_heads|num_heads.*hidden_size" "$BIN" --config "$CFG" --set model.num_heads=5
expect_error "expects int" "$BIN" --config "$CFG" --set model.num_layers=abc
expect_error "cannot open|No such file|not found|does not exist" "$BIN" --config "$TMP/missing.yaml"
printf 'model:\n  num_layers: 2\n  bogus: 1\n' >"$TMP/bad.yaml"
expect_error "bad.yaml.*unknown key 'model.bogus'" "$BIN" --config "$TMP/bad.yaml"
expect_error "config $TMP: is a directory" "$BIN" config --config "$TMP"
expect_error "passes over all ranks, more than" "$BIN" schedule --pp 100000 --microbatches 100000
expect_error "predicted memory per rank, .* is more than the host's" "${MPI[@]}" -np 2 "$BIN" --config "$CFG" --set training.micro_batch_size=1000000000 --set training.global_batch_size=2000000000
expect_error "unknown option --pipeline for 'schedule'" "$BIN" schedule --pipeline 2
expect_error "unknown option --gpu for 'plan'" "$BIN" plan --config "$CFG" --gpu 8
expect_error "unknown option --bogus for 'config'" "$BIN" config --config "$CFG" --bogus 1
expect_error "unknown option --bogus for 'train'" "${MPI[@]}" -np 2 "$BIN" --config "$CFG" --bogus 1
expect_error "world size 3 is not divisible by tensor \(2\)" "${MPI[@]}" -np 3 "$BIN" --config "$CFG" --set parallel.tensor=2
expect_error "world size 4 does not equal" "${MPI[@]}" -np 4 "$BIN" --config "$CFG" --set parallel.tensor=2 --set parallel.data=1
# Context parallelism: the sequence must cut into 2 x parallel.context chunks, and the world must match
# tensor x pipeline x context x data, each error naming the keys.
expect_error "model.seq_length \(64\) must be divisible by 2 x parallel.context \(2 x 3\)" "$BIN" --config "$CFG" --set parallel.context=3
expect_error "parallel.context must be >= 1, got 0" "$BIN" --config "$CFG" --set parallel.context=0
expect_error "world size 4 does not equal tensor \(2\) x pipeline \(1\) x context \(2\) x data \(2\) = 8.*parallel.context" "${MPI[@]}" -np 4 "$BIN" --config "$CFG" --set parallel.tensor=2 --set parallel.context=2 --set parallel.data=2
expect_error "world size 3 is not divisible by tensor \(1\) x pipeline \(1\) x context \(2\) = 2" "${MPI[@]}" -np 3 "$BIN" --config "$CFG" --set parallel.context=2
expect_error "num_layers.*pipeline|layers.*divisible" "${MPI[@]}" -np 4 "$BIN" --config "$CFG" --set parallel.pipeline=4 --set model.num_layers=6
expect_error "interleaved schedule needs microbatches" "${MPI[@]}" -np 2 "$BIN" --config "$CFG" --set parallel.pipeline=2 --set parallel.virtual_pipeline=2 --set model.num_layers=4 --set training.global_batch_size=12
expect_error "unknown subcommand" "$BIN" frobnicate
# Data: a shard whose vocabulary exceeds the model's.
"$BIN" prep --input "$SRC/README.md" --tokenizer bytes --output-prefix "$TMP/readme" >/dev/null 2>&1
expect_error "vocab" "$BIN" --config "$CFG" --set "data.train=[$TMP/readme]" --set model.vocab_size=100
expect_error "missing_shards" "$BIN" --config "$CFG" --set "data.train=[$TMP/missing_shards]"
# Non-finite floats and sizes whose products overflow name their keys.
expect_error "optimizer.lr must be a finite number, got inf" "$BIN" --config "$CFG" --set optimizer.lr=inf
expect_error "training.step_timeout_s must be a finite number" "$BIN" config --config "$CFG" --set training.step_timeout_s=.inf
expect_error "padded vocabulary .* overflows .*model.vocab_size = 9223372036854775807" "$BIN" --config "$CFG" --set model.vocab_size=9223372036854775807
expect_error "position embedding .* overflows .*model.seq_length = 9223372036854775807" "$BIN" --config "$CFG" --set model.seq_length=9223372036854775807
expect_error "model.num_layers must be <= 2147483647" "$BIN" --config "$CFG" --set model.num_layers=9223372036854775807
expect_error "microbatch count per step .*training.global_batch_size = 9223372036854775800" "$BIN" --config "$CFG" --set training.global_batch_size=9223372036854775800
# Paths: ~user is refused; a path with spaces is one path (the error names all of it).
expect_error "checkpoint.dir '~bob/ckpt': only ~ and ~/" "$BIN" --config "$CFG" --set 'checkpoint.dir=~bob/ckpt'
mkdir -p "$TMP/my data" "$TMP/home" "$TMP/cwd"
expect_error "$TMP/my data/missing" "$BIN" --config "$CFG" --set "data.train=[$TMP/my data/missing]"
# A shard prefix in a directory with spaces trains, and ~ in checkpoint.dir and logging.metrics_file is
# $HOME (no literal ./~ directory appears).
"$BIN" prep --input "$SRC/README.md" --tokenizer bytes --output-prefix "$TMP/my data/readme" >/dev/null 2>&1
out=$(cd "$TMP/cwd" && HOME="$TMP/home" timeout 120 "$BIN" --config "$CFG" --set "data.train=[$TMP/my data/readme]" \
      --set model.vocab_size=257 --set training.train_iters=2 --set eval.interval=0 \
      --set 'checkpoint.dir=~/ckpt' --set 'logging.metrics_file=~/m.jsonl' 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ ! -f "$TMP/home/ckpt/latest" ] || [ ! -s "$TMP/home/m.jsonl" ] || [ -e "$TMP/cwd/~" ]; then
  echo "FAIL (rc=$rc): training on '$TMP/my data/readme' with checkpoint.dir=~/ckpt"
  sed 's/^/    /' <<<"$out" | tail -5
  fail=1
else
  echo "ok: a prefix under 'my data' trains; ~/ckpt and ~/m.jsonl are under HOME"
fi
# Log lines carry no colour codes when the output is a file: neither under mpirun (whose ranks get a
# pseudo-terminal) nor on a terminal with NO_COLOR set (script(1) provides the terminal, where present).
timeout 120 "${MPI[@]}" -np 1 "$BIN" --config "$CFG" --set training.train_iters=1 --set eval.interval=0 \
  >"$TMP/mpirun.log" 2>&1
if grep -q $'\x1b\[' "$TMP/mpirun.log" || ! grep -q "iteration" "$TMP/mpirun.log"; then
  echo "FAIL: colour codes (or no iteration line) in a log written to a file under mpirun"
  fail=1
else
  echo "ok: no colour codes in a log file under mpirun"
fi
# On a terminal (a pseudo-terminal opened here) the log is coloured, unless NO_COLOR is set.
tty_run() {  # prints how many lines carried a colour code
  /usr/bin/python3 - "$@" <<'PY'
import os, subprocess, sys
master, slave = os.openpty()
proc = subprocess.Popen(sys.argv[1:], stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
os.close(slave)
out = b""
while True:
    try:
        chunk = os.read(master, 65536)
    except OSError:  # the terminal closes when the process exits
        break
    if not chunk:
        break
    out += chunk
proc.wait()
print(sum(1 for line in out.splitlines() if b"\x1b[" in line))
PY
}
tty_plain=$(NO_COLOR=1 timeout 120 bash -c "$(declare -f tty_run); tty_run '$BIN' --config '$CFG' --set training.train_iters=1 --set eval.interval=0")
tty_colour=$(env -u NO_COLOR timeout 120 bash -c "$(declare -f tty_run); tty_run '$BIN' --config '$CFG' --set training.train_iters=1 --set eval.interval=0")
if [ "${tty_plain:-x}" != 0 ] || [ "${tty_colour:-0}" -eq 0 ]; then
  echo "FAIL: on a terminal, NO_COLOR=1 gave '$tty_plain' coloured lines and no NO_COLOR gave '$tty_colour'"
  fail=1
else
  echo "ok: colour on a terminal ($tty_colour lines), none with NO_COLOR"
fi
exit $fail
