# Run 66 (issue 30, host waits), the binaries of the commit in .gst66/BUILT:
# HostWait::ADAPTIVE paces work by its last four lengths (sleeps on a timerfd
# to half a spin before the shortest, then watches to the longest). host_wait three
# times (fixed work of 20 us, 200 us, 2 ms; 2 ms / 200 us in turn; 2 ms
# +- 20 %), then the GPU cases (--ignored, without the child entry points)
# of host_wait and of seven more test binaries (semaphore without its
# validation-layer case: the layer is not carried).
# Carry [".gl", ".gst66"].
set -u
cd "$(dirname "$0")/../../.."
LOGS=$OUT; OUT=/tmp/run-logs; mkdir -p $OUT
exec > >(tee $LOGS/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export PATH=$PATH:/usr/local/nvidia/bin
export XDG_RUNTIME_DIR=/tmp/d-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
nvidia-smi -L; cat .gst66/BUILT; uname -r; cat /proc/self/timerslack_ns
B=$PWD/.gst66
for i in 1 2 3; do
  echo "=== H$i: host_wait 300"
  (cd /tmp && timeout 120 $B/host_wait 300 --json $LOGS/host_wait$i.json > $LOGS/host_wait$i.txt 2>&1; echo "host_wait: exit $?")
  sed -n "/host wake-up/,\$p" $LOGS/host_wait$i.txt
done
echo "=== T0: test-host_wait"
(cd /tmp && timeout 90 $B/test-host_wait --ignored --skip child_ --test-threads=1 --nocapture > $OUT/test-host_wait.txt 2>&1; echo "test-host_wait: exit $?")
grep -E "^test |test result|FAILED|panicked|stuck stream|after the signal|seen after" $OUT/test-host_wait.txt | head -20
echo "=== T: GPU tests"
for t in semaphore drop_order second_cut image_frames async_waits copy processes; do
  skip=child_; [ $t = semaphore ] && skip="child_ --skip a_temporary_timeline_import_is_reported"
  (cd /tmp && timeout 120 $B/test-$t --ignored --skip $skip --test-threads=1 > $OUT/test-$t.txt 2>&1; echo "test-$t: exit $?")
  grep -E "^test result|FAILED|panicked" $OUT/test-$t.txt | head -5
done
tar -C /tmp -czf $LOGS/logs.tgz run-logs
