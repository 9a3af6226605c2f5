#!/usr/bin/env bash
# The prepared check for a machine with an NVIDIA GPU: builds (or unpacks) gpt-train with the CUDA
# backend, runs the GPU tests (every CUDA op and the whole model against the CPU backend, the NCCL
# communicator on one rank) and a throughput benchmark of a GPT-2 124M-like and a GPT-3 1.3B-like model
# on one GPU in bf16 with synthetic data, then prints tokens/s and MFU per model. Everything runs under
# timeouts and fits in 8 minutes. The models are configs/gpt2-124m.yaml and configs/gpt2-1.3b.yaml as
# they are, except for what one GPU and a short run need: tensor parallelism off, a global batch of two
# microbatches, a few iterations, no checkpoints or evaluation, a metrics file per model.
#
#   MFU = (6 N + 12 L h s) * tokens/s / peak,  N = parameters (padded vocabulary, tied head counted once),
#   L layers, h hidden size, s sequence length, peak = 989e12 FLOP/s (H100/H200 dense bf16; override
#   with GPT_PEAK_FLOPS). 6 N is the forward + backward cost of the weights per token and 12 L h s that of
#   the attention scores and their product with V (full T x T, as computed here).
#
# Two modes, because the GPU machines this was written for have the CUDA toolkit (nvcc, cuBLAS, NCCL in
# /usr/local/cuda or in Python's nvidia-* packages) and a driver, but no internet, no apt and none of the
# other libraries gpt-train links:
#
#   scripts/gpu-check.sh pack   on the development machine (no GPU needed). Configures build-gpu/ with
#                               GPT_CUDA=ON for sm_80 and sm_90 and portable CPU code (-march=x86-64-v3:
#                               the GPU host's CPU is not this one), builds gpt-train, cuda_ops_test and
#                               nccl_test, and writes build-gpu/carry/bundle.tar.xz (about 20 MB): the
#                               stripped binaries plus every shared library they load from outside glibc
#                               and the CUDA toolkit, i.e. what `ldd build-gpu/gpt-train` lists: yaml-cpp,
#                               spdlog, fmt, oneDNN, HDF5 (+ sz/aec, curl and its
#                               TLS/Kerberos stack), OpenMPI (libmpi, open-rte, open-pal, hwloc, libevent,
#                               and its MCA plugin folder openmpi3/ with the plugins' own dependencies),
#                               sentencepiece; libstdc++/libgcc_s go in a fallback folder used only if the
#                               machine's are too old.
#   scripts/gpu-check.sh run    on the GPU machine. Unpacks build-gpu/carry/bundle.tar.xz when present
#                               (else builds from source into build-gpu/, which needs the libraries above
#                               installed), locates the CUDA, cuBLAS and NCCL libraries and the driver,
#                               runs the checks and prints the table. With the device tool:
#                               run(command="scripts/gpu-check.sh run", carry=["build-gpu/carry"],
#                                   timeout_s=540)
#                               Logs and the table are also written to $OUT when it is set.
#
# OpenMPI runs as a singleton (no mpirun, no orted: ess_singleton_isolated) with its plugins loaded from
# the bundle (mca_base_component_path) over shared memory only.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
MODE=${1:-run}
BUILD=$ROOT/build-gpu
CARRY=$BUILD/carry
START=$(date +%s)
BUDGET=${GPT_CHECK_BUDGET:-470}  # seconds for the whole run, under the 8-minute limit
PEAK=${GPT_PEAK_FLOPS:-989e12}
LOG=${OUT:-/tmp/gpt-gpu-check}
mkdir -p "$LOG"

say() { echo "[gpu-check $(($(date +%s) - START))s] $*"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }

