#!/usr/bin/env bash
# The prepared check for a machine with an NVIDIA GPU: builds (or unpacks) gpt-train with the CUDA
# backend and runs, in this order, each step under a timeout and always reaching the final table:
#   1. the CUDA op tests against the CPU at real shapes (fp32, bf16, fp16; each attention path's error);
#   2. 10 training steps of the tiny model in fp32 on the GPU against the CPU (losses within 1e-4);
#   3. the 8-rank layout-equivalence test (tests/parallel/pipeline/layout_test.cpp, fp32 and bf16) with backend cuda, every
#      rank on the one GPU and the groups host-staged over MPI (parallel.communicator mpi), when an
#      mpirun can start (the machine's, or the carried orterun/orted); then the context-parallel test
#      (tests/parallel/grid/context_parallel_test.cpp: gradients and fp32/bf16 runs at context 2 and 4, ring attention on
#      the CUDA block ops) likewise; then the NCCL communicator on one rank; then the tensor-parallel
#      overlap (tests/parallel/grid/tp_overlap_test.cpp: tensor 2 and 4, overlap against plain) on 8 ranks;
#   4. throughput of a GPT-2 124M-like and a GPT-3 1.3B-like model on one GPU in bf16 with synthetic
#      data: tokens/s, TFLOP/s, MFU, first and last loss and grad norm, NaN or skipped steps, memory;
#   4c. where the 1.3B step's GPU time goes, op by op (GPT_CUDA_PROFILE=1, 4 iterations);
#   4d. an asynchronous checkpoint save of the 1.3B model: the device-to-host copy into the pinned
#       snapshot (the training stall), the commit, and the background write, from gpt-train's log line;
#   4e. FP8 hybrid against bf16: the 124M model for 50 steps on the learnable synthetic pattern, same
#       seed, each precision; the FP8 run's last loss must lie within 2% of bf16's;
#   5. key/value-cached generation from the 124M run's weights (tokens/s).
# A failing test binary runs once more with CUDA_LAUNCH_BLOCKING=1 and GPT_CUDA_SYNC_CHECKS=1 (every launch
# and library call waited for and checked) to name the faulting op; NCCL_DEBUG=WARN.
# The whole run fits in 8 minutes and prints each step's time; `run --quick` runs steps 1 and 4 only, in
# under 3 minutes, for a second try. The models are configs/gpt2-124m.yaml and configs/gpt2-1.3b.yaml as
# they are, except for what one GPU and a short run need: tensor parallelism off, a global batch of two
# microbatches, a few iterations, fresh weights every run, a metrics file per model.
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
#                               the GPU host's CPU is not this one), builds gpt-train, cuda_ops_test,
#                               layout_test and nccl_test, and writes build-gpu/carry/bundle.tar.xz
#                               (about 27 MB): the
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
#                                   timeout_s=540); "scripts/gpu-check.sh run --quick" for a second try
#                               Logs and the table are also written to $OUT when it is set.
#
# OpenMPI runs as a singleton (no mpirun, no orted: ess_singleton_isolated) with its plugins loaded from
# the bundle (mca_base_component_path) over shared memory only.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
MODE=${1:-run}
QUICK=no
[ "${2:-}" = --quick ] && QUICK=yes  # only the op tests and the throughput benchmark
BUILD=$ROOT/build-gpu
CARRY=$BUILD/carry
START=$(date +%s)
BUDGET=${GPT_CHECK_BUDGET:-470}  # seconds for the whole run, under the 8-minute limit
[ "$QUICK" = yes ] && BUDGET=${GPT_CHECK_BUDGET:-170}  # --quick: under 3 minutes
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
  say "building gpt-train cuda_ops_test nccl_test layout_test context_parallel_test tp_overlap_test"
  cmake --build "$BUILD" -j"${JOBS:-2}" --target gpt-train cuda_ops_test nccl_test layout_test context_parallel_test tp_overlap_test >"$LOG/build.log" 2>&1 ||
    { grep -E "error" -A3 "$LOG/build.log" | head -40; exit 1; }
  local stage=$BUILD/stage
  rm -rf "$stage" "$CARRY"
  mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-fallback" "$stage/openmpi" "$CARRY"
  strip -o "$stage/bin/gpt-train" "$BUILD/gpt-train"
  strip -o "$stage/bin/cuda_ops_test" "$BUILD/tests/cuda_ops_test"
  strip -o "$stage/bin/nccl_test" "$BUILD/tests/nccl_test"
  strip -o "$stage/bin/layout_test" "$BUILD/tests/layout_test"
  strip -o "$stage/bin/context_parallel_test" "$BUILD/tests/context_parallel_test"
  strip -o "$stage/bin/tp_overlap_test" "$BUILD/tests/tp_overlap_test"
  # OpenMPI's launcher and daemon, for step 3 on a machine without its own mpirun (best effort).
  cp -L "$(command -v orterun)" "$stage/bin/mpirun" 2>/dev/null && cp -L "$(command -v orted)" "$stage/bin/orted" 2>/dev/null
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
    LAYOUT_TEST=$BIN/bin/layout_test
    CONTEXT_TEST=$BIN/bin/context_parallel_test
    TP_OVERLAP_TEST=$BIN/bin/tp_overlap_test
    command -v mpirun >/dev/null || { [ -x "$BIN/bin/mpirun" ] && export PATH="$PATH:$BIN/bin"; }
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
    timeout $(($(left) - 300)) cmake --build "$BUILD" -j"$(nproc)" --target gpt-train cuda_ops_test nccl_test layout_test context_parallel_test tp_overlap_test \
      >"$LOG/build.log" 2>&1 || { grep -E "error" -A3 "$LOG/build.log" | head -40; exit 1; }
    GPT_TRAIN=$BUILD/gpt-train
    OPS_TEST=$BUILD/tests/cuda_ops_test
    NCCL_TEST=$BUILD/tests/nccl_test
    LAYOUT_TEST=$BUILD/tests/layout_test
    CONTEXT_TEST=$BUILD/tests/context_parallel_test
    TP_OVERLAP_TEST=$BUILD/tests/tp_overlap_test
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

