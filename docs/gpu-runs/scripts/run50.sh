# Run 50 (issue 30), the binaries of the commit in .gst50/BUILT: the GPU
# tests of semaphore, drop_order and host_wait (--ignored, without the
# child entry points), then the whole bench (S1-S9, drift), its JSON.
# Carry [".gl", ".gpu-run", ".gst50"].
set -u
cd "$(dirname "$0")/.."
LOGS=$OUT; OUT=/tmp/run-logs; mkdir -p $OUT
exec > >(tee $LOGS/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export BENCH_MPS_CONTROL=/usr/local/nvidia/bin/nvidia-cuda-mps-control
export PATH=$PATH:/usr/local/nvidia/bin
nvidia-smi -L; cat .gst50/BUILT
B=$PWD/.gst50
for t in semaphore drop_order host_wait; do
  (cd /tmp && timeout 150 $B/test-$t --ignored --skip child_ --test-threads=1 > $OUT/test-$t.txt 2>&1; echo "test-$t: exit $?")
  grep -E "^test result|FAILED|panicked" $OUT/test-$t.txt | head -5
done
echo "=== B: bench --json"
(cd /tmp && timeout 380 $B/bench --json $LOGS/bench.json > $LOGS/bench.txt 2>&1; echo "bench: exit $?")
grep -E "^S6|^S9 \|.*(MPS|4 receivers).*hand-off median|^S2 \| hand-off, host waits with WaitStrategy::ADAPTIVE \(default\): p50" $LOGS/bench.txt | head -30
grep -E "goal|missed" $LOGS/bench.txt | grep -v "^|" | head
tar -C /tmp -czf $LOGS/logs.tgz run-logs
