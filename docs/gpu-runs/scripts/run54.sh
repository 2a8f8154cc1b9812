# Run 54, the test binaries of the commit in .gst54/BUILT (after the read-through refactors; as run 53: the external
# waits shared per GPU, waits in flight counted): their GPU cases
# (--ignored, without the child entry points).
# Carry [".gl", ".gpu-run", ".gst54"].
set -u
cd "$(dirname "$0")/.."
exec > >(tee $OUT/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
nvidia-smi -L; cat .gst54/BUILT
B=$PWD/.gst54
for t in semaphore drop_order host_wait async_waits image_frames second_cut; do
  (cd /tmp && timeout 100 $B/test-$t --ignored --skip child_ --test-threads=1 > /tmp/test-$t.txt 2>&1; echo "test-$t: exit $?")
  grep -E "^test |^test result|panicked" /tmp/test-$t.txt | grep -vE " ok$" | head -6
done
