# Run 49 (issue 30: uses on the crate's streams without events), the bundle
# of the commit in .gpu/bundle/BUILD: the GPU tests of the binaries the
# change touches (semaphores, host waits, drops, copies, launches, imports,
# threads, the frames receivers), then the bench (S1-S9, quick).
# Carry [".gl", ".gpu-pack", ".gpu-run"].
set -u
cd "$(dirname "$0")/.."
LOGS=$OUT
exec > >(tee $LOGS/summary.txt) 2>&1
python3 -c "import tarfile; tarfile.open('.gpu-pack/bundle.tar.xz').extractall('.')"
head -3 .gpu/bundle/BUILD
export OUT=/tmp/run-logs; mkdir -p $OUT
GPU_RUN_ONLY=tests GPU_RUN_TESTS="semaphore host_wait async_waits drop_order copy launch import threads second_cut image_frames" \
  timeout 420 bash .gpu/bundle/run.sh > $OUT/tests.log 2>&1; echo "tests: exit $?"
grep -E "^test result|FAILED|panicked|gpu-run:|^=== " $OUT/tests.log | grep -vE "test result: ok" | tail -40
grep -cE "^test result: ok" $OUT/tests.log
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
echo "=== bench --quick"
(cd /tmp && timeout 150 $OLDPWD/.gpu/bundle/bench --quick --json $LOGS/bench-quick.json > $OUT/bench-quick.txt 2>&1; echo "bench: exit $?")
grep -E "^S6|^S2|^S1 " $OUT/bench-quick.txt | head -30
tar -C /tmp -czf $LOGS/logs.tgz run-logs