# bench NAME CONFIG MICRO ITERS TIMEOUT SAVE: trains CONFIG on one GPU for ITERS iterations of two
# microbatches, from fresh weights every time (a new checkpoint directory, or none); SAVE=yes keeps the
# final weights (no optimizer state) in /tmp/gpt-bench-ckpt-NAME for the generation check.
RESULTS=()
bench() {
  local name=$1 config=$2 mb=$3 iters=$4 limit=$5 save=${6:-no}
  local L h s V
  read -r L h s V < <(model_dims "$config")
  local avail
  avail=$(left)
  if [ "$avail" -lt 60 ]; then
    RESULTS+=("$name|skipped: out of time||||||"); return
  fi
  [ "$limit" -gt "$((avail - 10))" ] && limit=$((avail - 10))
  local metrics=/tmp/gpt-bench-$name.jsonl ckpt=/tmp/gpt-bench-ckpt-$name
  rm -rf "$metrics" "$ckpt"
  local save_sets=(--set checkpoint.dir=)
  [ "$save" = yes ] && save_sets=(--set checkpoint.dir="$ckpt" --set checkpoint.save_optimizer=false)
  say "benchmark $name ($config: L=$L h=$h s=$s V=$V) micro=$mb x 2, $iters iterations (limit ${limit}s)"
  timeout "$limit" "$GPT_TRAIN" train --config "$config" --set backend=cuda --set precision.dtype=bf16 \
    --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.sequence_parallel=false \
    --set parallel.distributed_optimizer=false --set training.micro_batch_size="$mb" \
    --set training.global_batch_size=$((2 * mb)) --set training.train_iters="$iters" --set optimizer.warmup_iters=1 \
    --set data.train=[] --set data.synthetic=random --set eval.interval=0 --set checkpoint.save_interval=0 \
    "${save_sets[@]}" --set logging.interval=1 \
    --set logging.metrics_file="$metrics" >"$LOG/bench-$name.log" 2>&1
  local rc=$?
  tail -3 "$LOG/bench-$name.log"
  local n
  n=$(param_count "$L" "$h" "$s" "$V")
  # tokens/s: median over the iterations after the first two (cuBLAS heuristics, allocator warm-up).
  local row
  row=$(python3 - "$metrics" "$n" "$L" "$h" "$s" "$PEAK" "$rc" <<'EOF'
import json, math, statistics, sys
path, n, L, h, s, peak, rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
except OSError:
    rows = []
train = [r for r in rows if r.get("event", "train") == "train"]
tps = [r["tokens_per_s"] for r in train if "tokens_per_s" in r]
if not tps:
    print(f"{n/1e6:.0f}M|no iterations logged (exit {rc})|||||")
    sys.exit()
steady = tps[2:] if len(tps) > 3 else tps[-1:]
t = statistics.median(steady)
flops_per_token = 6 * n + 12 * L * h * s
def num(v):
    return f"{v:.4g}" if isinstance(v, (int, float)) and math.isfinite(v) else "NaN"
bad = [r["iteration"] for r in train if not (isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"]))]
skipped = max((r.get("skipped_iters", 0) or 0 for r in train), default=0)
flags = (f"NaN loss at {bad[:3]} " if bad else "") + (f"{skipped} skipped " if skipped else "")
peak_mem = max((r.get("mem_peak_bytes", 0) or 0 for r in train), default=0) / 2**30
print(f"{n/1e6:.0f}M|{t:,.0f}|{flops_per_token * t / 1e12:.1f}|{100 * flops_per_token * t / peak:.1f}%|"
      f"{num(train[0].get('loss'))} -> {num(train[-1].get('loss'))}|"
      f"{num(train[0].get('grad_norm'))} -> {num(train[-1].get('grad_norm'))}|{peak_mem:.1f} GiB|"
      f"{flags}{len(tps)} iters, exit {rc}")
EOF
)
  RESULTS+=("$name|$row")
}

# A gtest binary under a timeout; on failure it runs once more with CUDA_LAUNCH_BLOCKING=1, so an
# asynchronous fault is reported by the op that caused it, and prints that run's failures.
gtest_step() {  # NAME BINARY TIMEOUT [gtest args...]
  local name=$1 bin=$2 limit=$3
  shift 3
  timeout "$limit" "$bin" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]" "$LOG/$name.log" | head -40
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(left)" -gt 90 ]; then
    say "$name failed (exit $rc): once more with CUDA_LAUNCH_BLOCKING=1 GPT_CUDA_SYNC_CHECKS=1"
    CUDA_LAUNCH_BLOCKING=1 GPT_CUDA_SYNC_CHECKS=1 timeout 90 "$bin" "$@" >"$LOG/$name.blocking.log" 2>&1
    grep -E "^\[  FAILED +\]|Failure|error|CUDA|cuBLAS|cuDNN|NCCL" "$LOG/$name.blocking.log" | grep -v "^\[error\]" | head -20
  fi
  return "$rc"
}

# An MPI test binary on 8 ranks sharing the GPU (GPT_TEST_BACKEND=cuda: parallel.communicator mpi, the groups
# host-staged); needs an mpirun that can start here.
#   one_gpu_mpi_test STEP NAME BINARY TIMEOUT FILTER [EXTRA_LINES_REGEX]
one_gpu_mpi_test() {
  local step=$1 name=$2 bin=$3 limit=$4 filter=$5 extra=${6:-}
  if ! command -v mpirun >/dev/null || [ -z "$bin" ] || [ ! -x "$bin" ]; then
    say "$step. not run: no mpirun on this machine (or no $name binary)"
    return 2
  fi
  ( unset OMPI_MCA_ess_singleton_isolated
    GPT_TEST_BACKEND=cuda OMP_NUM_THREADS=1 timeout "$limit" mpirun --oversubscribe -np 8 -x GPT_TEST_BACKEND -x LD_LIBRARY_PATH \
      -x OMPI_MCA_mca_base_component_path -x OMP_NUM_THREADS "$bin" --gtest_filter="$filter" ) >"$LOG/$name.log" 2>&1
  local rc=$?
  sed 's/\x1b\[[0-9;]*m//g' "$LOG/$name.log" | grep -E "^\[ +(OK|FAILED) +\]|^\[  (PASSED|FAILED) +\]${extra:+|$extra}" |
    sort | uniq -c | head -40
  [ "$rc" -ne 0 ] && tail -5 "$LOG/$name.log"
  return "$rc"
}

# tests/parallel/pipeline/layout_test.cpp: fp32 and bf16, GPT and Llama shapes.
one_gpu_layouts() {
  one_gpu_mpi_test 3a layout_test "${LAYOUT_TEST:-}" 150 '*Layouts.*/fp32:*Layouts.*/bf16'
}

# tests/parallel/grid/context_parallel_test.cpp: the ring attention on the CUDA block ops over host-staged context
# groups; gradients, and the fp32 and bf16 training runs.
one_gpu_context() {
  one_gpu_mpi_test 3b context_parallel_test "${CONTEXT_TEST:-}" 120 '*Gradients*:*Training*fp32:*Training*bf16' \
    "worst gradient"
}

# tests/parallel/grid/tp_overlap_test.cpp: parallel.tp_comm_overlap against the plain tensor-parallel region
# at tensor 2 and 4 with sequence parallelism, on the GPU's GEMMs over host-staged groups.
one_gpu_tp_overlap() {
  one_gpu_mpi_test 3d tp_overlap_test "${TP_OVERLAP_TEST:-}" 90 '*Training*'
}

# 10 training steps of the tiny model in fp32 on the CPU and on the GPU: the losses must agree.
cuda_vs_cpu_training() {
  local sets=(--set training.train_iters=10 --set eval.interval=0 --set checkpoint.dir= --set logging.interval=1
              --set precision.dtype=fp32)
  local be
  for be in cpu cuda; do
    timeout 60 "$GPT_TRAIN" train --config "$ROOT/configs/tiny-cpu.yaml" "${sets[@]}" --set backend=$be \
      --set logging.metrics_file="/tmp/gpt-train-$be.jsonl" >"$LOG/train-$be.log" 2>&1 ||
      { tail -3 "$LOG/train-$be.log"; return 1; }
  done
  python3 - <<'EOF'
import json, math
def losses(be):
    return [r["loss"] for r in map(json.loads, open(f"/tmp/gpt-train-{be}.jsonl")) if r.get("event", "train") == "train"]
c, g = losses("cpu"), losses("cuda")
worst = max((abs(a - b) / abs(a) for a, b in zip(c, g)), default=math.inf) if len(c) == len(g) == 10 else math.inf
print(f"losses cpu {c[0]:.5f} -> {c[-1]:.5f}, cuda {g[0]:.5f} -> {g[-1]:.5f}; worst relative difference {worst:.2e} "
      f"(tolerance 1e-4)")
raise SystemExit(0 if worst <= 1e-4 else 1)
EOF
}

# The 1.3B model for 4 iterations under GPT_CUDA_PROFILE=1; prints the per-op table's first 25 ops.
op_profile() {
  GPT_CUDA_PROFILE=1 timeout 60 "$GPT_TRAIN" train --config "$ROOT/configs/gpt2-1.3b.yaml" --set backend=cuda \
    --set precision.dtype=bf16 --set parallel.tensor=1 --set parallel.pipeline=1 \
    --set parallel.sequence_parallel=false --set parallel.distributed_optimizer=false \
    --set training.micro_batch_size=8 --set training.global_batch_size=16 --set training.train_iters=4 \
    --set optimizer.warmup_iters=1 --set data.train=[] --set data.synthetic=random --set eval.interval=0 \
    --set checkpoint.save_interval=0 --set checkpoint.dir= --set logging.interval=1 \
    --set logging.metrics_file= >"$LOG/op-profile.log" 2>&1
  local rc=$?
  sed -n '/^GPU time by op/,/^total/p' "$LOG/op-profile.log" | head -28
  return "$rc"
}

# 4e. FP8 hybrid (precision.fp8 hybrid: e4m3 forward, e5m2 gradients, delayed scaling) against bf16 on the
# 124M model, 50 steps of the learnable synthetic pattern with the same seed; prints both loss curves'
# first and last values and the relative difference of the last losses (goal: within 2%).
fp8_vs_bf16() {
  local fp8
  for fp8 in off hybrid; do
    rm -f /tmp/gpt-fp8-$fp8.jsonl
    timeout 120 "$GPT_TRAIN" train --config "$ROOT/configs/gpt2-124m.yaml" --set backend=cuda \
      --set precision.dtype=bf16 --set precision.fp8=$fp8 --set parallel.tensor=1 --set parallel.pipeline=1 \
      --set parallel.sequence_parallel=false --set parallel.distributed_optimizer=false \
      --set training.micro_batch_size=4 --set training.global_batch_size=8 --set training.train_iters=50 \
      --set optimizer.warmup_iters=5 --set data.train=[] --set data.synthetic=pattern --set eval.interval=0 \
      --set checkpoint.save_interval=0 --set checkpoint.dir= --set logging.interval=1 \
      --set logging.metrics_file=/tmp/gpt-fp8-$fp8.jsonl >"$LOG/fp8-$fp8.log" 2>&1 ||
      { tail -3 "$LOG/fp8-$fp8.log"; FP8_ROW="fp8=$fp8 run failed (log $LOG/fp8-$fp8.log)"; return 1; }
  done
  FP8_ROW=$(python3 - <<'EOF'
import json, math
def losses(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return [r["loss"] for r in rows if r.get("event", "train") == "train" and "loss" in r]
b, f = losses("/tmp/gpt-fp8-off.jsonl"), losses("/tmp/gpt-fp8-hybrid.jsonl")
if not b or not f or not all(math.isfinite(x) for x in b + f):
    print("no finite losses logged")
else:
    rel = (f[-1] - b[-1]) / b[-1]
    print(f"bf16 {b[0]:.4f} -> {b[-1]:.4f}, fp8 hybrid {f[0]:.4f} -> {f[-1]:.4f} after {len(f)} steps: "
          f"{100 * rel:+.2f}% ({'within' if abs(rel) <= 0.02 else 'outside'} 2%)")
EOF
)
  echo "$FP8_ROW"
  case "$FP8_ROW" in *"within 2%"*) return 0 ;; *) return 1 ;; esac
}

