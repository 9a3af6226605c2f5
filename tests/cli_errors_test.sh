#!/usr/bin/env bash
# End-to-end start-up errors of the gpt-train binary: each bad input must exit non-zero, quickly, with a
# message naming the key, file or rule — never a crash or a hang. Usage: cli_errors_test.sh GPT_TRAIN SRC_DIR
source "$(dirname "$0")/cli_test_lib.sh"

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
expect_error "num_layers.*pipeline|layers.*divisible" "${MPI[@]}" -np 4 "$BIN" --config "$CFG" --set parallel.pipeline=4 --set model.num_layers=6
expect_error "interleaved schedule needs microbatches" "${MPI[@]}" -np 2 "$BIN" --config "$CFG" --set parallel.pipeline=2 --set parallel.virtual_pipeline=2 --set model.num_layers=4 --set training.global_batch_size=12
expect_error "unknown subcommand" "$BIN" frobnicate
# Data: a shard whose vocabulary exceeds the model's.
"$BIN" prep --input "$SRC/README.md" --tokenizer bytes --output-prefix "$TMP/readme" >/dev/null 2>&1
expect_error "vocab" "$BIN" --config "$CFG" --set "data.train=[$TMP/readme]" --set model.vocab_size=100
expect_error "missing_shards" "$BIN" --config "$CFG" --set "data.train=[$TMP/missing_shards]"
exit $fail
