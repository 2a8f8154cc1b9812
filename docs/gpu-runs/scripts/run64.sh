# Run 64 (issue 30, host waits), the binaries of the commit in .gst64/BUILT:
# after two reviews the sleep in the driver is withdrawn, and
# HostWait::ADAPTIVE blocks on a completion after its spin, skipping the
# spin seven waits in eight after long waits. The first review's probe
# (docs/gpu-runs/probes/sleeper_queue.c) with 0 and 8 blocked streams and
# with CUDA_DEVICE_MAX_CONNECTIONS=1, host_wait once, the GPU cases
# (--ignored, without the child entry points) of host_wait and second_cut
# (trimmed to fit the device time left after nine failed starts).
# Carry [".gl", ".gst64"].
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
nvidia-smi -L; cat .gst64/BUILT
B=$PWD/.gst64
echo "=== P: sleeper_queue probe"
L=$(ldconfig -p | grep -m1 'libcuda.so.1 ' | awk '{print $NF}')
gcc -O1 docs/gpu-runs/probes/sleeper_queue.c -o /tmp/sleeper_queue $L -lpthread && {
  for n in 0 8; do timeout 20 /tmp/sleeper_queue $n | grep "^N="; done
  CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 20 /tmp/sleeper_queue 1 | grep "^N="
}
for i in 1; do
  echo "=== H$i: host_wait 300"
  (cd /tmp && timeout 90 $B/host_wait 300 --json $LOGS/host_wait$i.json > $LOGS/host_wait$i.txt 2>&1; echo "host_wait: exit $?")
  sed -n "/host wake-up/,\$p" $LOGS/host_wait$i.txt
done
echo "=== T0: test-host_wait"
(cd /tmp && timeout 90 $B/test-host_wait --ignored --skip child_ --test-threads=1 --nocapture > $OUT/test-host_wait.txt 2>&1; echo "test-host_wait: exit $?")
grep -E "^test |test result|FAILED|panicked|seen after" $OUT/test-host_wait.txt | head -20
echo "=== T: GPU tests"
for t in second_cut; do
  (cd /tmp && timeout 90 $B/test-$t --ignored --skip child_ --test-threads=1 > $OUT/test-$t.txt 2>&1; echo "test-$t: exit $?")
  grep -E "^test result|FAILED|panicked" $OUT/test-$t.txt | head -5
done
tar -C /tmp -czf $LOGS/logs.tgz run-logs
