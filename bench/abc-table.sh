#!/usr/bin/env bash
# The table of an A B C A B C run (bench/ll-check-ab.sh, bench/check-across-ab.sh): per case,
# time (us) per size for A1 B1 C1 A2 B2 C2 (column 6 of mcast-bench's table) and the wrong
# elements summed. A and B are the two builds with the check on, C is B with the check off.
#   bench/abc-table.sh OUT CASE...   (OUT holds A1_CASE.txt ... C2_CASE.txt)
set -uo pipefail
out="$1"
shift
for c in "$@"; do
  echo "== $c: bytes | A1 | B1 | C1 | A2 | B2 | C2 (us; A, B check on, C = B check off; #wrong summed)"
  tmp="$(mktemp -d)"
  awk '/^ +[0-9]/{print $1}' "$out/A1_$c.txt" >"$tmp/0"
  for f in A1 B1 C1 A2 B2 C2; do awk '/^ +[0-9]/{print $6}' "$out/${f}_$c.txt" >"$tmp/$f"; done
  paste "$tmp/0" "$tmp/A1" "$tmp/B1" "$tmp/C1" "$tmp/A2" "$tmp/B2" "$tmp/C2"
  rm -rf "$tmp"
  cat "$out"/[ABC][12]_$c.txt | awk '/^# wrong elements/{w += $4} END {print "wrong:", w + 0}'
done
