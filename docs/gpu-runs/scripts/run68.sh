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
# Carry [".gl", ".gpu"].
set -u
cd "$(dirname "$0")/../../.."
export XDG_RUNTIME_DIR=/tmp/d-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
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
  *) echo "run68.sh A|B|C|S"; exit 2 ;;
esac
