#!/usr/bin/env bash
# Issue 33 item 4: the OpenGL receiver's GPU-side wait on NVIDIA's EGL
# (branch gl-wait). No Rust on the GPU machine: build here first, with the
# feature the GL tests on NVIDIA use (run 36):
#
#   cargo test --release -p cuda-interop-gl \
#       --features cuda-interop-testkit/device-local --no-run
#
# and copy the two binaries it lists:
#   .../release/deps/gl_receiver-HASH      -> .gpu-run/test-gl_receiver
#   .../release/deps/cuda_interop_gl-HASH  -> .gpu-run/test-gl_unit
# Carry .gl/ (Debian's libEGL/glvnd packages, from cargo xtask gpu-bundle)
# as run 36 did. Then, from the repository root on the GPU machine:
#
#   bash .gpu-run/gl_wait.sh [GL_RECEIVER_BINARY [UNIT_BINARY]]
#
# Prints one PASS or FAIL line per check and a final RESULT line; exit 0
# only if every check passed. Logs go to $OUT (default /tmp).
set -u
cd "$(dirname "$0")/.."
rx=${1:-.gpu-run/test-gl_receiver}
unit=${2:-.gpu-run/test-gl_unit}
out=${OUT:-/tmp}
status=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; status=1; }

for b in "$rx" "$unit"; do
  [ -x "$b" ] || { echo "FAIL: no test binary $b (see this script's header)"; echo "RESULT: FAIL"; exit 1; }
done
if [ -d .gl ]; then for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export XDG_RUNTIME_DIR=/tmp/gl-wait-xdg; mkdir -p -m 700 "$XDG_RUNTIME_DIR"
# The validation layer is not carried (no bundle), as in run 36.
export CUDA_INTEROP_VALIDATION=${CUDA_INTEROP_VALIDATION:-off}
unset CUDA_INTEROP_GL_WAIT
nvidia-smi -L
ls /usr/share/glvnd/egl_vendor.d/ 2>&1 | head

# 1. What NVIDIA's GL offers: the three extensions of the GPU-side wait.
timeout 120 "$unit" --exact gl::tests::print_the_semaphore_extensions --nocapture \
  > "$out/gl-wait-extensions.txt" 2>&1
cat "$out/gl-wait-extensions.txt" | grep -E "renderer|GL_|entry points|offered"
for x in GL_EXT_semaphore GL_EXT_semaphore_fd GL_NV_timeline_semaphore; do
  if grep -q "^  $x: yes" "$out/gl-wait-extensions.txt"; then pass "the context lists $x"
  else fail "the context does not list $x"; fi
done
if grep -q "GPU-side wait offered: true" "$out/gl-wait-extensions.txt"; then
  pass "the GPU-side wait is offered"
else
  fail "the GPU-side wait is not offered"
fi

# 2. The unit tests (fd ownership of a GL import, the wait chosen) on
#    NVIDIA's GL: the real refused import included.
if timeout 120 "$unit" --test-threads=1 > "$out/gl-wait-unit.txt" 2>&1; then
  pass "unit tests ($(grep 'test result' "$out/gl-wait-unit.txt"))"
else
  fail "unit tests (see $out/gl-wait-unit.txt)"; grep -E "panicked|FAILED" "$out/gl-wait-unit.txt" | head
fi

# 2b. GL's timeline wait and signal on Vulkan timelines of the process: a
#     GL wait for a value not reached holds GL's work until the host
#     signals it; a GL signal sets the Vulkan value (the ring tests cannot
#     show the former: the sender announces a frame once it is written).
if timeout 120 "$unit" --ignored --exact \
  receiver::tests::gpu_side_wait_holds_gl_until_the_value_and_signal_sets_it --nocapture \
  > "$out/gl-wait-timeline.txt" 2>&1 && grep -q "1 passed" "$out/gl-wait-timeline.txt"; then
  pass "GL timeline wait holds GL's work until the value; GL signal sets the Vulkan value"
else
  fail "GL timeline wait/signal (see $out/gl-wait-timeline.txt)"
  grep -E "panicked|FAILED" -A2 "$out/gl-wait-timeline.txt" | head
fi

# 3. The GPU machine's tests: 240 frames each of RGBA8, BGRA8, RGBA16F,
#    every texel exact, with the GPU-side wait asserted (WaitMode::Gpu).
if timeout 300 "$rx" --ignored gpu_side_wait --test-threads=1 --nocapture \
  > "$out/gl-wait-gpu.txt" 2>&1; then
  n=$(grep -c "frames through OpenGL textures, every texel exact" "$out/gl-wait-gpu.txt")
  g=$(grep "frames through OpenGL textures" "$out/gl-wait-gpu.txt" | grep -c "wait: Gpu")
  if [ "$n" = 3 ] && [ "$g" = 3 ]; then pass "GPU-side wait: 3 formats x 240 frames, every texel exact, wait: Gpu"
  else fail "GPU-side wait: $n formats exact, $g with wait: Gpu (3 and 3 expected)"; fi
else
  fail "GPU-side wait tests (see $out/gl-wait-gpu.txt)"
fi
grep -E "^test |test result|panicked|frames through" "$out/gl-wait-gpu.txt" | head -20

# 4. The crate's other tests, as CI runs them: on NVIDIA the every_texel
#    tests now take the GPU-side wait too.
if timeout 300 "$rx" --test-threads=1 --nocapture > "$out/gl-wait-all.txt" 2>&1; then
  pass "the other GL tests ($(grep 'test result' "$out/gl-wait-all.txt"))"
else
  fail "the other GL tests (see $out/gl-wait-all.txt)"
fi
grep -E "^test |test result|panicked|frames through" "$out/gl-wait-all.txt" | head -20

# 5. The host wait still works where asked for (CUDA_INTEROP_GL_WAIT=host),
#    for comparison: every texel exact with wait: Host.
if CUDA_INTEROP_GL_WAIT=host timeout 300 "$rx" every_texel --test-threads=1 --nocapture \
  > "$out/gl-wait-host.txt" 2>&1; then
  h=$(grep "frames through OpenGL textures" "$out/gl-wait-host.txt" | grep -c "wait: Host")
  if [ "$h" = 3 ]; then pass "host wait (CUDA_INTEROP_GL_WAIT=host): 3 formats exact, wait: Host"
  else fail "host wait: $h of 3 with wait: Host"; fi
else
  fail "host wait tests (see $out/gl-wait-host.txt)"
fi

if [ "$status" = 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
exit "$status"