# ---------------------------------------------------------------------------------------------------
pack() {
  say "configuring $BUILD (CUDA on, portable CPU flags)"
  cmake -S "$ROOT" -B "$BUILD" -DGPT_CUDA=ON -DCMAKE_BUILD_TYPE=Portable \
    -DCMAKE_CXX_FLAGS="-O3 -DNDEBUG -march=x86-64-v3" -DCMAKE_CUDA_FLAGS="-O3 -DNDEBUG" \
    -DCMAKE_CUDA_ARCHITECTURES="80;90" >"$LOG/configure.log" 2>&1 || { tail -20 "$LOG/configure.log"; exit 1; }
  say "building gpt-train cuda_ops_test nccl_test"
  cmake --build "$BUILD" -j"${JOBS:-2}" --target gpt-train cuda_ops_test nccl_test >"$LOG/build.log" 2>&1 ||
    { grep -E "error" -A3 "$LOG/build.log" | head -40; exit 1; }
  local stage=$BUILD/stage
  rm -rf "$stage" "$CARRY"
  mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-fallback" "$stage/openmpi" "$CARRY"
  strip -o "$stage/bin/gpt-train" "$BUILD/gpt-train"
  strip -o "$stage/bin/cuda_ops_test" "$BUILD/tests/cuda_ops_test"
  strip -o "$stage/bin/nccl_test" "$BUILD/tests/nccl_test"
  local plugins
  plugins=$(ompi_info --parsable --path pkglibdir 2>/dev/null | sed 's/^path:pkglibdir://')
  [ -d "$plugins" ] || plugins=$(dirname "$(ldconfig -p | awk '/libmpi.so.40 /{print $NF; exit}')")/openmpi/lib/openmpi3
  [ -d "$plugins" ] || { echo "cannot find OpenMPI's plugin folder"; exit 1; }
  cp -r "$plugins"/. "$stage/openmpi/"
  # Every library the binaries and the plugins load, minus glibc and what the GPU machine brings itself.
  ldd "$stage"/bin/* "$stage"/openmpi/*.so 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*)\.so|/usr/local/cuda|libcuda\.so|libnvidia|libcudart|libcublas|libnccl|libcudnn' |
    while read -r lib; do
      case "$(basename "$lib")" in
        libstdc++*|libgcc_s*) cp -L "$lib" "$stage/lib-fallback/" ;;
        *) cp -L "$lib" "$stage/lib/" ;;
      esac
    done
  say "packing $(du -sh "$stage" | cut -f1) into $CARRY/bundle.tar.xz"
  tar -C "$stage" -cJf "$CARRY/bundle.tar.xz" . || exit 1
  ls -la "$CARRY/bundle.tar.xz"
  say "done; carry build-gpu/carry to the GPU machine and run: scripts/gpu-check.sh run"
}

# ---------------------------------------------------------------------------------------------------
# Directories holding the CUDA runtime, cuBLAS, NCCL and the driver on this machine.
cuda_library_path() {
  local dirs=()
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/lib \
           /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu; do
    [ -d "$d" ] && dirs+=("$d")
  done
  # pip wheels (nvidia-nccl-cu13, nvidia-cublas, ...) put their libraries in site-packages/nvidia/*/lib.
  local py
  py=$(python3 -c 'import site, glob; print(":".join(sorted({d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")})))' 2>/dev/null)
  local IFS=:
  echo "${dirs[*]}${py:+:$py}"
}

