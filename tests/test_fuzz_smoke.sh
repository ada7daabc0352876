#!/usr/bin/env bash
# test_fuzz_smoke.sh — a short run of every libFuzzer target in tests/fuzz (ASan + UBSan) when clang is
# present: builds them in a separate build directory next to the binary (-DLILY_FUZZ=ON with clang),
# then runs each for LILY_FUZZ_SECONDS (default 15) on a copy of its seed corpus. A crash, leak, undefined
# behaviour or failed check fails the test, and the input that caused it is kept in that directory's
# crashes/ (reproduce: <target> <file>). Without clang (or libFuzzer) it says so and passes.
# usage: bash tests/test_fuzz_smoke.sh <path-to-lily> <tests/data>
set -u
LILY=$1
SRC="$(cd "$(dirname "$0")/.." && pwd)"
SECONDS_EACH=${LILY_FUZZ_SECONDS:-15}
CC_FUZZ=${LILY_FUZZ_CC:-clang}
if ! command -v "$CC_FUZZ" >/dev/null 2>&1; then
  echo "test_fuzz_smoke.sh: SKIPPED: no clang on PATH (the fuzz targets need clang's libFuzzer)"
  exit 0
fi
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
     "$CC_FUZZ" -x c -fsanitize=fuzzer,address,undefined -o /dev/null - >/dev/null 2>&1; then
  echo "test_fuzz_smoke.sh: SKIPPED: $CC_FUZZ cannot link -fsanitize=fuzzer (no libFuzzer runtime)"
  exit 0
fi
OUT="$(cd "$(dirname "$LILY")" && pwd)/fuzz"
mkdir -p "$OUT/crashes"
cmake -S "$SRC" -B "$OUT/build" -DLILY_FUZZ=ON -DLILY_CUDA=OFF -DCMAKE_C_COMPILER="$CC_FUZZ" \
      -DCMAKE_BUILD_TYPE=Debug >"$OUT/configure.log" 2>&1 || { cat "$OUT/configure.log"; exit 1; }
cmake --build "$OUT/build" --target fuzz_all -j "$(nproc 2>/dev/null || echo 2)" >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }

fails=0
for target in fuzz_request fuzz_config fuzz_tokenizer_json fuzz_tokenizer fuzz_chat_template fuzz_stop_strings \
              fuzz_output_parser fuzz_safetensors; do
  case $target in
    fuzz_safetensors) seeds="$SRC/tests/fuzz/corpus" ;;
    *) seeds="$SRC/tests/fuzz/corpus_${target#fuzz_}" ;;
  esac
  work="$OUT/corpus/$target"
  rm -rf "$work" && mkdir -p "$work" && cp "$seeds"/* "$work"/
  log="$OUT/$target.log"
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 "$OUT/build/tests/fuzz/$target" \
       -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$OUT/crashes/$target-" "$work" >"$log" 2>&1; then
    echo "ok   $target: $(grep -o 'Done [0-9]* runs' "$log")"
  else
    echo "FAIL $target (input kept in $OUT/crashes/):"
    grep -E -A12 'ERROR|check failed|runtime error|SUMMARY' "$log" | head -40
    fails=$((fails + 1))
  fi
done
[ "$fails" = 0 ]
