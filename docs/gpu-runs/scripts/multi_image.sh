#!/usr/bin/env bash
# Issue 31 item 4 on a GPU (NEEDS A GPU; branch multi-image): frames of
# several images at 1080p, and the goal "colour + depth + segmentation
# delivered to torch as three tensors, every value checked, at least 95% of
# the frame rate of a colour-only ring of the same size".
#
# No Rust on the GPU machine: build here first and carry the results:
#   cargo build --release --examples -p cuda-interop-frames
#   cargo build --release -p cuda-interop-py            # the Python module
#   (optional) cargo test --release -p cuda-interop-frames --test multi_image --no-run
# then put in DEMO_DIR (default: .gpu-run/multi-image):
#   frame_server, frame_client, vulkan_client   (target/release/examples/)
#   cuda_interop.abi3.so                         (target/release/libcuda_interop_py.so, renamed)
#   gpu_consumer.py                              (python/examples/)
#   test-multi_image                             (optional: the test binary cargo listed)
# Run from the repository root:  bash .gpu-run/multi_image.sh
# PYTHON (default python3) must import torch. FRAMES (600), WIDTH (1920),
# HEIGHT (1080), SLOTS (3: the most a 3-part ring has; the colour-only ring
# gets the same). Logs go to $OUT (default /tmp).
#
# Steps, each bounded, one PASS or FAIL line each, a final RESULT line; exit
# 0 only if every step passed:
#   1. colour-only baseline: frame_server --image rgba8 (3 slots, 1080p),
#      torch consumer lossless, every value checked: frames/s.
#   2. --with-depth: frame_server --with-depth (colour RGBA8 + a D32_SFLOAT
#      depth attachment copied into R32_SFLOAT + R32_UINT labels, one
#      present_copy a frame), torch consumer lossless (frame.tensors(): three
#      tensors, every value of every part checked): frames/s.
#   3. the goal: (2) >= 0.95 x (1), both measured in this run, one after
#      the other on the same GPU.
#   4. the Rust CUDA receiver (frame_client, lossless, every texel of every
#      part checked through CudaReceiver::part) against --with-depth.
#   5. the Vulkan receiver (vulkan_client, PartsReader) against --with-depth,
#      with timelines (NVIDIA exports them; lavapipe CI has none).
#   6. (if carried) the multi_image test binary.
set -u
cd "$(dirname "$0")/.."
D=${DEMO_DIR:-.gpu-run/multi-image}
PYTHON=${PYTHON:-python3}
FRAMES=${FRAMES:-600}
WIDTH=${WIDTH:-1920}
HEIGHT=${HEIGHT:-1080}
SLOTS=${SLOTS:-3}
out=${OUT:-/tmp}
status=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; status=1; }
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export XDG_RUNTIME_DIR
XDG_RUNTIME_DIR=$(mktemp -d)
chmod 700 "$XDG_RUNTIME_DIR"
SERVER=
stop_server() {
  [ -n "$SERVER" ] || return 0
  kill "$SERVER" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
  SERVER=
}
trap 'stop_server; rm -rf "$XDG_RUNTIME_DIR"' EXIT

for b in frame_server frame_client vulkan_client; do
  [ -x "$D/$b" ] || { echo "FAIL: no $D/$b (see this script's header)"; echo "RESULT: FAIL"; exit 1; }
