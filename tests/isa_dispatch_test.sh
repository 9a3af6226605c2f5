#!/usr/bin/env bash
# One binary on every x86-64 instruction-set level: the same 20-step training run (configs/tiny-cpu.yaml,
# one rank) with oneDNN free to pick its best kernels and with oneDNN capped at AVX2 and at AVX512_CORE
# (ONEDNN_MAX_CPU_ISA) gives the same per-step losses: fp32 within 1e-5 relative (only the summation order
# of the products changes), bf16 within the tolerance bf16 training is held to against fp32
# (tests/precision_test.cpp: 5% + 0.02). Levels the CPU lacks fall back to what it has, which still
# exercises the cap. Capped at AVX2, bf16 runs must warn that fp32 is faster there. Usage:
# isa_dispatch_test.sh GPT_TRAIN SRC_DIR
source "$(dirname "$0")/cli_test_lib.sh"

run() {  # run <dtype> <isa or "">: writes $TMP/<dtype>-<isa>.jsonl
  local dtype=$1 isa=$2 out=$TMP/$1-${2:-best}.jsonl
  if ! env ${isa:+ONEDNN_MAX_CPU_ISA=$isa} ONEDNN_VERBOSE=0 timeout 120 "$BIN" --config "$CFG" \
      --set precision.dtype="$dtype" --set training.train_iters=20 --set logging.interval=1 \
      --set eval.interval=0 --set logging.metrics_file="$out" >"$TMP/$dtype-${isa:-best}.log" 2>&1; then
    echo "FAIL: $dtype with ONEDNN_MAX_CPU_ISA=${isa:-unset}"; tail -5 "$TMP/$dtype-${isa:-best}.log"; fail=1
  fi
}

for dtype in fp32 bf16; do
  for isa in "" AVX2 AVX512_CORE; do run "$dtype" "$isa"; done
done
[ $fail -eq 0 ] || exit 1
# Capped at AVX2 (no bf16 dot products on any CPU) a bf16 run says at start-up that fp32 is faster here,
# and names the instruction set; fp32 runs carry no such warning.
if grep -q "precision.dtype=bf16: this CPU has no bf16 dot-product instructions (oneDNN runs avx2)" \
     "$TMP/bf16-AVX2.log" && ! grep -q "bf16 dot-product" "$TMP/fp32-AVX2.log"; then
  echo "ok: bf16 capped at AVX2 warns that fp32 is faster here"
else
  echo "FAIL: no bf16 warning when capped at AVX2 (or one in an fp32 run)"; grep -i warn "$TMP/bf16-AVX2.log"; fail=1
fi

/usr/bin/python3 - "$TMP" <<'PY' || fail=1
import json, sys
tmp = sys.argv[1]
def losses(name):
    return [r["loss"] for r in map(json.loads, open(f"{tmp}/{name}.jsonl")) if "split" not in r]
bad = 0
for dtype, rel, abs_ in (("fp32", 1e-5, 0.0), ("bf16", 0.05, 0.02)):
    best = losses(f"{dtype}-best")
    assert len(best) == 20, best
    for isa in ("AVX2", "AVX512_CORE"):
        other = losses(f"{dtype}-{isa}")
        worst = max(abs(a - b) / abs(a) for a, b in zip(best, other))
        ok = len(other) == 20 and all(abs(a - b) <= rel * abs(a) + abs_ for a, b in zip(best, other))
        print(f"{'ok' if ok else 'FAIL'}: {dtype} capped at {isa}: worst relative loss difference {worst:.2e}")
        bad += not ok
sys.exit(1 if bad else 0)
PY
exit $fail
