# Run 59 (issue 30; run 58, the same at 99c6cad, never started), the binaries of the commit in .gst59/BUILT: the whole
# bench (S6 after the fork check and the external waits as tickets; S3's
# render producer with the consumer's copy by the driver beside the
# kernel), host_wait, then the GPU cases (--ignored, without the child
# entry points) of semaphore, drop_order, host_wait, async_waits, copy,
# threads, processes, and the frames crate's image_frames and second_cut
# (device-local slots).
# Carry [".gl", ".gst59"].
set -u
cd "$(dirname "$0")/../../.."
LOGS=$OUT; OUT=/tmp/run-logs; mkdir -p $OUT
exec > >(tee $LOGS/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export BENCH_MPS_CONTROL=/usr/local/nvidia/bin/nvidia-cuda-mps-control
export PATH=$PATH:/usr/local/nvidia/bin
export XDG_RUNTIME_DIR=/tmp/d-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
nvidia-smi -L; cat .gst59/BUILT
B=$PWD/.gst59
echo "=== B: bench --json"
(cd /tmp && timeout 260 $B/bench --json $LOGS/bench.json > $LOGS/bench.txt 2>&1; echo "bench: exit $?")
grep -E "^S6|^S3 .*(overhead|consumer alone)" $LOGS/bench.txt | head -60
echo "=== H: host_wait 300"
(cd /tmp && timeout 60 $B/host_wait 300 --json $LOGS/host_wait.json > $LOGS/host_wait.txt 2>&1; echo "host_wait: exit $?")
tail -8 $LOGS/host_wait.txt
echo "=== T: GPU tests"
for t in semaphore drop_order second_cut image_frames host_wait async_waits copy threads processes; do
  (cd /tmp && timeout 90 $B/test-$t --ignored --skip child_ --test-threads=1 > $OUT/test-$t.txt 2>&1; echo "test-$t: exit $?")
  grep -E "^test result|FAILED|panicked" $OUT/test-$t.txt | head -5
done
tar -C /tmp -czf $LOGS/logs.tgz run-logs
