# Shared by the end-to-end shell tests of the gpt-train binary (sourced, with GPT_TRAIN and SRC_DIR as
# the script's arguments): BIN, SRC, CFG (configs/tiny-cpu.yaml), a temporary TMP removed on exit, MPI
# (mpirun without binding, oversubscribed), `fail`, expect_error, expect_exit and expect_help.
set -u
BIN=$1
SRC=$2
CFG=$SRC/configs/tiny-cpu.yaml
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MPI=(mpirun --oversubscribe --bind-to none)
fail=0

# expect_error "<extended regex>" command...: the command must exit non-zero within 60 s, not by a
# signal, with the pattern somewhere in its output.
expect_error() {
  local pattern=$1 out rc
  shift
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $rc -ge 128 ] || ! grep -qE -e "$pattern" <<<"$out"; then
    echo "FAIL (rc=$rc): $*"
    echo "  expected /$pattern/, got:"
    sed 's/^/    /' <<<"$out" | tail -5
    fail=1
  else
    echo "ok: $pattern"
  fi
}

# expect_exit CODE "<extended regex>" command...: the command must exit with CODE within 60 s, with the
# pattern somewhere in its output.
expect_exit() {
  local code=$1 pattern=$2 out rc
  shift 2
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  if [ $rc -ne "$code" ] || ! grep -qE -e "$pattern" <<<"$out"; then
    echo "FAIL (rc=$rc, expected $code): $*"
    echo "  expected /$pattern/, got:"
    sed 's/^/    /' <<<"$out" | tail -5
    fail=1
  else
    echo "ok ($code): $pattern"
  fi
}

# expect_help "<extended regex>" args...: `gpt-train args...` must exit 0 with the pattern in its stdout.
expect_help() {
  local pattern=$1 out rc
  shift
  out=$(timeout 60 "$BIN" "$@" 2>/dev/null)
  rc=$?
  if [ $rc -ne 0 ] || ! grep -qE -e "$pattern" <<<"$out"; then
    echo "FAIL (rc=$rc): gpt-train $*"
    echo "  expected /$pattern/ on stdout, got:"
    sed 's/^/    /' <<<"$out" | head -8
    fail=1
  else
    echo "ok: gpt-train $*: $pattern"
  fi
}
