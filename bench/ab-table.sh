#!/usr/bin/env bash
# The table of an A B A B run (bench/latency-ab.sh, bench/staged-ab.sh): per case, time (us) per
# size for A1 B1 A2 B2 (column 6 of mcast-bench's table) and the wrong elements summed.
#   bench/ab-table.sh OUT CASE...   (OUT holds A1_CASE.txt, B1_CASE.txt, A2_CASE.txt, B2_CASE.txt)
set -uo pipefail
out="$1"
shift
for c in "$@"; do
  echo "== $c: bytes | A1 | B1 | A2 | B2 (us; #wrong summed)"
  paste <(awk '/^ +[0-9]/{print $1}' "$out/A1_$c.txt") \
    <(awk '/^ +[0-9]/{print $6}' "$out/A1_$c.txt") <(awk '/^ +[0-9]/{print $6}' "$out/B1_$c.txt") \
    <(awk '/^ +[0-9]/{print $6}' "$out/A2_$c.txt") <(awk '/^ +[0-9]/{print $6}' "$out/B2_$c.txt")
  cat "$out"/[AB][12]_$c.txt | awk '/^# wrong elements/{w += $4} END {print "wrong:", w + 0}'
done
