#!/usr/bin/env bash
# Issue 31: two-plane 4:2:0 images (ExportablePlanarImage: Nv12Planes,
# P010Planes, disjoint), each plane imported into CUDA as an array of its own
# format; tests/tests/planar.rs's ignored GPU tests. No Rust on the GPU
# machine: build here first (device-local memory, as NVIDIA has):
#
#   cargo test --release -p cuda-interop-tests --test planar \
#       --features cuda-interop-testkit/device-local --no-run
#
# and copy the binary it lists:
#   .../release/deps/planar-HASH  -> .gpu-run/test-planar
# Then, from the repository root on the GPU machine:
#
#   bash .gpu-run/multiplanar.sh [PLANAR_BINARY]
#
# Prints one PASS or FAIL line per check (each plane of each format and size:
# the Vulkan readback, every texel of the CUDA array, and CUDA's write read
# back by Vulkan) and a final RESULT line; exit 0 only if every check passed.
# Logs go to $OUT (default /tmp).
set -u
cd "$(dirname "$0")/.."
bin=${1:-.gpu-run/test-planar}
out=${OUT:-/tmp}
status=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; status=1; }

[ -x "$bin" ] || { echo "FAIL: no test binary $bin (see this script's header)"; echo "RESULT: FAIL"; exit 1; }
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
# The tests require the Khronos validation layer unless this is "off": keep it
# on where a layer is installed or carried (VK_LAYER_PATH), else run without.
if [ -z "${CUDA_INTEROP_VALIDATION:-}" ]; then
  if ls ${VK_LAYER_PATH:-/usr/share/vulkan/explicit_layer.d} 2>/dev/null | grep -q khronos_validation; then
    export CUDA_INTEROP_VALIDATION=required
  else
    export CUDA_INTEROP_VALIDATION=off
  fi
fi
echo "validation: $CUDA_INTEROP_VALIDATION"
nvidia-smi -L

# 1. What the driver offers (format features, DISJOINT, external memory) and
#    the tests that run on any driver. The fake-libcuda tests need the
#    build's fake-libcuda-* directories (CUDA_INTEROP_FAKE_CUDA_DIR, as the
#    GPU bundle carries them); without them they are skipped here (CI runs them).
skip=()
if [ -z "${CUDA_INTEROP_FAKE_CUDA_DIR:-}" ]; then
  skip=(--skip the_planes_descriptors_come_from_the_record
        --skip a_failed_two_plane_import_hands_both_fds_back
        --skip a_received_two_plane_image_is_verified_before_cuda_sees_its_fds)
fi
timeout 120 "$bin" --test-threads=1 --nocapture "${skip[@]}" > "$out/planar-everywhere.txt" 2>&1
grep -E "device: |: optimal-tiling|vkGetPhysicalDeviceImageFormatProperties2|^preflight" "$out/planar-everywhere.txt"
if grep -q "test result: ok" "$out/planar-everywhere.txt"; then
  pass "the tests that run everywhere ($(grep 'test result' "$out/planar-everywhere.txt"))"
else
  fail "the tests that run everywhere (see $out/planar-everywhere.txt)"
  grep -E "panicked|FAILED" "$out/planar-everywhere.txt" | head
fi

# 2. Each GPU test on its own (a failure in one does not hide the others).
for t in gpu_the_driver_offers_both_formats_disjoint \
         gpu_nv12_planes_are_exact_cuda_arrays_256x128 \
         gpu_nv12_planes_are_exact_cuda_arrays_1920x1080 \
         gpu_p010_planes_are_exact_cuda_arrays_256x128 \
         gpu_p010_planes_are_exact_cuda_arrays_1920x1080; do
  log="$out/planar-$t.txt"
  timeout 300 "$bin" --ignored --exact "$t" --nocapture --test-threads=1 > "$log" 2>&1
  rc=$?
  # The test's own check lines (every plane, each direction).
  grep -E "^(PASS|FAIL) " "$log" | sed 's/^/    /'
  if [ $rc -eq 0 ] && grep -q "test result: ok. 1 passed" "$log"; then
    pass "$t"
  else
    fail "$t (exit $rc; see $log)"
    grep -E "panicked|FAILED|validation" "$log" | head -5
  fi
done

if [ $status -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
exit $status
