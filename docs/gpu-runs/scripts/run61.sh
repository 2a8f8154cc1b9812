# Run 61 (issue 30): the GPU cases (--ignored, without the child entry
# points) of semaphore, drop_order, host_wait, async_waits and copy, built
# from the commit in .gst61/BUILT (the second review's fixes of the
# device-wide check).
# Carry [".gl", ".gst61"].
set -u
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
nvidia-smi -L; cat .gst61/BUILT
B=$PWD/.gst61
for t in semaphore drop_order host_wait async_waits copy; do
  (cd /tmp && timeout 90 $B/test-$t --ignored --skip child_ --test-threads=1 > $OUT/test-$t.txt 2>&1; echo "test-$t: exit $?")
  grep -E "^test .*(ok|FAILED)$|^test result|panicked" $OUT/test-$t.txt | head -14
done
