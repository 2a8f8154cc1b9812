#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-bundle.sh
# built .gpu/ and .gl/ here and both were carried there.
#
# Hides nothing: prints the commit the bundle was built from first; runs every
# parent test (only the child-process entry points, by exact name, are
# skipped: their parents run them); runs the fd-heavy tests again from the
# debug-assertion build; runs the GPU tests under compute-sanitizer memcheck
# and once under synccheck, requiring 0 errors, skipping only the test that
# faults on purpose; and fails if any of that could not run.
set -uo pipefail
b=.gpu/bundle
out=${OUT:-/tmp}
status=0
echo "=== bundle"
cat "$b/BUILD" || { echo "gpu-run: no $b/BUILD: not a bundle from scripts/gpu-bundle.sh"; exit 1; }

for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_LAYER_PATH=$PWD/.gpu/vvl
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
run() { echo; echo "=== $*"; "$@" || { status=1; echo "=== FAILED: $*"; }; }

# Child-process entry points: #[ignore]d tests that a parent test starts in a
# child process by exact name (tests/tests/vulkan.rs, gpu.rs). Run on their
# own they fail, so they are skipped, exactly, and nothing else is.
vulkan_children=(child_process_importer)
gpu_children=(child_cuda_importer child_poisoned child_producer_that_dies child_wait_nobody_signals child_context_pop_mismatch)
gpu_faults_children=(child_cuda_importer_that_is_killed child_binary_wait_without_a_signal child_threads_and_contexts child_out_of_bounds_store)
# The tests that fault on purpose (an illegal address, in a child process):
# not run under compute-sanitizer, which would rightly report the fault.
faulting=(a_sticky_fault_poisons_the_process_and_later_calls_say_so child_poisoned)
skips() { local n; for n in "$@"; do printf -- '--skip\n%s\n' "$n"; done; }
mapfile -t vulkan_skip < <(skips "${vulkan_children[@]}")
mapfile -t gpu_skip < <(skips "${gpu_children[@]}")
mapfile -t gpu_faults_skip < <(skips "${gpu_faults_children[@]}")
# Vulkan-only soak: no CUDA work for the sanitizer to check, and slow under it.
vulkan_only=(ten_thousand_timeline_export_import_cycles_without_validation_errors)
mapfile -t san_skip < <(skips "${gpu_children[@]}" "${faulting[@]}" "${vulkan_only[@]}")
test_filter=()
# Every skipped name must be an ignored test of its binary: a renamed entry
# point would otherwise run on its own, or a skip would match nothing.
expect_ignored() {
  local bin=$1 list n
  shift
  list=$("$bin" --list --ignored 2>/dev/null)
  for n in "$@"; do
    grep -qx "$n: test" <<<"$list" || { echo "gpu-run: $bin has no ignored test $n: update run.sh"; status=1; }
  done
}
expect_ignored $b/test-vulkan "${vulkan_children[@]}"
expect_ignored $b/test-gpu "${gpu_children[@]}" a_sticky_fault_poisons_the_process_and_later_calls_say_so
expect_ignored $b/test-gpu_faults "${gpu_faults_children[@]}"

nvidia-smi -L
# GPU_RUN_ONLY=sanitizer runs only the compute-sanitizer passes (to repeat them).
if [ "${GPU_RUN_ONLY:-}" != sanitizer ]; then
nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.mem,mig.mode.current --format=csv
run $b/driver_info
run $b/test-vulkan --test-threads=1 --exact "${vulkan_skip[@]}"
run $b/test-wire --test-threads=1
run $b/test-trust_boundary --nocapture
echo; echo "=== debug assertions and overflow checks on (profile gpu-debug)"
run $b/test-vulkan-debug --test-threads=1 --exact "${vulkan_skip[@]}"
run $b/test-wire-debug --test-threads=1
run $b/test-trust_boundary-debug
run timeout 240 $b/test-soak --include-ignored --test-threads=1 --nocapture
run timeout 300 $b/test-gpu --ignored --test-threads=1 --nocapture --exact "${gpu_skip[@]}"
# The fault cases of docs/fault-cases.md that need the driver (not run under
# compute-sanitizer: one faults on purpose, others provoke driver errors).
run timeout 300 $b/test-gpu_faults --ignored --test-threads=1 --nocapture --exact "${gpu_faults_skip[@]}"

run $b/round_trip 120 --bench
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
run $b/round_trip 30 --device "$uuid"
echo; echo "=== CUDA_VISIBLE_DEVICES= (CUDA hides the GPU; pairing must report it, not pick another)"
CUDA_VISIBLE_DEVICES= $b/round_trip 5 || status=1
run $b/host_wait 300
fi

# Last, as the slowest part: the GPU tests again under compute-sanitizer.
# compute-sanitizer: the bundle's, else the machine's.
san=
for c in .gpu/compute-sanitizer/compute-sanitizer "$(command -v compute-sanitizer || true)" \
  "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda*/bin/compute-sanitizer; do
  if [ -n "$c" ] && [ -x "$c" ]; then san=$c; break; fi
done
# Runs the GPU tests under compute-sanitizer --tool $1 (children too) and
# requires exit 0 and an "ERROR SUMMARY: 0 errors" from every process.
# API errors are not reported: the tests provoke and check some on purpose
# (a bad fd, a foreign UUID) and fail on any other.
sanitize() {
  local tool=$1 log="$out/sanitizer-$1${log_suffix:-}.log" rc
  shift
  echo; echo "=== compute-sanitizer --tool $tool $*"
  timeout "${SANITIZER_TIMEOUT:-240}" "$san" --tool "$tool" --error-exitcode 1 --target-processes all --report-api-errors no "$@" \
    $b/test-gpu --ignored --test-threads=1 --exact "${san_skip[@]}" "${test_filter[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local summaries errors
  summaries=$(grep -c 'ERROR SUMMARY:' "$log")
  errors=$(grep 'ERROR SUMMARY:' "$log" | grep -vc 'ERROR SUMMARY: 0 errors')
  echo "=== $tool: exit $rc, $summaries process summaries, $errors with errors"
  if [ "$rc" != 0 ] || [ "$summaries" = 0 ] || [ "$errors" != 0 ]; then
    status=1; echo "=== FAILED: compute-sanitizer --tool $tool"
  fi
}
if [ -n "$san" ]; then
  echo; echo "=== compute-sanitizer: $san ($("$san" --version | tail -1))"
  # The stuck-device test leaks a 1 MiB mapping on purpose (freeing it would
  # block on the stuck stream; the test asserts the leak is reported), so
  # the leak check runs without it, and memcheck runs it alone without the
  # leak check.
  leaks_on_purpose=a_wait_nobody_signals_times_out_and_every_drop_returns_within_its_bound
  test_filter=(--skip "$leaks_on_purpose")
  sanitize memcheck --leak-check full
  test_filter=("$leaks_on_purpose")
  log_suffix=-stuck sanitize memcheck
  test_filter=()
  sanitize synccheck
else
  status=1
  echo; echo "=== FAILED: no compute-sanitizer (bundle, PATH, \$CUDA_HOME, /usr/local/cuda*): memcheck and synccheck NOT RUN"
fi

echo; echo "gpu-run: $([ $status = 0 ] && echo all passed || echo FAILURES) ($(head -1 $b/BUILD))"
exit $status
