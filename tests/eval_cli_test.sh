#!/usr/bin/env bash
# End-to-end `gpt-train eval`: a checkpoint trained with tensor parallelism 2 on 2 ranks is evaluated with
# its training config, with no config at all (the checkpoint's own, from its metadata.yaml), and with no
# config on 2 data-parallel ranks; all three report the same validation loss. Without --config or --load,
# or with a --load that holds nothing, or with a microbatch whose logits alone exceed the host's memory,
# eval stops with a message. Usage: eval_cli_test.sh GPT_TRAIN SRC_DIR
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

expect_error "--config FILE is required for 'eval' \(or --load DIR" "$BIN" eval
expect_error "checkpoint $TMP/none: nothing to load" "$BIN" eval --load "$TMP/none"
expect_error "predicted memory per rank, .* is more than the host's" "$BIN" eval --config "$CFG" \
  --set training.micro_batch_size=1000000000 --set training.global_batch_size=1000000000
exit $fail
