#!/bin/sh
# Runs every fuzz target for SECONDS each (default 300), one after another, from the seed
# corpus in fixtures/fuzz-corpus/<target>/ and the corpus grown so far in
# fuzz/corpus/<target>/, and prints each target's seconds, executions, executions per
# second, crashes and coverage, and the sum. Extra arguments go to libFuzzer (e.g.
# -max_len=65536).
#
#   fuzz/run-all.sh 600                  # ten minutes per target
#   JOBS=2 fuzz/run-all.sh 300           # two targets at a time
#   TARGETS="json_http queue_http" fuzz/run-all.sh 60
#   SANITIZER=none fuzz/run-all.sh 600   # no AddressSanitizer: a volume pass
#
# SANITIZER is cargo-fuzz's --sanitizer: address (the default), none, leak, memory or
# thread. The code under test is safe Rust and AddressSanitizer does not instrument the
# bundled SQLite C code, so `none` finds what address would short of unsafe code; each
# sanitizer builds in a target directory of its own (fuzz/target for
# address, fuzz/target/<sanitizer> for the others), so switching rebuilds nothing. Debug
# assertions and overflow checks are on either way (cargo-fuzz's default).
#
# Logs go to fuzz/logs/<target>.log; a crash is saved in fuzz/artifacts/<target>/ and the
# script exits non-zero when a target crashed. The toolchain may be stable:
# RUSTC_BOOTSTRAP=1 lets it take cargo-fuzz's nightly flags.
set -eu

cd "$(dirname "$0")"
SECONDS_EACH=${1:-300}
[ $# -gt 0 ] && shift
JOBS=${JOBS:-1}
SANITIZER=${SANITIZER:-address}
export RUSTC_BOOTSTRAP=1
# cargo-fuzz's options, for the build and each run.
if [ "$SANITIZER" = address ]; then
    OPTS="--sanitizer address"
else
    OPTS="--sanitizer $SANITIZER --target-dir target/$SANITIZER"
fi
TARGETS=${TARGETS:-$(cargo fuzz list)}

# shellcheck disable=SC2086
cargo fuzz build $OPTS >/dev/null
mkdir -p logs

run() {
    t=$1
    shift
    mkdir -p "corpus/$t"
    # libFuzzer exits non-zero on a crash; the log says so and the summary counts it.
    # shellcheck disable=SC2086
    cargo fuzz run $OPTS "$t" "corpus/$t" "../fixtures/fuzz-corpus/$t" -- \
        -max_total_time="$SECONDS_EACH" -print_final_stats=1 "$@" >"logs/$t.log" 2>&1 || true
}

running=0
for t in $TARGETS; do
    run "$t" "$@" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then
        wait
        running=0
    fi
done
wait

total=0
crashed=0
printf '%-16s %8s %14s %8s %8s %8s %s\n' target seconds executions exec/s crashes edges sanitizer
for t in $TARGETS; do
    log="logs/$t.log"
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    edges=$(sed -n 's/.* cov: \([0-9]*\) .*/\1/p' "$log" | tail -n 1)
    crashes=$(grep -c '^==[0-9]*== ERROR\|^SUMMARY: libFuzzer\|panicked at' "$log" || true)
    execs=${execs:-0}
    total=$((total + execs))
    [ "$crashes" -gt 0 ] && crashed=1
    printf '%-16s %8s %14s %8s %8s %8s %s\n' "$t" "$SECONDS_EACH" "$execs" "${rate:-?}" \
        "$crashes" "${edges:-?}" "$SANITIZER"
done
printf '%-16s %8s %14s\n' total "" "$total"
exit "$crashed"
