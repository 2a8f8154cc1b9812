#!/usr/bin/env bash
# Runs on the GPU machine (which has no Rust), from the repository root,
# after `cargo xtask gpu-bundle` built .gpu/ and .gl/ elsewhere and both were
# carried there:   bash .gpu/bundle/run.sh
# (This file is xtask/gpu/run.sh, copied into the bundle as run.sh; the
# tests it runs and skips are in tests.txt beside it, from xtask/gpu/tests.txt.)
#
# Hides nothing: prints the commit the bundle was built from first; runs every
# parent test (only the child-process entry points, by exact name, are
# skipped: their parents run them); runs the `debug` tests again from the
# debug-assertion build; runs the `sanitizer` tests under compute-sanitizer
# memcheck and once under synccheck, requiring 0 errors, skipping only the
# `no-sanitizer` tests; and fails if any of that could not run.
set -uo pipefail
b=.gpu/bundle
manifest=$b/tests.txt
out=${OUT:-/tmp}
status=0
echo "=== bundle"
cat "$b/BUILD" || { echo "gpu-run: no $b/BUILD: not a bundle from cargo xtask gpu-bundle"; exit 1; }
[ -f "$manifest" ] || { echo "gpu-run: no $manifest"; exit 1; }

for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
# The layer travels compressed (cargo xtask gpu-bundle): unpack it once.
vvl_so=.gpu/vvl/libVkLayer_khronos_validation.so
if [ -f "$vvl_so.xz" ] && [ ! -f "$vvl_so" ]; then
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$vvl_so.xz" "$vvl_so" \
    || { echo "gpu-run: cannot unpack $vvl_so.xz"; exit 1; }
fi
export VK_LAYER_PATH=$PWD/.gpu/vvl
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
# The fake-driver parents' libcuda variants (see the testkit's fake.rs).
export CUDA_INTEROP_FAKE_CUDA_DIR=$PWD/$b/fake
# The C tests (cuda-interop-capi's c_programs) link this instead of cargo's.
export CUDA_INTEROP_CAPI_STATICLIB=$PWD/$b/libcuda_interop.a
run() { echo; echo "=== $*"; "$@" || { status=1; echo "=== FAILED: $*"; }; }

# The manifest's lines, without comments and blank lines.
lines() { grep -v '^[[:space:]]*#' "$manifest" | grep -v '^[[:space:]]*$'; }
# The words after the `:` of the line `KIND BINARY ...: WORDS` (none if absent).
words() { lines | awk -v k="$1" -v n="$2" '$1 == k && $2 == n { sub(/^[^:]*:[[:space:]]*/, ""); print }'; }
skips() { local n; for n in "$@"; do printf -- '--skip\n%s\n' "$n"; done; }

# Every skipped name must be a test of its binary (children: an ignored
# one): a renamed entry point would otherwise run on its own, or a skip
# would match nothing.
expect_tests() {
  local bin=$1 flag=$2 list n
  shift 2
  list=$("$bin" --list "$flag" 2>/dev/null)
  for n in "$@"; do
    grep -qx "$n: test" <<<"$list" || { echo "gpu-run: $bin has no $([ "$flag" = --ignored ] && echo 'ignored ')test $n: update xtask/gpu/tests.txt"; status=1; }
  done
}
while read -r kind name _; do
  case $kind in
    children) read -ra names <<<"$(words children "$name")"; expect_tests "$b/test-$name" --ignored "${names[@]}" ;;
    no-sanitizer|leaks-on-purpose) read -ra names <<<"$(words "$kind" "$name")"; expect_tests "$b/test-$name" --include-ignored "${names[@]}" ;;
  esac
done < <(lines)

