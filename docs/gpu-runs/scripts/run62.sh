# Run 62 (issue 30, host waits), the binaries of the commit in .gst62/BUILT:
# host_wait (HostWait::Sleep beside the raw blocking event, the default
# Adaptive now sleeping in the driver and skipping its spin after a long
# wait), the whole bench, host_wait again, then the GPU cases (--ignored,
# without the child entry points) of host_wait, semaphore, drop_order,
# async_waits, copy, processes, and the frames crate's image_frames and
# second_cut (device-local slots).
# Carry [".gl", ".gst62"].
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
nvidia-smi -L; cat .gst62/BUILT
B=$PWD/.gst62
echo "=== H1: host_wait 300"
(cd /tmp && timeout 90 $B/host_wait 300 --json $LOGS/host_wait.json > $LOGS/host_wait.txt 2>&1; echo "host_wait: exit $?")
sed -n "/host wake-up/,\$p" $LOGS/host_wait.txt
echo "=== T0: test-host_wait"
(cd /tmp && timeout 90 $B/test-host_wait --ignored --skip child_ --test-threads=1 --nocapture > $OUT/test-host_wait.txt 2>&1; echo "test-host_wait: exit $?")
grep -E "^test |test result|FAILED|panicked|stuck stream|after the signal|seen after" $OUT/test-host_wait.txt | head -20
echo "=== B: bench --json"
(cd /tmp && timeout 260 $B/bench --json $LOGS/bench.json > $LOGS/bench.txt 2>&1; echo "bench: exit $?")
grep -E "host waits|^S6" $LOGS/bench.txt | head -20
echo "=== H2: host_wait 300"
(cd /tmp && timeout 90 $B/host_wait 300 --json $LOGS/host_wait2.json > $LOGS/host_wait2.txt 2>&1; echo "host_wait: exit $?")
sed -n "/host wake-up/,\$p" $LOGS/host_wait2.txt
echo "=== T: GPU tests"
for t in semaphore drop_order second_cut image_frames async_waits copy processes; do
  (cd /tmp && timeout 90 $B/test-$t --ignored --skip child_ --test-threads=1 > $OUT/test-$t.txt 2>&1; echo "test-$t: exit $?")
  grep -E "^test result|FAILED|panicked" $OUT/test-$t.txt | head -5
done
tar -C /tmp -czf $LOGS/logs.tgz run-logs
