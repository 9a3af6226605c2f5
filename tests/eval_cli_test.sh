#!/usr/bin/env bash
# End-to-end `gpt-train eval`: a checkpoint trained with tensor parallelism 2 on 2 ranks is evaluated with
# its training config, with no config at all (the checkpoint's own, from its metadata.yaml), and with no
# config on 2 data-parallel ranks; all three report the same validation loss. On 3 ranks, which do not
# split the saved global batch of 8, eval picks another batch, says so, and reports the loss one rank
# gets with that batch. Without --config or --load, with a --load that holds nothing, with a microbatch
# whose logits alone exceed the host's memory, with a negative --iters, or with --config and no checkpoint
# (unless --random-init, which warns), eval stops with a message. Usage: eval_cli_test.sh GPT_TRAIN SRC_DIR
source "$(dirname "$0")/cli_test_lib.sh"

if ! timeout 120 "${MPI[@]}" -np 2 "$BIN" --config "$CFG" --set parallel.tensor=2 --set training.train_iters=3 \
    --set checkpoint.dir="$TMP/ckpt" >"$TMP/train.log" 2>&1; then
  echo "FAIL: training the checkpoint"; tail -5 "$TMP/train.log"; exit 1
fi

loss_of() {  # loss_of <log>: the reported validation loss
  grep -o 'valid at iteration 3 | lm loss: [0-9.E+-]*' "$1" | tail -1 | sed 's/.*lm loss: //'
}
timeout 60 "$BIN" eval --config "$CFG" --load "$TMP/ckpt" >"$TMP/with_config.log" 2>&1
timeout 60 "$BIN" eval --load "$TMP/ckpt" >"$TMP/no_config.log" 2>&1
timeout 60 "${MPI[@]}" -np 2 "$BIN" eval --load "$TMP/ckpt" >"$TMP/no_config_dp2.log" 2>&1
ref=$(loss_of "$TMP/with_config.log")
if [ -z "$ref" ]; then
  echo "FAIL: eval --config --load reported no loss"; tail -5 "$TMP/with_config.log"; fail=1
fi
for log in no_config no_config_dp2; do
  got=$(loss_of "$TMP/$log.log")
  if [ -z "$ref" ] || [ "$got" != "$ref" ]; then
    echo "FAIL: $log: loss '$got', with the training config '$ref'"; tail -5 "$TMP/$log.log"; fail=1
  else
    echo "ok: $log: loss $got"
  fi
done

# 3 ranks: the batch eval chose, then one rank with that batch reads the same samples.
timeout 60 "${MPI[@]}" -np 3 "$BIN" eval --load "$TMP/ckpt" >"$TMP/no_config_dp3.log" 2>&1
chosen=$(grep -oE 'evaluating batches of [0-9]+ samples \(micro batch [0-9]+\)' "$TMP/no_config_dp3.log" | head -1)
gb=$(sed -E 's/.*of ([0-9]+) samples.*/\1/' <<<"$chosen")
mb=$(sed -E 's/.*micro batch ([0-9]+).*/\1/' <<<"$chosen")
if [ -z "$chosen" ] || [ $((gb % (3 * mb))) -ne 0 ]; then
  echo "FAIL: 3 ranks: no note of a batch that splits over 3 ranks ('$chosen')"
  tail -5 "$TMP/no_config_dp3.log"; fail=1
else
  timeout 60 "$BIN" eval --load "$TMP/ckpt" --set training.global_batch_size="$gb" \
    --set training.micro_batch_size="$mb" >"$TMP/no_config_gb$gb.log" 2>&1
  got=$(loss_of "$TMP/no_config_dp3.log")
  want=$(loss_of "$TMP/no_config_gb$gb.log")
  if [ -z "$want" ] || ! awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(d * d <= 1e-10 * b * b) }'; then
    echo "FAIL: 3 ranks: loss '$got', one rank with a global batch of $gb: '$want'"
    tail -3 "$TMP/no_config_dp3.log"; fail=1
  else
    echo "ok: 3 ranks, $chosen: loss $got, as one rank with that batch"
  fi
fi

# No checkpoint: an error unless --random-init, which evaluates the initial weights with a warning.
expect_error "no checkpoint to evaluate .*pass --load DIR .* or --random-init" "$BIN" eval --config "$CFG"
expect_error "no checkpoint in checkpoint.dir $TMP/empty .*--random-init" "$BIN" eval --config "$CFG" \
  --set checkpoint.dir="$TMP/empty"
if timeout 60 "$BIN" eval --config "$CFG" --random-init --iters 1 --set logging.metrics_file= >"$TMP/random.log" 2>&1 &&
   grep -q "NO CHECKPOINT IS LOADED; evaluating the RANDOMLY INITIALISED weights" "$TMP/random.log" &&
   grep -q "valid at iteration 0 | lm loss: " "$TMP/random.log"; then
  echo "ok: --random-init evaluates the initial weights, with a warning"
else
  echo "FAIL: eval --config --random-init"; tail -5 "$TMP/random.log"; fail=1
fi
expect_error "--random-init evaluates the initial weights and --load" "$BIN" eval --config "$CFG" --random-init \
  --load "$TMP/ckpt"
expect_error "--iters -3: expected a number of batches >= 0" "$BIN" eval --load "$TMP/ckpt" --iters -3
expect_error "--iters expects an integer, got 'two'" "$BIN" eval --load "$TMP/ckpt" --iters two

expect_error "--config FILE is required for 'eval' \(or --load DIR" "$BIN" eval
expect_error "checkpoint $TMP/none: nothing to load" "$BIN" eval --load "$TMP/none"
expect_error "predicted memory per rank, .* is more than the host's" "$BIN" eval --config "$CFG" \
  --set training.micro_batch_size=1000000000 --set training.global_batch_size=1000000000
exit $fail