# Runs test binary $1 (test-NAME$2) with the manifest's arguments, timeout
# and child skips.
run_test() {
  local name=$1 suffix=$2 head timeout="" args children skip=() extra=()
  head=$(lines | awk -v n="$name" '$1 == "test" && $2 == n { sub(/:.*/, ""); print }')
  read -ra args <<<"$(words test "$name")"
  read -ra children <<<"$(words children "$name")"
  if ((${#children[@]})); then mapfile -t skip < <(skips "${children[@]}"); extra=(--exact); fi
  [[ $head =~ timeout=([0-9]+) ]] && timeout=${BASH_REMATCH[1]}
  if [ -n "$timeout" ]; then
    run timeout "$timeout" "$b/test-$name$suffix" "${args[@]}" "${extra[@]}" "${skip[@]}"
  else
    run "$b/test-$name$suffix" "${args[@]}" "${extra[@]}" "${skip[@]}"
  fi
}
mapfile -t tests < <(lines | awk '$1 == "test" && !/ faults[ :]/ { print $2 }')
# `faults` binaries fault the GPU on purpose (a CUDA out-of-bounds store, a
# sticky fault): they run last, after the debug copies, because on driver
# 580.159.04 the fault leaves vkCmdCopyImage on the graphics queue of every
# later process hanging (GPU runs 19 and 20: the tests' own raw ash copy too).
mapfile -t fault_tests < <(lines | awk '$1 == "test" && / faults[ :]/ { print $2 }')
mapfile -t debug_tests < <(lines | awk '$1 == "test" && / debug[ :]/ { print $2 }')
# GPU_RUN_TESTS="a b" runs only those test binaries (and their debug
# copies), for a run that repeats a few or splits the suite over several
# commands; the run then says so at its end. The word `examples` in it also
# runs the examples and host_wait (which run whenever it is unset).
if [ -n "${GPU_RUN_TESTS:-}" ]; then
  keep() { local t; for t in "$@"; do [[ " $GPU_RUN_TESTS " == *" $t "* ]] && echo "$t"; done; }
  mapfile -t tests < <(keep "${tests[@]}")
  mapfile -t debug_tests < <(keep "${debug_tests[@]}")
  mapfile -t fault_tests < <(keep "${fault_tests[@]}")
fi

nvidia-smi -L
# GPU_RUN_ONLY=semaphore-repeat (issue 28, 8) runs only test-semaphore_handles,
# GPU_REPEAT times (default 20) per pass, its tests on parallel threads
# (--test-threads=3, not the manifest's 1), and says per pass how many runs
# failed and how: "shipped" (the tests take the binary's own lock: expected
# 0), "parallel" (CUDA_INTEROP_PARALLEL_SEMAPHORE_TESTS=1: the lock off, the
# three tests at once as in runs 18a and the H100's: the flake), and
# "parallel-no-import" (the lock off, without the one test whose import of an
# fd that is no semaphore makes NVIDIA's driver report "Failed to allocate
# semaphore device memory"). Every run's output: $OUT/semaphore-repeat-PASS.log.
# Fails only when "shipped" failed.
if [ "${GPU_RUN_ONLY:-}" = semaphore-repeat ]; then
  repeat=${GPU_REPEAT:-20}
  bin=$b/test-semaphore_handles
  nvidia-smi --query-gpu=driver_version --format=csv,noheader
  for pass in shipped parallel parallel-no-import; do
    log=$out/semaphore-repeat-$pass.log failed=0
    : >"$log"
    penv=() skip=()
    [ "$pass" != shipped ] && penv=(CUDA_INTEROP_PARALLEL_SEMAPHORE_TESTS=1)
    [ "$pass" = parallel-no-import ] && skip=(--skip a_binary_semaphore_this_process_sent_itself_is_refused)
    for i in $(seq 1 "$repeat"); do
      echo "=== $pass run $i" >>"$log"
      if ! env "${penv[@]}" timeout 300 "$bin" --include-ignored --nocapture --test-threads=3 "${skip[@]}" >>"$log" 2>&1; then
        failed=$((failed + 1)); echo "=== $pass run $i FAILED" >>"$log"
      fi
    done
    echo; echo "semaphore-repeat $pass: $failed of $repeat runs failed"
    grep -E "^test .* FAILED|panicked|vkCreateSemaphore|Failed to allocate" "$log" | sed -E 's/ \([0-9]+\) panicked/ panicked/' | sort | uniq -c | sort -rn | head -8
    [ "$pass" = shipped ] && [ "$failed" != 0 ] && status=1
  done
  echo; echo "gpu-run: $([ $status = 0 ] && echo all passed || echo FAILURES) (GPU_RUN_ONLY=semaphore-repeat, $repeat runs a pass) ($(head -1 $b/BUILD))"
  exit $status
fi
# GPU_RUN_ONLY=bench runs only the benchmarks, without the validation layer
# (they measure): bench (S1-S4, S6-S9, drift) with its JSON and text in
# $OUT, and host_wait.
if [ "${GPU_RUN_ONLY:-}" = bench ]; then
  nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.mem,mig.mode.current --format=csv
  echo; echo "=== $b/bench --json $out/bench.json"
  env -u VK_LAYER_PATH $b/bench --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || { status=1; echo "=== FAILED: bench"; }
  echo; echo "=== $b/host_wait 300 --json $out/host_wait.json"
  env -u VK_LAYER_PATH $b/host_wait 300 --json "$out/host_wait.json" 2>&1 | tee "$out/host_wait.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || { status=1; echo "=== FAILED: host_wait"; }
  echo; echo "gpu-run: $([ $status = 0 ] && echo all passed || echo FAILURES) (benchmarks only: GPU_RUN_ONLY=bench) ($(head -1 $b/BUILD))"
  exit $status
fi
# GPU_RUN_ONLY=s9 runs only the bench's S9 (issue 30, without the
# validation layer): the frame ring against the CUDA IPC ring, 1 and 4
# receiving processes, without and with a private CUDA MPS daemon (the bench
# starts and stops it), and the latency by step; JSON and text in $OUT; the
# doctor's MPS section first. Fails when S9 measured nothing or a goal
# row could not be made (a failed child); goals missed are reported, not
# failures.
if [ "${GPU_RUN_ONLY:-}" = s9 ]; then
  nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.mem,mig.mode.current,compute_mode --format=csv
  echo; echo "=== $b/cuda-interop-doctor (its CUDA MPS section)"
  $b/cuda-interop-doctor | sed -n '/^Several receiving processes/,/^Verdict/p'
  echo; echo "=== $b/bench --s9-only --json $out/s9.json"
  env -u VK_LAYER_PATH $b/bench --s9-only --json "$out/s9.json" 2>&1 | tee "$out/s9.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || { status=1; echo "=== FAILED: bench --s9-only"; }
  echo; echo "gpu-run: $([ $status = 0 ] && echo all passed || echo FAILURES) (S9 only: GPU_RUN_ONLY=s9) ($(head -1 $b/BUILD))"
  exit $status
fi
# GPU_RUN_ONLY=sanitizer runs only the compute-sanitizer passes (to repeat
# them); GPU_RUN_ONLY=tests everything but them.
if [ "${GPU_RUN_ONLY:-}" != sanitizer ]; then
nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.mem,mig.mode.current --format=csv
run $b/driver_info
# What the machine can do (exit 1: interop does not work, which fails the run).
run $b/cuda-interop-doctor
for t in "${tests[@]}"; do run_test "$t" ""; done
echo; echo "=== debug assertions and overflow checks on (profile gpu-debug)"
for t in "${debug_tests[@]}"; do run_test "$t" -debug; done

# The examples and the host-wait bench (with GPU_RUN_TESTS, only where it
# names `examples`).
if [ -z "${GPU_RUN_TESTS:-}" ] || [[ " $GPU_RUN_TESTS " == *" examples "* ]]; then
run $b/round_trip 120 --bench
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
run $b/round_trip 30 --device "$uuid"
echo; echo "=== CUDA_VISIBLE_DEVICES= (CUDA hides the GPU; pairing must report it, not pick another)"
CUDA_VISIBLE_DEVICES= $b/round_trip 5 || status=1
# The wgpu adapter (cuda-interop-wgpu): wgpu compute -> timeline -> CUDA, every pixel.
run $b/wgpu_to_cuda
# wgpu writing a frame sender's image slots, received by a Vulkan receiver
# on its own device, every pixel checked (1080p, then 4K).
run $b/wgpu_frames --frames 120
run $b/wgpu_frames --frames 30 --width 3840 --height 2160
# Bring your own device: an ash device wrapped by Context::from_raw.
run $b/own_device
run $b/host_wait 300
fi
echo; echo "=== the tests that fault the GPU on purpose, last"
for t in "${fault_tests[@]}"; do run_test "$t" ""; done
fi

# GPU_RUN_ONLY=tests stops here (the sanitizer passes then run in a second
# command, GPU_RUN_ONLY=sanitizer, when one command's time is limited).
if [ "${GPU_RUN_ONLY:-}" = tests ]; then
  echo; echo "gpu-run: $([ $status = 0 ] && echo all passed || echo FAILURES) (tests only, no sanitizer: GPU_RUN_ONLY=tests${GPU_RUN_TESTS:+; only the test binaries $GPU_RUN_TESTS}) ($(head -1 $b/BUILD))"
  exit $status
fi

# Last, as the slowest part: the `sanitizer` tests again under compute-sanitizer.
# compute-sanitizer: the bundle's, else the machine's.
san=
for c in .gpu/compute-sanitizer/compute-sanitizer "$(command -v compute-sanitizer || true)" \
  "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda*/bin/compute-sanitizer; do
  if [ -n "$c" ] && [ -x "$c" ]; then san=$c; break; fi
done
# Runs test binary $name under compute-sanitizer --tool $1 (children too) and
# requires exit 0 and an "ERROR SUMMARY: 0 errors" from every process.
# API errors are not reported: the tests provoke and check some on purpose
# (a bad fd, a foreign UUID) and fail on any other.
sanitize() {
  local tool=$1 log="$out/sanitizer-$1${log_suffix:-}.log" rc
  shift
  echo; echo "=== compute-sanitizer --tool $tool $* ($name)"
  timeout "${SANITIZER_TIMEOUT:-240}" "$san" --tool "$tool" --error-exitcode 1 --target-processes all --report-api-errors no "$@" \
    "$b/test-$name" "${san_args[@]}" --exact "${san_skip[@]}" "${test_filter[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local summaries errors
  summaries=$(grep -c 'ERROR SUMMARY:' "$log")
  errors=$(grep 'ERROR SUMMARY:' "$log" | grep -vc 'ERROR SUMMARY: 0 errors')
  echo "=== $tool: exit $rc, $summaries process summaries, $errors with errors"
  if [ "$rc" != 0 ] || [ "$summaries" = 0 ] || [ "$errors" != 0 ]; then
    status=1; echo "=== FAILED: compute-sanitizer --tool $tool ($name)"
  fi
}
mapfile -t sanitized < <(lines | awk '$1 == "sanitizer" { print $2 }')
if [ -n "$san" ]; then
  echo; echo "=== compute-sanitizer: $san ($("$san" --version | tail -1))"
  for name in "${sanitized[@]}"; do
    read -ra san_args <<<"$(words sanitizer "$name")"
    read -ra children <<<"$(words children "$name")"
    read -ra unsanitized <<<"$(words no-sanitizer "$name")"
    read -ra leaks <<<"$(words leaks-on-purpose "$name")"
    mapfile -t san_skip < <(skips "${children[@]}" "${unsanitized[@]}")
    # The leak check runs without the tests that leak on purpose (they
    # assert the leak is reported); memcheck runs those alone without it.
    mapfile -t test_filter < <(skips "${leaks[@]}")
    log_suffix= sanitize memcheck --leak-check full
    if ((${#leaks[@]})); then
      test_filter=("${leaks[@]}")
      log_suffix=-stuck sanitize memcheck
    fi
    test_filter=()
    log_suffix= sanitize synccheck
  done
else
  status=1
  echo; echo "=== FAILED: no compute-sanitizer (bundle, PATH, \$CUDA_HOME, /usr/local/cuda*): memcheck and synccheck NOT RUN"
fi

echo; echo "gpu-run: $([ $status = 0 ] && echo all passed || echo FAILURES) ($(head -1 $b/BUILD))"
exit $status