done
[ -f "$D/gpu_consumer.py" ] || { echo "FAIL: no $D/gpu_consumer.py"; echo "RESULT: FAIL"; exit 1; }
PYDIR=$XDG_RUNTIME_DIR/py
mkdir -p "$PYDIR"
cp "$D/cuda_interop.abi3.so" "$PYDIR/" 2>/dev/null || { echo "FAIL: no $D/cuda_interop.abi3.so"; echo "RESULT: FAIL"; exit 1; }
export PYTHONPATH=$PYDIR${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L
"$PYTHON" -c "import cuda_interop, torch; print('cuda_interop', cuda_interop.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))" \
  || { echo "FAIL: $PYTHON cannot import cuda_interop and torch"; echo "RESULT: FAIL"; exit 1; }

# start_server NAME LOG ARGS...: frame_server by name, once announced.
start_server() {
  local name=$1 log=$2
  shift 2
  "$D/frame_server" --name "$name" --width "$WIDTH" --height "$HEIGHT" --slots "$SLOTS" \
    --seconds 250 --hold-timeout 30 "$@" > "$log" 2>&1 &
  SERVER=$!
  for _ in $(seq 200); do grep -q "announced as \"$name\"" "$log" && return 0; sleep 0.05; done
  echo "frame_server did not announce $name:"; cat "$log"
  return 1
}
# fps LOG: frames/s from gpu_consumer's "N frames, B bad, X ms/frame (... after the first 50: Y ms/frame)".
fps() {
  local ms
  ms=$(sed -n 's/.*after the first 50: \([0-9.]*\) ms\/frame.*/\1/p' "$1" | tail -n 1)
  [ -n "$ms" ] || ms=$(sed -n 's/.* \([0-9.]*\) ms\/frame.*/\1/p' "$1" | tail -n 1)
  [ -n "$ms" ] && awk -v ms="$ms" 'BEGIN { printf "%.1f", 1000 / ms }'
}
torch_run() { # NAME LOG
  timeout 200 "$PYTHON" "$D/gpu_consumer.py" --name "$1" --lib torch --frames "$FRAMES" \
    --delivery lossless --timeout 20 --quiet > "$2" 2>&1
}

echo "=== 1. colour-only baseline: ${WIDTH}x${HEIGHT} RGBA8 image ring, $SLOTS slots, torch, lossless"
fps_color=
if start_server color "$out/multi-color-server.log" --image rgba8; then
  torch_run color "$out/multi-color-torch.log"; rc=$?
  stop_server
  cat "$out/multi-color-torch.log" | tail -n 3
  fps_color=$(fps "$out/multi-color-torch.log")
  if [ $rc -eq 0 ] && grep -q "$FRAMES frames, 0 bad" "$out/multi-color-torch.log"; then
    pass "colour-only: $FRAMES frames, 0 bad, $fps_color frames/s"
  else
    fail "colour-only torch consumer (status $rc; $out/multi-color-torch.log)"
  fi
  grep -E "frames/s|done:" "$out/multi-color-server.log" | tail -n 2
else
  fail "colour-only sender did not start"
fi

echo "=== 1b. colour-only through the same renderer and copies: --with-depth --color-part-only (one part), torch, lossless"
fps_color1=
if start_server color1 "$out/multi-color1-server.log" --with-depth --color-part-only; then
  torch_run color1 "$out/multi-color1-torch.log"; rc=$?
  stop_server
  cat "$out/multi-color1-torch.log" | tail -n 3
  fps_color1=$(fps "$out/multi-color1-torch.log")
  if [ $rc -eq 0 ] && grep -q "$FRAMES frames, 0 bad" "$out/multi-color1-torch.log"; then
    pass "colour part alone: $FRAMES frames, 0 bad, $fps_color1 frames/s"
  else
    fail "colour-part-only torch consumer (status $rc; $out/multi-color1-torch.log)"
  fi
else
  fail "colour-part-only sender did not start"
fi

echo "=== 2. --with-depth: colour + depth + segmentation, $SLOTS slots, torch (three tensors), lossless"
fps_depth=
if start_server depth "$out/multi-depth-server.log" --with-depth; then
  head -n 3 "$out/multi-depth-server.log"
  torch_run depth "$out/multi-depth-torch.log"; rc=$?
  stop_server
  cat "$out/multi-depth-torch.log" | tail -n 4
  fps_depth=$(fps "$out/multi-depth-torch.log")
  if [ $rc -eq 0 ] && grep -q "$FRAMES frames, 0 bad" "$out/multi-depth-torch.log" \
     && grep -q "every value of every part checked" "$out/multi-depth-torch.log"; then
    pass "with depth: $FRAMES frames, 0 bad (every value of colour, depth, segmentation), $fps_depth frames/s"
  else
    fail "with-depth torch consumer (status $rc; $out/multi-depth-torch.log)"
  fi
  grep -E "frames/s|done:" "$out/multi-depth-server.log" | tail -n 2
else
  fail "with-depth sender did not start"
fi

echo "=== 3. the goal: with depth >= 95% of colour-only through the same renderer and copies (1b); against the direct ring (1) too"
if [ -n "$fps_color" ] && [ -n "$fps_depth" ]; then
  direct=$(awk -v a="$fps_depth" -v b="$fps_color" 'BEGIN { printf "%.3f", a / b }')
  echo "against the direct colour ring (frame_server --image rgba8, written in place on the transfer queue): $fps_depth / $fps_color = $direct"
fi
if [ -n "$fps_color1" ] && [ -n "$fps_depth" ]; then
  ratio=$(awk -v a="$fps_depth" -v b="$fps_color1" 'BEGIN { printf "%.3f", a / b }')
  echo "GOAL: colour+depth+segmentation $fps_depth frames/s / colour part alone $fps_color1 frames/s = $ratio (goal >= 0.95)"
  if awk -v r="$ratio" 'BEGIN { exit !(r >= 0.95) }'; then pass "goal met ($ratio)"; else fail "goal missed ($ratio < 0.95)"; fi
else
  fail "goal not measured (a frame rate is missing)"
fi

echo "=== 4. Rust CUDA receiver (frame_client) of --with-depth, lossless, every texel of every part"
if start_server depth4 "$out/multi-client-server.log" --with-depth; then
  timeout 120 "$D/frame_client" --name depth4 --frames 300 --lossless --timeout 20 \
    > "$out/multi-frame_client.log" 2>&1; rc=$?
  stop_server
  tail -n 2 "$out/multi-frame_client.log"
  if [ $rc -eq 0 ] && grep -q "(300 checked, 0 bad)" "$out/multi-frame_client.log"; then
    pass "frame_client: 300 frames, every part checked, 0 bad"
  else
    fail "frame_client (status $rc; $out/multi-frame_client.log)"
  fi
else
  fail "sender for frame_client did not start"
fi

echo "=== 5. Vulkan receiver (vulkan_client, PartsReader) of --with-depth, with timelines"
if start_server depth5 "$out/multi-vulkan-server.log" --with-depth; then
  timeout 120 "$D/vulkan_client" --name depth5 --frames 200 --lossless --timeout 20 \
    > "$out/multi-vulkan_client.log" 2>&1; rc=$?
  stop_server
  tail -n 2 "$out/multi-vulkan_client.log"
  if [ $rc -eq 0 ] && grep -q "200 frames (200 checked, every texel of every part, 0 bad)" "$out/multi-vulkan_client.log"; then
    pass "vulkan_client: 200 frames, every texel of every part, 0 bad"
  else
    fail "vulkan_client (status $rc; $out/multi-vulkan_client.log)"
  fi
else
  fail "sender for vulkan_client did not start"
fi

if [ -x "$D/test-multi_image" ]; then
  echo "=== 6. the multi_image tests (processes of their own; validation layer off unless carried)"
  export CUDA_INTEROP_VALIDATION=${CUDA_INTEROP_VALIDATION:-off}
  if timeout 200 "$D/test-multi_image" --test-threads=1 > "$out/multi-tests.log" 2>&1; then
    pass "multi_image tests ($(grep 'test result' "$out/multi-tests.log" | tail -n 1))"
  else
    fail "multi_image tests ($out/multi-tests.log)"; grep -E "panicked|FAILED" "$out/multi-tests.log" | head
  fi
else
  echo "(no $D/test-multi_image carried: step 6 not run)"
fi

if [ $status -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
exit $status
