# Run 68 (issue 30): the whole GPU suite of the submitted commit, from the
# bundle of `cargo xtask gpu-bundle` (.gpu/bundle/BUILD names the commit),
# split over four commands that each fit the device's 10 minutes, on one warm
# machine if it stays held:
#   bash docs/gpu-runs/scripts/run68.sh A   test binaries, first half
#   bash docs/gpu-runs/scripts/run68.sh C   bench (S3's batched loop now at 8K
#                                           too) and host_wait 300, three times
#   bash docs/gpu-runs/scripts/run68.sh S   the compute-sanitizer passes
#   bash docs/gpu-runs/scripts/run68.sh B   the other half, the examples, and
#                                           the tests that fault the GPU (last:
#                                           finding F7)
#   bash docs/gpu-runs/scripts/run68.sh D   where machines are scarce, one call:
#                                           nine test binaries, host_wait, bench
#   bash docs/gpu-runs/scripts/run68.sh E   less device time still: three test
#                                           binaries, host_wait
# Carry [".gl", ".gpu"].
set -u
cd "$(dirname "$0")/../../.."
export XDG_RUNTIME_DIR=/tmp/d-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
# For the binaries this script runs itself (run.sh sets its own).
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export BENCH_MPS_CONTROL=/usr/local/nvidia/bin/nvidia-cuda-mps-control
export PATH=$PATH:/usr/local/nvidia/bin
A="export_import queues copy_loops record socket wire trust_boundary forged_bundle
   bounded_helpers semaphore_handles convert c_programs import copy launch semaphore
   host_wait async_waits"
B="drop_order processes exhaustion device_loss socket_peers timeline_edges imports_more
   formats threads image_frames image_copy open_slot second_cut wgpu_adapter
   review_regressions soak examples map context"
case ${1:-} in
  A) GPU_RUN_ONLY=tests GPU_RUN_TESTS="$(echo $A)" bash .gpu/bundle/run.sh 2>&1 | tee $OUT/tests-A.log ;;
  B) GPU_RUN_ONLY=tests GPU_RUN_TESTS="$(echo $B)" bash .gpu/bundle/run.sh 2>&1 | tee $OUT/tests-B.log ;;
  S) GPU_RUN_ONLY=sanitizer bash .gpu/bundle/run.sh 2>&1 | tee $OUT/sanitizer.log ;;
  C) GPU_RUN_ONLY=bench bash .gpu/bundle/run.sh > $OUT/bench-run.log 2>&1; echo "bench run: exit $?"
     grep -E "^S3 .*(8K|4K).*(overhead|batches)|goals|\[(holds|missed)\]|gpu-run:" $OUT/bench-run.log | head -80
     for i in 2 3; do
       echo "=== host_wait 300, again ($i)"
       (cd /tmp && timeout 120 $OLDPWD/.gpu/bundle/host_wait 300 --json $OUT/host_wait$i.json > $OUT/host_wait$i.txt 2>&1; echo "host_wait: exit $?")
       sed -n "/goals/,\$p" $OUT/host_wait$i.txt
     done ;;
  D) # One call, where machines are scarce: the test binaries of what
     # changed since run 66 (host waits, the frames' accept thread) and their
     # neighbours, then host_wait 300, then the whole bench.
     GPU_RUN_ONLY=tests GPU_RUN_TESTS="host_wait semaphore drop_order async_waits copy image_frames second_cut c_programs processes" \
       timeout 230 bash .gpu/bundle/run.sh > $OUT/tests-D.log 2>&1; echo "tests: exit $?"
     grep -E "^=== |test result|FAILED|panicked|gpu-run:" $OUT/tests-D.log | grep -v "^=== RUN" | head -60
     echo "=== host_wait 300"
     (cd /tmp && timeout 80 $OLDPWD/.gpu/bundle/host_wait 300 --json $OUT/host_wait1.json > $OUT/host_wait1.txt 2>&1; echo "host_wait: exit $?")
     sed -n "/goals/,\$p" $OUT/host_wait1.txt
     echo "=== bench --json"
     (cd /tmp && env -u VK_LAYER_PATH timeout 265 $OLDPWD/.gpu/bundle/bench --json $OUT/bench.json > $OUT/bench.txt 2>&1; echo "bench: exit $?")
     grep -E "^S3 .*(8K|4K).*(overhead|batches)" $OUT/bench.txt | head -40 ;;
  E) # The least that checks this stop's library changes, for a call with
     # little device time left: the GPU cases of host_wait and the frames'
     # image rings, then host_wait 300.
     GPU_RUN_ONLY=tests GPU_RUN_TESTS="host_wait second_cut image_frames" \
       timeout 200 bash .gpu/bundle/run.sh > $OUT/tests-E.log 2>&1; echo "tests: exit $?"
     grep -E "^=== |test result|FAILED|panicked|gpu-run:" $OUT/tests-E.log | grep -v "^=== RUN" | head -40
     echo "=== host_wait 300"
     (cd /tmp && timeout 70 $OLDPWD/.gpu/bundle/host_wait 300 --json $OUT/host_wait1.json > $OUT/host_wait1.txt 2>&1; echo "host_wait: exit $?")
     sed -n "/goals/,\$p" $OUT/host_wait1.txt ;;
  *) echo "run68.sh A|B|C|D|E|S"; exit 2 ;;
esac
