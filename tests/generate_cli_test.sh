#!/usr/bin/env bash
# End-to-end `gpt-train generate`: a byte-level model trained for a few steps with tensor parallelism 2 on
# 2 ranks samples text on one rank (resharded on load) with the tokenizer its checkpoint records.
# Temperature 0 gives the same text twice, top-k 1 gives the greedy text at any temperature, a seed
# repeats its samples, and --num-samples prints that many. A GPT-2 BPE model trained with data.vocab_file /
# data.merges_file carries the files in its checkpoint and generates from them; without them generate
# asks for the files. Bad input stops with a message: an empty prompt, a prompt longer than seq_length,
# a tokenizer whose end-of-document id or whose prompt pieces the model's vocabulary cannot hold, a
# checkpoint without a tokenizer record, more than one rank, a bad sampling option, tokenizer files
# without --tokenizer, tokenizer files that do not match the data. Usage: generate_cli_test.sh GPT_TRAIN SRC_DIR
source "$(dirname "$0")/cli_test_lib.sh"

# Documents the model can learn a little of in a few steps.
for i in $(seq 1 400); do printf 'the cat sat on the mat %d\n%%\n' "$i"; done >"$TMP/corpus.txt"
"$BIN" prep --input "$TMP/corpus.txt" --doc-separator % --tokenizer bytes --output-prefix "$TMP/bytes" \
  >"$TMP/prep.log" 2>&1 || { echo "FAIL: prep"; cat "$TMP/prep.log"; exit 1; }
COMMON=(--config "$CFG" --set model.vocab_size=257 --set training.train_iters=20 --set eval.interval=0
        --set logging.metrics_file= --set data.synthetic=random)
if ! timeout 120 "${MPI[@]}" -np 2 "$BIN" train "${COMMON[@]}" --set parallel.tensor=2 \
    --set "data.train=[$TMP/bytes]" --set checkpoint.dir="$TMP/ckpt" >"$TMP/train.log" 2>&1; then
  echo "FAIL: training the byte-level checkpoint"; tail -5 "$TMP/train.log"; exit 1
fi

gen() {  # gen <out file> <args...>: generate on one rank, stdout to the file, stderr to file.err
  local out=$1
  shift
  timeout 60 "$BIN" generate --load "$TMP/ckpt" "$@" >"$out" 2>"$out.err"
}
same() {  # same <what> <file a> <file b>
  if [ -s "$2" ] && cmp -s "$2" "$3"; then echo "ok: $1"; else
    echo "FAIL: $1"; head -3 "$2" "$3" "$2.err"; fail=1
  fi
}

gen "$TMP/greedy1" --temperature 0 --prompt "the cat" --max-new-tokens 30
gen "$TMP/greedy2" --temperature 0 --prompt "the cat" --max-new-tokens 30
same "temperature 0 is deterministic" "$TMP/greedy1" "$TMP/greedy2"
if grep -q '^the cat' "$TMP/greedy1" && grep -qE '[0-9.]+ tokens/s' "$TMP/greedy1.err"; then
  echo "ok: the prompt leads the text; tokens/s reported: $(grep -oE '[0-9.]+ tokens/s' "$TMP/greedy1.err")"
else
  echo "FAIL: greedy output"; cat "$TMP/greedy1" "$TMP/greedy1.err"; fail=1
fi
gen "$TMP/topk1" --temperature 1.5 --top-k 1 --prompt "the cat" --max-new-tokens 30 --seed 9
same "top-k 1 equals greedy" "$TMP/greedy1" "$TMP/topk1"
gen "$TMP/seed_a" --seed 5 --prompt "the cat" --max-new-tokens 30 --num-samples 3 --top-p 0.9
gen "$TMP/seed_b" --seed 5 --prompt "the cat" --max-new-tokens 30 --num-samples 3 --top-p 0.9
same "the same seed gives the same samples" "$TMP/seed_a" "$TMP/seed_b"
if [ "$(grep -c '^--- sample [0-9] of 3' "$TMP/seed_a")" = 3 ]; then echo "ok: three samples"; else
  echo "FAIL: --num-samples 3"; cat "$TMP/seed_a"; fail=1
