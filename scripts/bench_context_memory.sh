#!/usr/bin/env bash
# Peak memory per rank under context parallelism: one sequence of T = 16384 tokens (tiny widths: 2 layers,
# hidden 64, 4 heads, vocab 128; micro and global batch 1) trained for 2 steps on the CPU at
# parallel.context 1, 2 and 4 (1, 2 and 4 ranks under mpirun, one thread each). Prints, per run, the
# measured peak of rank 0 (the CPU backend's allocation high-water mark, from the iteration log), the memory
# model's prediction and its activation part, and each figure's ratio to context 1: the activations, which
# dominate at this length, divide by CP; the weights, gradients and Adam state do not.
#
# usage: scripts/bench_context_memory.sh [BUILD_DIR] [SEQ_LENGTH]
set -euo pipefail
build="${1:-build}"
seq="${2:-16384}"
gpt="$build/gpt-train"
[[ -x "$gpt" ]] || { echo "bench_context_memory: $gpt not found (build first, or pass BUILD_DIR)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work="$(mktemp -d "${TMPDIR:-/tmp}/gpt_cp_bench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cat >"$work/cp.yaml" <<YAML
model:
  num_layers: 2
  hidden_size: 64
  num_heads: 4
  seq_length: $seq
  vocab_size: 128
training:
  micro_batch_size: 1
  global_batch_size: 1
  train_iters: 2
logging:
  interval: 1
data:
  synthetic: pattern
YAML
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "CPU: $cpu; T = $seq, 2 layers, hidden 64, 4 heads, vocab 128, batch 1, fp32"
printf '%-8s %6s %14s %14s %16s %10s %12s %9s\n' context ranks "peak (MiB)" "predicted" "pred. activ." "peak/cp1" "activ./cp1" "step (s)"
base_peak="" base_act=""
for cp in 1 2 4; do
  log="$work/cp$cp.log"
  mpirun --oversubscribe --bind-to none -np "$cp" "$gpt" --config "$work/cp.yaml" --set parallel.context="$cp" \
    --set parallel.data=1 >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
  peak="$(grep 'iteration *2/' "$log" | sed -n 's/.*, \([0-9.]*\) peak.*/\1/p' | head -1)"
  step="$(grep 'iteration *2/' "$log" | sed -n 's/.*per iteration (ms): \([0-9.]*\).*/\1/p' | head -1)"
  pred_line="$(grep -m1 'predicted memory per rank' "$log")"
  to_mib() { awk -v v="$1" -v u="$2" 'BEGIN { f = u == "GiB" ? 1024 : u == "KiB" ? 1 / 1024 : 1; printf "%.1f", v * f }'; }
  total="$(echo "$pred_line" | sed -n 's/.*= \([0-9.]*\) \([KMG]iB\).*/\1 \2/p')"
  act="$(echo "$pred_line" | sed -n 's/.*activations \([0-9.]*\) \([KMG]iB\).*/\1 \2/p')"
  total_mib="$(to_mib $total)" act_mib="$(to_mib $act)"
  [[ -z "$base_peak" ]] && base_peak="$peak" base_act="$act_mib"
  printf '%-8s %6s %14s %14s %16s %10.3f %12.3f %9.2f\n' "$cp" "$cp" "$peak" "$total_mib" "$act_mib" \
    "$(awk -v a="$peak" -v b="$base_peak" 'BEGIN { print a / b }')" \
    "$(awk -v a="$act_mib" -v b="$base_act" 'BEGIN { print a / b }')" "$(awk -v s="$step" 'BEGIN { print s / 1000 }')"
done