setup_binaries() {
  if [ -f "$CARRY/bundle.tar.xz" ]; then
    BIN=/tmp/gpt-carry
    rm -rf "$BIN" && mkdir -p "$BIN"
    say "unpacking the carried bundle"
    tar -C "$BIN" -xJf "$CARRY/bundle.tar.xz" || exit 1
    GPT_TRAIN=$BIN/bin/gpt-train
    OPS_TEST=$BIN/bin/cuda_ops_test
    NCCL_TEST=$BIN/bin/nccl_test
    export LD_LIBRARY_PATH="$BIN/lib:$(cuda_library_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export OMPI_MCA_mca_base_component_path=$BIN/openmpi
    if ! "$GPT_TRAIN" --help >/dev/null 2>"$LOG/help.err"; then
      if grep -q -E "GLIBCXX|CXXABI|GCC_" "$LOG/help.err"; then
        export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$BIN/lib-fallback"
      fi
    fi
  else
    say "no carried bundle: building from source in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DGPT_CUDA=ON >"$LOG/configure.log" 2>&1 || { tail -20 "$LOG/configure.log"; exit 1; }
    timeout $(($(left) - 300)) cmake --build "$BUILD" -j"$(nproc)" --target gpt-train cuda_ops_test nccl_test \
      >"$LOG/build.log" 2>&1 || { grep -E "error" -A3 "$LOG/build.log" | head -40; exit 1; }
    GPT_TRAIN=$BUILD/gpt-train
    OPS_TEST=$BUILD/tests/cuda_ops_test
    NCCL_TEST=$BUILD/tests/nccl_test
    export LD_LIBRARY_PATH="$(cuda_library_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
  local missing
  missing=$(ldd "$GPT_TRAIN" "$OPS_TEST" "$NCCL_TEST" 2>&1 | grep "not found" | sort -u)
  if [ -n "$missing" ]; then
    echo "libraries not found:"; echo "$missing"; exit 1
  fi
}

# Parameters of the model: embedding (padded vocabulary) + positions + L blocks + final layernorm.
param_count() {  # L h s V
  python3 -c "
L, h, s, V = $1, $2, $3, $4
Vp = (V + 127) // 128 * 128
print(Vp * h + s * h + L * (12 * h * h + 13 * h) + 2 * h)"
}

# A model's dimensions from its config file, as "L h s V".
model_dims() {
  "$GPT_TRAIN" config --config "$1" --dump 2>/dev/null | python3 -c '
import sys, re
text = sys.stdin.read()
m = re.search(r"^model:\n((?:[ \t]+.*\n?)+)", text, re.M)
keys = dict(re.findall(r"^\s+(\w+):\s*([^#\s]+)", m.group(1), re.M)) if m else {}
print(keys.get("num_layers", "?"), keys.get("hidden_size", "?"), keys.get("seq_length", "?"), keys.get("vocab_size", "?"))'
}

# bench NAME CONFIG MICRO ITERS TIMEOUT: trains CONFIG on one GPU for ITERS iterations of two microbatches.
RESULTS=()
bench() {
  local name=$1 config=$2 mb=$3 iters=$4 limit=$5
  local L h s V
  read -r L h s V < <(model_dims "$config")
  local avail
  avail=$(left)
  if [ "$avail" -lt 60 ]; then
    RESULTS+=("$name|skipped: out of time||||"); return
  fi
  [ "$limit" -gt "$((avail - 10))" ] && limit=$((avail - 10))
  local metrics=/tmp/gpt-bench-$name.jsonl
  rm -f "$metrics"
  say "benchmark $name ($config: L=$L h=$h s=$s V=$V) micro=$mb x 2, $iters iterations (limit ${limit}s)"
  timeout "$limit" "$GPT_TRAIN" train --config "$config" --set backend=cuda --set precision.dtype=bf16 \
    --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.sequence_parallel=false \
    --set parallel.distributed_optimizer=false --set training.micro_batch_size="$mb" \
    --set training.global_batch_size=$((2 * mb)) --set training.train_iters="$iters" --set optimizer.warmup_iters=1 \
    --set data.train=[] --set data.synthetic=random --set eval.interval=0 --set checkpoint.save_interval=0 \
    --set checkpoint.dir=/tmp/gpt-bench-ckpt-$name --set logging.interval=1 \
    --set logging.metrics_file="$metrics" >"$LOG/bench-$name.log" 2>&1
  local rc=$?
  tail -3 "$LOG/bench-$name.log"
  local n
  n=$(param_count "$L" "$h" "$s" "$V")
  # tokens/s: median over the iterations after the first two (cuBLAS heuristics, allocator warm-up).
  local row
  row=$(python3 - "$metrics" "$n" "$L" "$h" "$s" "$PEAK" "$rc" <<'EOF'
import json, statistics, sys
path, n, L, h, s, peak, rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
except OSError:
    rows = []
tps = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
if not tps:
    print(f"{n/1e6:.0f}M|no iterations logged (exit {rc})|||")
    sys.exit()
steady = tps[2:] if len(tps) > 3 else tps[-1:]
t = statistics.median(steady)
flops_per_token = 6 * n + 12 * L * h * s
print(f"{n/1e6:.0f}M|{t:,.0f}|{flops_per_token * t / 1e12:.1f}|{100 * flops_per_token * t / peak:.1f}%|{len(tps)} iters, exit {rc}")
EOF
)
  RESULTS+=("$name|$row")
}