fi
gen "$TMP/unconditional" --max-new-tokens 20 --seed 1
if [ -s "$TMP/unconditional" ]; then echo "ok: sampling without a prompt"; else
  echo "FAIL: unconditional sampling"; cat "$TMP/unconditional.err"; fail=1
fi
printf 'the mat' >"$TMP/prompt.txt"
gen "$TMP/from_file" --temperature 0 --prompt-file "$TMP/prompt.txt" --max-new-tokens 5
if grep -q '^the mat' "$TMP/from_file"; then echo "ok: --prompt-file"; else echo "FAIL: --prompt-file"; fail=1; fi

long=$(printf 'x%.0s' $(seq 1 80))
expect_error "--prompt is empty" "$BIN" generate --load "$TMP/ckpt" --prompt ""
expect_error "prompt is 80 tokens.*seq_length of 64" "$BIN" generate --load "$TMP/ckpt" --prompt "$long"
expect_error "--temperature -1.*>= 0" "$BIN" generate --load "$TMP/ckpt" --temperature -1
expect_error "--top-p 1.5" "$BIN" generate --load "$TMP/ckpt" --top-p 1.5
expect_error "checkpoint $TMP/nowhere: nothing to load" "$BIN" generate --load "$TMP/nowhere"
expect_error "generate runs on one rank.*started on 2" "${MPI[@]}" -np 2 "$BIN" generate --load "$TMP/ckpt"
expect_error "give --prompt or --prompt-file, not both" "$BIN" generate --load "$TMP/ckpt" --prompt a \
  --prompt-file "$TMP/prompt.txt"

# Synthetic data records no tokenizer; the bytes tokenizer's end-of-document id 256 is outside a 64-id model.
timeout 120 "$BIN" train --config "$CFG" --set model.vocab_size=64 --set training.train_iters=2 --set eval.interval=0 \
  --set logging.metrics_file= --set checkpoint.dir="$TMP/synthetic" >"$TMP/synthetic.log" 2>&1 ||
  { echo "FAIL: training on synthetic data"; tail -5 "$TMP/synthetic.log"; fail=1; }
expect_error "records no tokenizer.*--tokenizer bytes" "$BIN" generate --load "$TMP/synthetic"
expect_error "bytes tokenizer's end-of-document id 256 is outside the model's vocabulary of 64" \
  "$BIN" generate --load "$TMP/synthetic" --tokenizer bytes --prompt "hello"
expect_error "--vocab-file and --merges-file need --tokenizer" "$BIN" generate --load "$TMP/synthetic" --vocab-file x
timeout 120 "$BIN" train --config "$CFG" --set model.vocab_size=260 --set training.train_iters=2 --set eval.interval=0 \
  --set logging.metrics_file= --set checkpoint.dir="$TMP/synthetic260" >"$TMP/synthetic260.log" 2>&1 ||
  { echo "FAIL: training on synthetic data (260 ids)"; tail -5 "$TMP/synthetic260.log"; fail=1; }
timeout 60 "$BIN" generate --load "$TMP/synthetic260" --tokenizer bytes --prompt "!" --max-new-tokens 4 \
  >"$TMP/synthetic.out" 2>&1 && echo "ok: --tokenizer for a checkpoint without a record" ||
  { echo "FAIL: --tokenizer bytes on the synthetic checkpoint"; cat "$TMP/synthetic.out"; fail=1; }
# A SentencePiece vocabulary of 400 pieces against the 260-id model: merged pieces of the prompt fall outside.
"$BIN" prep --input "$TMP/corpus.txt" --doc-separator % --tokenizer spm --vocab-size 400 --output-prefix "$TMP/spm" \
  >"$TMP/prep_spm.log" 2>&1 || { echo "FAIL: prep spm"; tail -3 "$TMP/prep_spm.log"; fail=1; }
