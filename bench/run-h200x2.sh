#!/usr/bin/env bash
# The two-GPU form of bench/run.sh (its old name): bench/run-h200x2.sh OUT [MAX] = bench/run.sh 2 OUT [MAX].
exec "$(dirname "$0")/run.sh" 2 "${1:-bench-out}" "${@:2}"
