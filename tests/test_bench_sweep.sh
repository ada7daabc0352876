#!/usr/bin/env bash
# test_bench_sweep.sh — `lily bench` on the CPU (tiny-chat model):
#   - a default sweep stops before a row estimated over --max-seconds and says so (here 1 s, so it stops
#     long before the model's 8192 positions);
#   - md rows are printed as they finish, and Ctrl-C (SIGINT) after the first row prints the table and
#     writes the plot of the rows so far, exiting 130;
#   - the plot's dashed line is labelled as the hardware ceiling (SVG output, to read the legend);
#   - a plot of prefill rows only or decode rows only is one panel (an empty one failed gnuplot), and a
#     quote in the --plot path is written as given;
#   - a panel of one length: no gnuplot warning on stderr, and the dashed ceiling drawn, not only its legend.
# usage: bash test_bench_sweep.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
M="$DATA/tiny-chat"
if ! command -v gnuplot >/dev/null 2>&1; then
    echo "SKIP test_bench_sweep: no gnuplot (make deps installs gnuplot-nox)"
    finish
    exit $?
fi

"$LILY" bench -m "$M" --max-seconds 1 -r 1 -n 4 --threads 1 --no-warmup > "$TMP/sweep.md" 2> "$TMP/sweep.err"
rows=$(grep -c '^| pp' "$TMP/sweep.md" || true)
expect "md names the precision, as csv and json do (fast by default)" grep -qx -- '- precision: fast' "$TMP/sweep.md"
"$LILY" bench -m "$M" -p 16 -n 2 -r 1 --threads 1 --no-warmup --precision exact > "$TMP/exact.md" 2>/dev/null
expect "md names --precision exact" grep -qx -- '- precision: exact' "$TMP/exact.md"
expect "the default prefill sweep stops itself (says so; $rows rows, fewer than the 6 up to 8192)" \
    bash -c "grep -q 'the default pp sweep stops at' '$TMP/sweep.err' && [ $rows -ge 1 ] && [ $rows -lt 6 ]"

"$LILY" bench -m "$M" -p 64,128,256,512,1024,2048,4096,8192 -n 0 -r 20 --threads 1 --no-warmup \
    --plot "$TMP/plot.svg" > "$TMP/int.md" 2> "$TMP/int.err" &
pid=$!
for _ in $(seq 3000); do # up to 300 s: sanitizer builds measure the hardware slowly
    grep -q '^| pp64 ' "$TMP/int.md" 2>/dev/null && break
    sleep 0.1
done
expect "the first row is printed while the sweep runs" grep -q '^| pp64 ' "$TMP/int.md"
kill -INT $pid
set +e
wait $pid
rc=$?
set -e
expect "Ctrl-C: exit status 130" [ "$rc" = 130 ]
expect "Ctrl-C: says it was interrupted" grep -q 'interrupted (Ctrl-C)' "$TMP/int.err"
expect "Ctrl-C: the table is closed with its notes" grep -q '^cost/token:' "$TMP/int.md"
expect "Ctrl-C: the longest lengths were not measured" bash -c "! grep -q '^| pp8192 ' '$TMP/int.md'"
expect "Ctrl-C: the plot of the rows so far is written" [ -s "$TMP/plot.svg" ]
expect "the plot's dashed line is labelled as the hardware ceiling" grep -q 'hardware ceiling (measured matmul rate)' "$TMP/plot.svg"

# a plot of one kind of row only (-n 0: prefill; -p none: decode) is one panel, and gnuplot succeeds (an
# empty panel failed it: "all points y value undefined"); a quote in the path is written as given
set +e
"$LILY" bench -m "$M" -p 16 -n 0 -r 1 --threads 1 --no-warmup --plot "$TMP/it's.svg" >/dev/null 2>"$TMP/p1.err"; rc1=$?
"$LILY" bench -m "$M" -p none -d 16 -n 2 -r 1 --threads 1 --no-warmup --plot "$TMP/dec.png" >/dev/null 2>"$TMP/p2.err"; rc2=$?
set -e
expect "--plot with prefill rows only: exit 0, one panel, at the quoted path" bash -c "[ $rc1 = 0 ] &&
    grep -q 'wrote $TMP/it' '$TMP/p1.err' && grep -q 'matmul rate' \"$TMP/it's.svg\" && ! grep -q 'memory bandwidth' \"$TMP/it's.svg\""
expect "--plot with decode rows only: exit 0, a PNG" bash -c "[ $rc2 = 0 ] && ! grep -q failed '$TMP/p2.err' &&
    [ \"\$(head -c 4 '$TMP/dec.png' | tail -c 3)\" = PNG ]"
# one length per panel (both plots above): no gnuplot warning reaches the terminal (it printed "Warning: empty x
# range [16:16], adjusting to [15.84:16.16]"), and the dashed ceiling is drawn, not only its legend entry (a line
# through one point drew nothing): in the SVG, the ceiling's dashed path has a segment after the legend's sample
expect "--plot with one length: no gnuplot warning on stderr (prefill, decode)" \
    bash -c "! grep -qi 'warning' '$TMP/p1.err' && ! grep -qi 'warning' '$TMP/p2.err'"
ceiling_path() { # the dashed path of the plot titled "hardware ceiling ..." in gnuplot's SVG
    awk '/<title>hardware ceiling/ { on = 1 } on && /stroke-dasharray/ { print; exit }' "$1"
}
DRAWN="d='M[0-9.]+,[0-9.]+ L[0-9.]+,[0-9.]+ M[0-9.]+,[0-9.]+ L[0-9.]+,[0-9.]+" # the legend's sample, then a line
expect "--plot with one length: the dashed ceiling is drawn across the panel, not only in the legend" \
    grep -Eq "$DRAWN" <(ceiling_path "$TMP/it's.svg")
"$LILY" bench -m "$M" -p 16,32 -n 0 -r 1 --threads 1 --no-warmup --plot "$TMP/two.svg" >/dev/null 2>"$TMP/p3.err"
expect "--plot with two lengths: the ceiling drawn through the rows, no warning" \
    bash -c '! grep -qi warning "$1" && grep -Eq "$2" <<<"$3"' _ "$TMP/p3.err" "$DRAWN" "$(ceiling_path "$TMP/two.svg")"
finish
