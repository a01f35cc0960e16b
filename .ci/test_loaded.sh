#!/usr/bin/env bash
# The suite from a fresh clone while one core is kept busy (make test-loaded):
# RUNS times in a row (default 3), each in a new clone of HEAD with its own
# environment, stopping at the first red run. A busy core is what a shared
# or noisy machine gives a test: the suite must pass there too (only its
# time may grow). Prints, per run, the exit status and the times of the
# install and of both pytest parts; the logs stay in $LOADED_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
LOADED_DIR=${LOADED_DIR:-$(mktemp -d /tmp/commprof-loaded.XXXXXX)}
src=$(pwd)
rev=$(git rev-parse --short HEAD)
echo "test-loaded: $RUNS fresh clones of $rev, one core busy; logs in $LOADED_DIR"
python3 -c 'while True: pass' &
busy=$!
trap 'kill $busy 2>/dev/null' EXIT
for k in $(seq 1 "$RUNS"); do
    dir="$LOADED_DIR/run$k"
    git clone -q "$src" "$dir"
    start=$(date +%s)
    (cd "$dir" && CI=true make test) > "$LOADED_DIR/run$k.log" 2>&1
    rc=$?
    end=$(date +%s)
    # pytest's closing lines of both parts ("N passed ... in S s")
    parts=$(grep -E '^=+ .*(passed|failed|error).* in [0-9.]+s' "$LOADED_DIR/run$k.log" | sed -E 's/^=+ //; s/ =+$//' \
            | paste -sd ';' -)
    echo "test-loaded: run $k of $RUNS at $rev: exit $rc, $((end - start)) s in all (install included); pytest: $parts"
    rm -rf "$dir/.venv"
    [ "$rc" = 0 ] || exit "$rc"
done
echo "test-loaded: $RUNS of $RUNS green"
