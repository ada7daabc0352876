#!/usr/bin/env bash
# cuda_run.sh — one device call: build lily with the CUDA backend for sm_90 on the GPU machine, run the
# GPU tests (kernels vs CPU twins, tiny-a fixtures in every mode) and the decode bench on the full-size
# synthetic model. Logs go to $OUT/logs.tgz. Usage (from the repo root on the GPU machine):
#   bash bench/cuda_run.sh [tests|bench|all] [extra bench args...]
# The GPU machine reaches no package registry: tools/gpu_env.sh unpacks the carried .deb/ packages.
set -u
what=${1:-all}; shift || true
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=/tmp/lily-logs; rm -rf "$LOG"; mkdir -p "$LOG" # every log, packed into $OUT/logs.tgz at the end
trap 'tar czf "$OUT/logs.tgz" -C "$LOG" .' EXIT
[ -d .deb ] || ln -s ../.deb .deb 2>/dev/null
source tools/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$LOG/gpu.txt"
t0=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DLILY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real > "$LOG/cmake.log" 2>&1 || { tail -30 "$LOG/cmake.log"; exit 1; }
gpu_tests=$(ls tests/cuda/test_*.c tests/cuda/test_*.cu 2>/dev/null | xargs -n1 basename | sed 's/\.cu\?$//; s/\.c$//')
cmake --build build-gpu -j16 --target lily bench_cuda_decode $gpu_tests > "$LOG/build.log" 2>&1 \
  || { grep -E "error|Error" "$LOG/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  for t in $gpu_tests; do # every GPU test; log <name>.log, FAIL lines and the last line shown
    timeout 300 ./build-gpu/tests/cuda/$t > "$LOG/$t.log" 2>&1; r=$?; echo "$t rc=$r"; [ $r = 0 ] || rc=1
    grep -E "^FAIL" "$LOG/$t.log" | head -20; tail -1 "$LOG/$t.log"
  done
  # the CLI path: lily eval --backend cuda on tiny-a case5 (300 tokens), both layouts, every mode
  python3 - <<'PY' > "$LOG/eval.log" 2>&1
import json, struct, numpy as np
f = open('tests/data/tiny-a/reference.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]
h = json.loads(f.read(n)); base = 8 + n
def get(k):
    m = h[k]; a, b = m['data_offsets']; f.seek(base + a)
    return np.frombuffer(f.read(b - a), dtype={'I32': np.int32, 'F32': np.float32}[m['dtype']]).reshape(m['shape'])
open('/tmp/case5.tok', 'w').write(' '.join(map(str, get('case5.tokens'))))
for lay in ('hf', 'mlx4'): get('case5.logits.' + lay).astype('<f4').tofile('/tmp/case5.%s.f32' % lay)
PY
  for layout in mlx4 hf; do
    for mode in "" "--prefill-chunk 7" "--decode-from 150"; do
      echo "== lily eval --backend cuda $layout $mode" >> "$LOG/eval.log"
      ./build-gpu/lily eval --backend cuda -m tests/data/tiny-a/$layout --tokens-file /tmp/case5.tok $mode \
        --reference /tmp/case5.$layout.f32 >> "$LOG/eval.log" 2>&1 || rc=1
    done
  done
  grep -iE "==|top-1|KL|error" "$LOG/eval.log" | head -30
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  timeout 400 ./build-gpu/bench_cuda_decode "$@" 2>&1 | tee "$LOG/bench.log" | grep -vE "^\|---" | tail -60
fi
exit $rc
