# Run 67 (issue 30), the test binary of the commit in .gst67/BUILT: the GPU
# case of host_wait after its assertions stopped timing how soon waits
# return (a 2 s hang margin; a 1 s kernel for the negative fd look).
# Carry [".gl", ".gst67"].
set -u
cd "$(dirname "$0")/../../.."
LOGS=$OUT
exec > >(tee $LOGS/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
nvidia-smi -L; cat .gst67/BUILT
B=$PWD/.gst67; (cd /tmp && timeout 60 $B/test-host_wait --ignored --skip child_ --test-threads=1 --nocapture; echo "test-host_wait: exit $?")
