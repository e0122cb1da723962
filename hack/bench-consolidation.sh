#!/usr/bin/env bash
# The consolidation benchmark (benches/consolidation.rs) run ROUNDS times in a row, each case's
# time per run reported as median and min-max over the rounds, with the load average seen
# before each round; prints a Markdown table ready for BENCHMARKS.md.
#
#   bash hack/bench-consolidation.sh                 # 5 rounds, 100 and 1 000 nodes
#   ROUNDS=7 CONS_BENCH_SIZES=1000 bash hack/bench-consolidation.sh
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${ROUNDS:-5}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/karpenter-exoscale/target}"
export CONS_BENCH_MIN_SECS="${CONS_BENCH_MIN_SECS:-1}"
cargo bench --bench consolidation --no-run >&2
bench="$(ls -t "$CARGO_TARGET_DIR"/release/deps/consolidation-* | grep -v '\.d$' | head -1)"

raw="$(mktemp)"
trap 'rm -f "$raw"' EXIT
loads=()
for r in $(seq "$rounds"); do
  loads+=("$(cut -d' ' -f1 /proc/loadavg)")
  # Fixed-width columns (benches/consolidation.rs): case 30, nodes 6, pods 7, time 10 + "ms",
  # runs 6, then two spaces and the outcome.
  "$bench" --bench | awk 'NR > 1 {
      name = substr($0, 1, 30); sub(/ +$/, "", name)
      split(substr($0, 31, 36), f, " ")
      ms = f[3]; sub(/ms$/, "", ms)
      printf "%s\t%s\t%s\t%s\t%s\n", name, f[1], f[2], ms, substr($0, 68)
    }' >>"$raw"
  echo "round $r/$rounds done (load ${loads[-1]})" >&2
done

echo "| case | nodes | pods | median time/run | min-max | outcome |"
echo "|---|---:|---:|---:|---:|---|"
awk -F'\t' '!seen[$1 FS $2]++ {print $1 FS $2 FS $3 FS $5}' "$raw" | while IFS=$'\t' read -r name nodes pods outcome; do
  times="$(awk -F'\t' -v n="$name" -v s="$nodes" '$1 == n && $2 == s {print $4}' "$raw" | sort -g)"
  median="$(echo "$times" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')"
  range="$(echo "$times" | awk 'NR == 1 {min = $1} {max = $1} END {printf "%s-%s", min, max}')"
  printf '| %s | %s | %s | %s ms | %s ms | %s |\n' "$name" "$nodes" "$pods" "$median" "$range" "$outcome"
done
echo
echo "Rounds: $rounds, CONS_BENCH_MIN_SECS=$CONS_BENCH_MIN_SECS; load average before each round: ${loads[*]}."
