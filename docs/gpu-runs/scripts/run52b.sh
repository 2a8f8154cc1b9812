# Run 52b: run 52's host_wait test binary was the bench's host_wait by
# mistake (a name clash in target/gpu/deps); the test's GPU cases again.
# Carry [".gl", ".gpu-run", ".gst52"].
set -u
cd "$(dirname "$0")/.."
exec > >(tee $OUT/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
nvidia-smi -L; cat .gst52/BUILT
(cd /tmp && timeout 100 $OLDPWD/.gst52/test-host_wait --ignored --skip child_ --test-threads=1 2>&1 | grep -E "^test |test result|panicked"; echo "test-host_wait: exit ${PIPESTATUS[0]}")
