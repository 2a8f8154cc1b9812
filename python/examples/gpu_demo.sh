#!/usr/bin/env bash
# The GPU demo of the frame ring (NEEDS A GPU): one command, bounded.
#
#   DEMO_DIR=/path/with/binaries bash gpu_demo.sh
#
# DEMO_DIR (default: this script's folder) holds frame_server, frame_client,
# gpu_consumer.py and either cuda_interop.abi3.so or a cuda_interop-*.whl
# (`cargo xtask wheel` makes that folder: target/gpu-demo). PYTHON (default
# python3) has torch and cupy. FRAMES (300), WIDTH (1920), HEIGHT (1080),
# ROW_PITCH (8192: padded rows, so the strided layout is exercised), SLOTS (4).
#
# Steps, each under `timeout`:
#   1. frame_server in the background; its fd count and free CUDA memory
#      before any consumer.
#   2. torch consumer: FRAMES frames checked on the GPU, ms/frame.
#   3. CuPy consumer (__cuda_array_interface__): the same.
#   4. Rust consumer (frame_client): the baseline.
#   5. A torch consumer killed with SIGKILL mid-stream while frame_client is
#      being served: frame_client must still get every frame right.
#   6. After every consumer left: the producer's fds and free CUDA memory
#      against step 1.
# Exit status 0 only if every step passed.
set -u
DEMO_DIR=${DEMO_DIR:-$(cd "$(dirname "$0")" && pwd)}
PYTHON=${PYTHON:-python3}
FRAMES=${FRAMES:-300}
WIDTH=${WIDTH:-1920}
HEIGHT=${HEIGHT:-1080}
ROW_PITCH=${ROW_PITCH:-8192}
SLOTS=${SLOTS:-4}
WORK=$(mktemp -d)
SOCK=$WORK/frames.sock
LOG=$WORK/server.log
FAILED=0
SERVER=
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null
  sleep 0.5
  [ -n "$SERVER" ] && kill -9 "$SERVER" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

step() { echo; echo "=== $*"; }
result() { # name status
  if [ "$2" -eq 0 ]; then echo "PASS: $1"; else echo "FAIL: $1 (status $2)"; FAILED=1; fi
}

[ -f "$DEMO_DIR/BUILD" ] && { echo "=== demo folder built from:"; cat "$DEMO_DIR/BUILD"; }

# The Python module: the .so as is, or unpacked from the wheel.
PYDIR=$WORK/py
mkdir -p "$PYDIR"
if [ -f "$DEMO_DIR/cuda_interop.abi3.so" ]; then
  cp "$DEMO_DIR/cuda_interop.abi3.so" "$PYDIR/"
else
  WHEEL=$(ls "$DEMO_DIR"/cuda_interop-*.whl 2>/dev/null | head -n1)
  [ -n "$WHEEL" ] || { echo "no cuda_interop.abi3.so or wheel in $DEMO_DIR"; exit 2; }
  # As a user would install it on a machine without network.
  "$PYTHON" -m pip install -q --no-index --no-deps --target "$PYDIR" "$WHEEL" \
    || "$PYTHON" -m zipfile -e "$WHEEL" "$PYDIR" || exit 2
fi
export PYTHONPATH=$PYDIR${PYTHONPATH:+:$PYTHONPATH}
"$PYTHON" -c "import cuda_interop; print('cuda_interop', cuda_interop.__version__, 'from', cuda_interop.__file__)" || exit 2

step "1. frame_server ${WIDTH}x${HEIGHT} RGBA8, row pitch $ROW_PITCH, $SLOTS slots"
"$DEMO_DIR/frame_server" --socket "$SOCK" --width "$WIDTH" --height "$HEIGHT" \
  --row-pitch "$ROW_PITCH" --slots "$SLOTS" --seconds 280 --hold-timeout 30 >"$LOG" 2>&1 &
SERVER=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { echo "frame_server did not start:"; cat "$LOG"; exit 1; }
sleep 0.5
cat "$LOG"
FDS_BEFORE=$(ls /proc/$SERVER/fd | wc -l)
echo "producer fds before consumers (from /proc): $FDS_BEFORE"

step "2. torch consumer, $FRAMES frames"
timeout 120 "$PYTHON" "$DEMO_DIR/gpu_consumer.py" "$SOCK" --lib torch --frames "$FRAMES"
result "torch consumer" $?

