#!/usr/bin/env bash
# bench.sh runs every benchmark (make bench) and ends with one table of
# each figure next to its same-run baseline and its target
# (scripts/benchtable; docs/performance.md explains the rows). The raw
# output is kept in $BENCH_OUT (default bin/bench.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
out=${BENCH_OUT:-bin/bench.txt}
mkdir -p "$(dirname "$out")"
: >"$out"
run() {
	echo "== go test $*" >&2
	"$GO" test -run '^$' "$@" 2>&1 | tee -a "$out"
}
start=$(date +%s)
# The machine's prices first, while nothing else runs (a few seconds).
run -bench 'Machine' -benchtime 1s ./e2e/
# The socket, the turn stream and the upload: 2 s per figure. The socket's
# and the turn stream's rows are ratios of figures that move by a quarter
# or more from one run to the next on this machine: three runs, each on a
# fresh stack; the table takes the median of each figure, and of the
# runs' own ratios.
run -bench 'Socket|TurnStream' -count 3 -benchtime 2s ./e2e/
run -bench 'Upload' -benchtime 2s ./e2e/
# Whole stacks started and stopped: three of each.
run -bench 'IdleFootprint|Startup' -benchtime 3x ./e2e/
run -bench . -benchtime 2s ./gateway/... ./services/config/... ./services/session/... ./services/durablebridge/...
# A Go guest call is milliseconds: a fixed number of calls.
run -bench 'EchoCall|FuelOverhead|MinimalCall' -benchtime 300x ./services/pluginsandbox/...
# One comparison of the two deadline mechanisms (a few seconds a run: at
# 300x it alone took more than ten minutes).
run -bench 'Interrupt' -benchtime 1x ./services/pluginsandbox/wasmhost/
echo >&2
echo "benchmarks took $(( $(date +%s) - start )) s; load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$GO" run ./scripts/benchtable <"$out"