# 4d. The 1.3B model for 5 iterations with an asynchronous save after iteration 4 (and the final one):
# the save's log line gives the blocking device-to-host copy into the pinned snapshot, the background
# write and the commit. Weights and fp32 masters only (checkpoint.save_optimizer false: 10.4 GB per
# checkpoint, keep_last 1), so two checkpoints fit the machine's disk.
checkpoint_stall() {
  local ckpt=/tmp/gpt-bench-ckpt-async
  rm -rf "$ckpt"
  timeout 150 "$GPT_TRAIN" train --config "$ROOT/configs/gpt2-1.3b.yaml" --set backend=cuda \
    --set precision.dtype=bf16 --set parallel.tensor=1 --set parallel.pipeline=1 \
    --set parallel.sequence_parallel=false --set parallel.distributed_optimizer=false \
    --set training.micro_batch_size=8 --set training.global_batch_size=16 --set training.train_iters=5 \
    --set optimizer.warmup_iters=1 --set data.train=[] --set data.synthetic=random --set eval.interval=0 \
    --set checkpoint.dir="$ckpt" --set checkpoint.save_interval=4 --set checkpoint.keep_last=1 \
    --set checkpoint.save_optimizer=false --set checkpoint.async_save=true --set logging.interval=1 \
    --set logging.metrics_file= >"$LOG/checkpoint-stall.log" 2>&1
  local rc=$?
  rm -rf "$ckpt"
  STALL=$(grep -m1 -oE "at iteration 4: [0-9]+ bytes \| blocking copy .*" "$LOG/checkpoint-stall.log" ||
          echo "no save logged (exit $rc)")
  echo "$STALL"
  return "$rc"
}