# The first consumer makes the producer open what it keeps for good (the
# driver's lazily opened fds): the baseline for "back at baseline" is taken
# after it, and the count before any consumer is printed too.
for _ in $(seq 50); do tail -n1 "$LOG" | grep -q "consumers=0" && break; sleep 0.1; done
FDS_WARM=$(ls /proc/$SERVER/fd | wc -l)
echo "producer fds after the first consumer left (from /proc): $FDS_WARM"

step "3. CuPy consumer (__cuda_array_interface__), $FRAMES frames"
timeout 120 "$PYTHON" "$DEMO_DIR/gpu_consumer.py" "$SOCK" --lib cupy --frames "$FRAMES"
result "cupy consumer" $?

step "4. Rust consumer (frame_client), $FRAMES frames"
timeout 120 "$DEMO_DIR/frame_client" --socket "$SOCK" --frames "$FRAMES"
result "rust consumer" $?

step "5. a consumer killed mid-stream (SIGKILL) while another is served"
# Not under `timeout`: $! must be the consumer itself (its own bound: next()
# times out 10 s after the producer stops sending).
"$PYTHON" "$DEMO_DIR/gpu_consumer.py" "$SOCK" --lib torch --frames 1000000 --quiet &
VICTIM=$!
sleep 4
timeout 120 "$DEMO_DIR/frame_client" --socket "$SOCK" --frames $((FRAMES * 3)) &
SURVIVOR=$!
sleep 1
kill -9 "$VICTIM"
wait "$VICTIM" 2>/dev/null
echo "killed the torch consumer (pid $VICTIM)"
wait "$SURVIVOR"
result "frame_client served while another consumer was killed" $?
kill -0 "$SERVER" 2>/dev/null
result "frame_server still running" $?

step "6. producer after every consumer left"
sleep 2
grep -E "connected|left|stopped" "$LOG"
FDS_AFTER=$(ls /proc/$SERVER/fd | wc -l)
echo "producer fds (from /proc): before any consumer $FDS_BEFORE, after the first $FDS_WARM, after all $FDS_AFTER"
[ "$FDS_AFTER" -eq "$FDS_WARM" ]
result "producer fds back at baseline (after the first consumer)" $?
# cuMemGetInfo is device-wide: wait (bounded) until the consumers' processes
# and their CUDA contexts are gone, then let a one-frame probe consumer
# connect; the producer reports free memory as each consumer connects.
for _ in $(seq 20); do
  OTHERS=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -vcx "$SERVER")
  [ "${OTHERS:-0}" -eq 0 ] && break
  sleep 0.5
done
echo "other CUDA processes left: ${OTHERS:-unknown}"
timeout 60 "$DEMO_DIR/frame_client" --socket "$SOCK" --frames 1 >/dev/null
sleep 0.5
LAST=$(grep -E "(consumer|receiver) [0-9]+ (\(pid [0-9]+\) )?connected" "$LOG" | tail -n1)
FREE_NOW=$(echo "$LAST" | sed -n 's/.*consumers=1 fds=[0-9]* cuda_free_mib=\([0-9]*\).*/\1/p')
FREE_BEFORE=$(echo "$LAST" | sed -n 's/.*before any consumer: fds=[0-9]* cuda_free_mib=\([0-9]*\)).*/\1/p')
if [ -n "$FREE_NOW" ] && [ -n "$FREE_BEFORE" ]; then
  echo "cuMemGetInfo free MiB: before consumers $FREE_BEFORE, after they left (reported as a probe connected) $FREE_NOW"
  DIFF=$((FREE_BEFORE - FREE_NOW)); DIFF=${DIFF#-}
  [ "$DIFF" -le 64 ]
  result "free CUDA memory back at baseline (within 64 MiB)" $?
else
  echo "no cuMemGetInfo report in the producer's log (last: $LAST)"
  FAILED=1
fi

kill "$SERVER" 2>/dev/null
wait "$SERVER" 2>/dev/null
SERVER=
echo
if [ "$FAILED" -eq 0 ]; then echo "GPU DEMO: ALL PASSED"; else echo "GPU DEMO: FAILURES (see above)"; fi
exit "$FAILED"