expect_error "the prompt's token [0-9]+ \(id [0-9]+, '.*'\) is outside the model's vocabulary of 260 ids: the spm tokenizer cannot encode" \
  "$BIN" generate --load "$TMP/synthetic260" --tokenizer spm --vocab-file "$TMP/spm.spm.model" --prompt "the cat sat on the mat"

# GPT-2 BPE: the files travel in the checkpoint when the config names them.
V=$SRC/tests/data/gpt2_tiny/vocab.json
M=$SRC/tests/data/gpt2_tiny/merges.txt
"$BIN" prep --input "$TMP/corpus.txt" --doc-separator % --tokenizer gpt2 --vocab-file "$V" --merges-file "$M" \
  --output-prefix "$TMP/bpe" >"$TMP/prep_bpe.log" 2>&1 || { echo "FAIL: prep gpt2"; cat "$TMP/prep_bpe.log"; exit 1; }
BPE=(--config "$CFG" --set model.vocab_size=512 --set training.train_iters=4 --set eval.interval=0
     --set logging.metrics_file= --set "data.train=[$TMP/bpe]" --set data.tokenizer=gpt2)
timeout 120 "$BIN" train "${BPE[@]}" --set data.vocab_file="$V" --set data.merges_file="$M" \
  --set checkpoint.dir="$TMP/bpe_ckpt" >"$TMP/bpe.log" 2>&1 || { echo "FAIL: training gpt2"; tail -5 "$TMP/bpe.log"; fail=1; }
if ls "$TMP"/bpe_ckpt/iter_*/tokenizer/vocab.json >/dev/null 2>&1 &&
   timeout 60 "$BIN" generate --load "$TMP/bpe_ckpt" --prompt "the cat" --temperature 0 --max-new-tokens 8 \
     >"$TMP/bpe.out" 2>"$TMP/bpe.err" && grep -q '^the cat' "$TMP/bpe.out"; then
  echo "ok: gpt2 tokenizer files in the checkpoint"
else
  echo "FAIL: gpt2 generate from the checkpoint's files"; cat "$TMP/bpe.out" "$TMP/bpe.err"; fail=1
fi
timeout 120 "$BIN" train "${BPE[@]}" --set checkpoint.dir="$TMP/bpe_nofiles" >"$TMP/bpe_nofiles.log" 2>&1 ||
  { echo "FAIL: training gpt2 without files"; fail=1; }
expect_error "records the gpt2 tokenizer .* but not its files.*--vocab-file vocab.json --merges-file merges.txt" \
  "$BIN" generate --load "$TMP/bpe_nofiles"
timeout 60 "$BIN" generate --load "$TMP/bpe_nofiles" --tokenizer gpt2 --vocab-file "$V" --merges-file "$M" \
  --max-new-tokens 4 >"$TMP/bpe_flags.out" 2>&1 && echo "ok: gpt2 files by flag" ||
  { echo "FAIL: gpt2 files by flag"; cat "$TMP/bpe_flags.out"; fail=1; }
expect_error "trained on data tokenized with gpt2@.*not bytes@bytes" \
  "$BIN" generate --load "$TMP/bpe_nofiles" --tokenizer bytes
expect_error "data.vocab_file .* is set, but the data was tokenized with bytes" \
  "$BIN" train --config "$CFG" --set model.vocab_size=512 --set "data.train=[$TMP/bytes]" \
  --set data.vocab_file="$V" --set data.merges_file="$M" --set training.train_iters=1 --set checkpoint.dir="$TMP/x1"
{ cat "$V"; echo; } >"$TMP/other_vocab.json"  # the same ids, other bytes: another vocabulary hash
expect_error "data.vocab_file .* is gpt2@.*but the data was tokenized with gpt2@" \
  "$BIN" train "${BPE[@]}" --set data.vocab_file="$TMP/other_vocab.json" --set data.merges_file="$M" \
  --set checkpoint.dir="$TMP/x2"
expect_error "data.vocab_file: GPT-2 vocab file .*merges.txt' is not a JSON object" \
  "$BIN" train "${BPE[@]}" --set data.vocab_file="$M" --set data.merges_file="$V" --set checkpoint.dir="$TMP/x3"
exit $fail
