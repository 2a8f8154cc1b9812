# Run 52 (issue 30), the binaries of the commit in .gst52/BUILT (after the
# second review): the GPU cases (--ignored, without the child entry points)
# of semaphore, drop_order, host_wait, async_waits, copy, image_frames,
# second_cut; gpu_demo.sh (torch and CuPy consumers on raw streams, the
# Rust one, a SIGKILLed torch consumer); the whole bench.
# Carry [".gl", ".gpu-run", ".gst52"].
set -u
cd "$(dirname "$0")/.."
LOGS=$OUT; OUT=/tmp/run-logs; mkdir -p $OUT
exec > >(tee $LOGS/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export BENCH_MPS_CONTROL=/usr/local/nvidia/bin/nvidia-cuda-mps-control
export PATH=$PATH:/usr/local/nvidia/bin
nvidia-smi -L; cat .gst52/BUILT
B=$PWD/.gst52
for t in semaphore drop_order host_wait async_waits copy image_frames second_cut; do
  (cd /tmp && timeout 200 $B/test-$t --ignored --skip child_ --test-threads=1 > $OUT/test-$t.txt 2>&1; echo "test-$t: exit $?")
  grep -E "^test result|FAILED|panicked" $OUT/test-$t.txt | head -5
done
echo "=== P: gpu_demo.sh"
(
export XDG_RUNTIME_DIR=/tmp/py-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
DEMO_DIR=$B/demo timeout 240 bash $B/demo/gpu_demo.sh > $OUT/gpu-demo.txt 2>&1; echo "gpu_demo.sh: exit $?"
tail -14 $OUT/gpu-demo.txt
)
echo "=== B: bench --json"
(cd /tmp && timeout 200 $B/bench --json $LOGS/bench.json > $LOGS/bench.txt 2>&1; echo "bench: exit $?")
grep -E "^S6|^S9 \|.*(MPS|4 receivers).*hand-off median" $LOGS/bench.txt | head -30
tar -C /tmp -czf $LOGS/logs.tgz run-logs