TIMINGS=()
timed() {  # NAME COMMAND...: runs one step, records its seconds and exit status
  local name=$1 t0
  t0=$(date +%s)
  shift
  say "$name"
  "$@"
  local rc=$?
  TIMINGS+=("$name|$(($(date +%s) - t0))s|exit $rc")
  return "$rc"
}

run_checks() {
  setup_binaries
  export NCCL_DEBUG=WARN
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  # 1. The CUDA ops against the CPU at real shapes (fp32, bf16, fp16), with each attention path's error.
  timed "1. cuda_ops_test" gtest_step cuda_ops_test "$OPS_TEST" 150
  local ops_rc=$?
  say "attention against the CPU, both CUDA paths (worst |gpu - cpu| / (|cpu| + rms))"
  grep -E "^\[error\] (lse|out|dqkv)" "$LOG/cuda_ops_test.log" | sed 's/^\[error\] //'
  grep -E "attention: not on cuDNN" "$LOG/cuda_ops_test.log" | head -2
  local train_rc=skipped nccl_rc=skipped layout_rc=skipped context_rc=skipped tp_overlap_rc=skipped
  if [ "$QUICK" = no ]; then
    # 2. Ten training steps on the GPU against the CPU.
    timed "2. 10-step training, CUDA against CPU (tiny model, fp32)" cuda_vs_cpu_training
    train_rc=$?
    # 3. The 8-rank layouts on the one GPU, groups host-staged over MPI; then NCCL on one rank.
    timed "3a. layout_test, 8 ranks on one GPU (fp32, bf16)" one_gpu_layouts
    layout_rc=$?
    timed "3b. context_parallel_test, 8 ranks on one GPU (context 2 and 4)" one_gpu_context
    context_rc=$?
    timed "3c. nccl_test (one rank)" gtest_step nccl_test "$NCCL_TEST" 60
    nccl_rc=$?
    timed "3d. tp_overlap_test, 8 ranks on one GPU (tensor 2 and 4 with the overlap against without)" one_gpu_tp_overlap
    tp_overlap_rc=$?
  fi
  # 4. Throughput and memory.
  #                     name      config                           micro iters timeout save
  timed "4a. gpt2-124m" bench gpt2-124m "$ROOT/configs/gpt2-124m.yaml" 16 12 110 yes
  timed "4b. gpt2-1.3b" bench gpt2-1.3b "$ROOT/configs/gpt2-1.3b.yaml" 8 8 220

  # 4c. Where the 1.3B step's GPU time goes: GPT_CUDA_PROFILE=1 (an event after each op on the compute
  # stream), 4 iterations, the table the backend prints at exit (top 25 ops).
  if [ "$QUICK" = no ] && [ "$(left)" -gt 90 ]; then
    timed "4c. per-op GPU time, gpt2-1.3b (GPT_CUDA_PROFILE=1, 4 iterations)" op_profile
  fi

  STALL="not run (--quick, or out of time)"
  if [ "$QUICK" = no ] && [ "$(left)" -gt 120 ]; then
    timed "4d. asynchronous checkpoint save, gpt2-1.3b (copy to pinned memory, write, commit)" checkpoint_stall
  fi

  FP8_ROW="not run (--quick, or out of time)"
  if [ "$QUICK" = no ] && [ "$(left)" -gt 270 ]; then  # two runs of at most 120 s, and step 5 after
    timed "4e. FP8 hybrid against bf16, gpt2-124m, 50 steps (last loss within 2%)" fp8_vs_bf16
  fi

  # 5. Generation from the 124M benchmark's weights: key/value-cached decoding on the GPU.
  local generated="not run (no checkpoint, --quick, or out of time)"
  if [ "$QUICK" = no ] && [ -d /tmp/gpt-bench-ckpt-gpt2-124m ] && [ "$(left)" -gt 60 ]; then
    timed "5. generate (gpt2-124m weights, 256 new tokens, greedy)" \
      timeout 60 "$GPT_TRAIN" generate --load /tmp/gpt-bench-ckpt-gpt2-124m --backend cuda --tokenizer bytes \
      --temperature 0 --max-new-tokens 256 >"$LOG/generate.log" 2>&1
    local gen_rc=$?
    generated=$(grep -oE '[0-9]+ one-token decoding steps in [0-9.]+ s: [0-9.]+ tokens/s' "$LOG/generate.log" ||
                echo "failed (exit $gen_rc)")
    tail -2 "$LOG/generate.log"
  fi

  {
    echo
    echo "GPU tests: cuda_ops_test exit $ops_rc, CUDA-vs-CPU training exit $train_rc, one-GPU layouts exit $layout_rc, one-GPU context parallelism exit $context_rc, nccl_test exit $nccl_rc, one-GPU tp overlap exit $tp_overlap_rc" \
         "(logs in $LOG)"
    echo "generate (gpt2-124m, bf16, cached decoding): $generated"
    echo "async checkpoint save (gpt2-1.3b, weights + fp32 masters): $STALL"
    echo "fp8 hybrid against bf16 (gpt2-124m, 50 steps): $FP8_ROW"
    echo "MFU = (6 N + 12 L h s) * tokens/s / $PEAK  (H100/H200 dense bf16 peak; one GPU, synthetic data)"
    printf "%-10s | %-7s | %-10s | %-7s | %-6s | %-17s | %-17s | %-8s | %s\n" model params tokens/s TFLOP/s MFU \
      "loss first->last" "gnorm first->last" "mem peak" notes
    local r
    for r in "${RESULTS[@]}"; do
      IFS='|' read -r name params tps tflops mfu loss gnorm mem notes <<<"$r"
      printf "%-10s | %-7s | %-10s | %-7s | %-6s | %-17s | %-17s | %-8s | %s\n" "$name" "$params" "$tps" "$tflops" \
        "$mfu" "$loss" "$gnorm" "$mem" "$notes"
    done
    echo
    echo "timings (budget ${BUDGET}s):"
    local t
    for t in "${TIMINGS[@]}"; do
      IFS='|' read -r name secs status <<<"$t"
      printf "  %-60s %6s  %s\n" "$name" "$secs" "$status"
    done
  } | tee "$LOG/gpu-check.txt"
  say "finished"
  [ "$ops_rc" -eq 0 ] && { [ "$QUICK" = yes ] || { [ "$train_rc" = 0 ] && [ "$nccl_rc" = 0 ]; }; }
}

case "$MODE" in
  pack) pack ;;
  run) run_checks ;;
  *) echo "usage: scripts/gpu-check.sh [pack | run [--quick]]"; exit 2 ;;
esac