run_checks() {
  setup_binaries
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  say "cuda_ops_test"
  timeout 150 "$OPS_TEST" >"$LOG/cuda_ops_test.log" 2>&1
  local ops_rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|Failure|error" "$LOG/cuda_ops_test.log" | grep -v "^\[error\]" | head -40
  say "attention against the CPU, both CUDA paths (worst |gpu - cpu| / (|cpu| + rms))"
  grep -E "^\[error\] (lse|out|dqkv) " "$LOG/cuda_ops_test.log" | sed 's/^\[error\] //'
  grep -E "attention: not on cuDNN" "$LOG/cuda_ops_test.log" | head -2
  say "nccl_test (one rank)"
  timeout 60 "$NCCL_TEST" >"$LOG/nccl_test.log" 2>&1
  local nccl_rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|Failure|error" "$LOG/nccl_test.log" | head -20

  #     name        config                           micro iters timeout
  bench gpt2-124m   "$ROOT/configs/gpt2-124m.yaml"   16    12    110
  bench gpt2-1.3b   "$ROOT/configs/gpt2-1.3b.yaml"   8     8     220

  # Generation from the 124M benchmark's checkpoint: key/value-cached decoding on the GPU.
  local generated="not run (no checkpoint or out of time)"
  if [ -d /tmp/gpt-bench-ckpt-gpt2-124m ] && [ "$(left)" -gt 60 ]; then
    say "generate: gpt2-124m checkpoint on the GPU, 256 new tokens, greedy"
    timeout 60 "$GPT_TRAIN" generate --load /tmp/gpt-bench-ckpt-gpt2-124m --backend cuda --tokenizer bytes \
      --temperature 0 --max-new-tokens 256 >"$LOG/generate.log" 2>&1
    local gen_rc=$?
    generated=$(grep -oE '[0-9.]+ new token\(s\) in [0-9.]+ s: [0-9.]+ tokens/s' "$LOG/generate.log" || echo "failed (exit $gen_rc)")
    tail -2 "$LOG/generate.log"
  fi

  {
    echo
    echo "GPU tests: cuda_ops_test exit $ops_rc, nccl_test exit $nccl_rc (logs in $LOG)"
    echo "generate (gpt2-124m, bf16, cached decoding): $generated"
    echo "MFU = (6 N + 12 L h s) * tokens/s / $PEAK  (bf16, one GPU, synthetic data)"
    printf "%-10s | %-7s | %-12s | %-9s | %-6s | %s\n" model params tokens/s TFLOP/s MFU notes
    for r in "${RESULTS[@]}"; do
      IFS='|' read -r name params tps tflops mfu notes <<<"$r"
      printf "%-10s | %-7s | %-12s | %-9s | %-6s | %s\n" "$name" "$params" "$tps" "$tflops" "$mfu" "$notes"
    done
  } | tee "$LOG/gpu-check.txt"
  say "finished"
  [ "$ops_rc" -eq 0 ] && [ "$nccl_rc" -eq 0 ]
}

case "$MODE" in
  pack) pack ;;
  run) run_checks ;;
  *) echo "usage: scripts/gpu-check.sh [pack|run]"; exit 2 ;;
esac
