#!/usr/bin/env bash
# Our scheduler against upstream Karpenter's, case by case, alternating A B A B ... so both
# sides see the same machine load; prints a Markdown table (median and min-max per side, the
# load average around the runs, the ratio of medians) ready for BENCHMARKS.md.
#
#   bash hack/bench-compare.sh                       # every case, 5 rounds
#   ROUNDS=7 CASES="1000 5000 ignore" bash hack/bench-compare.sh
#
# Like with like: upstream's benchmark is run with -test.benchtime=1x, one Solve on a freshly
# built scheduler (setup excluded by b.ResetTimer), so it is compared with our *first* solve on
# a fresh scheduler; our mean over repeated solves is shown beside it, not used for the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${ROUNDS:-5}"
cases="${CASES:-1 100 1000 5000 20000 respect ignore}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/karpenter-exoscale/target}"

upstream="$(bash hack/bench-upstream.sh)"
cargo bench --bench scheduling --no-run >&2
ours="$(ls -t "$CARGO_TARGET_DIR"/release/deps/scheduling-* | grep -v '\.d$' | head -1)"

raw="$(mktemp)"
trap 'rm -f "$raw"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }

for c in $cases; do
  case "$c" in
    respect) bench='^BenchmarkRespectPreferences$'; only=respect; sizes=1 ;;
    ignore) bench='^BenchmarkIgnorePreferences$'; only=ignore; sizes=1 ;;
    *) bench="^BenchmarkScheduling$c\$"; only=diverse; sizes="$c" ;;
  esac
  for r in $(seq "$rounds"); do
    l="$(load)"
    up="$("$upstream" -test.run=XXX -test.bench="$bench" -test.benchtime=1x |
      awk '{for (i = 2; i <= NF; i++) if ($i == "pods/sec") print $(i-1)}')"
    [[ -n "$up" ]] || { echo "upstream produced no pods/sec for $c" >&2; exit 1; }
    echo "$c up $up $l" >>"$raw"
    l="$(load)"
    SCHED_BENCH_ONLY="$only" SCHED_BENCH_SIZES="$sizes" SCHED_BENCH_MIN_SECS=1 SCHED_BENCH_TSV=1 \
      "$ours" --bench | awk -v c="$c" -v l="$l" -F'\t' \
      '{printf "%s first %.1f %s\n%s mean %.1f %s\n", c, $2 / $4, l, c, $2 / $5, l}' >>"$raw"
    echo "case $c round $r/$rounds: upstream $up pods/s" >&2
  done
done

# median of a column of numbers (stdin)
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
range() { sort -g | awk 'NR == 1 {min = $1} {max = $1} END {printf "%s-%s", min, max}'; }
fmt() { awk '{x = $1; if (x >= 100) printf "%.0f", x; else if (x >= 10) printf "%.1f", x; else printf "%.2f", x}'; }

echo "| case | upstream pods/s (1 solve) | ours pods/s (first solve) | ratio of medians | ours pods/s (mean of repeats) | load avg |"
echo "|---|---:|---:|---:|---:|---:|"
for c in $cases; do
  col() { awk -v c="$c" -v k="$1" '$1 == c && $2 == k {print $3}' "$raw"; }
  up_med="$(col up | median)"
  first_med="$(col first | median)"
  label="$c"
  case "$c" in respect) label="preferences, Respect (4 000)" ;; ignore) label="preferences, Ignore (4 000)" ;; *) label="diverse $c" ;; esac
  printf '| %s | %s (%s) | %s (%s) | %sx | %s (%s) | %s |\n' "$label" \
    "$(echo "$up_med" | fmt)" "$(col up | range)" \
    "$(echo "$first_med" | fmt)" "$(col first | range)" \
    "$(awk -v a="$first_med" -v b="$up_med" 'BEGIN {printf "%.0f", a / b}')" \
    "$(col mean | median | fmt)" "$(col mean | range)" \
    "$(awk -v c="$c" '$1 == c {print $4}' "$raw" | range)"
done
echo
echo "$rounds interleaved rounds per case (upstream, then ours); $(nproc) CPUs; $(date -u +%Y-%m-%dT%H:%MZ)."
