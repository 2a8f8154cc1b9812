# Run 43 (issue 31 item 4), at the commit in .gst43/BUILT: multi_image.sh
# (colour-only vs colour + depth + segmentation to torch, the 95% goal;
# frame_client and vulkan_client of --with-depth; the multi_image tests).
# Carry [".gl", ".gpu-run", ".gst43"].
set -u
cd "$(dirname "$0")/.."
LOGS=$OUT; OUT=/tmp/run-logs; mkdir -p $OUT
exec > >(tee $LOGS/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
cat .gst43/BUILT
DEMO_DIR=.gst43/multi-image OUT=$OUT timeout 560 bash .gpu-run/multi_image.sh; echo "multi_image.sh: exit $?"
tar -C /tmp -czf $LOGS/logs.tgz run-logs
