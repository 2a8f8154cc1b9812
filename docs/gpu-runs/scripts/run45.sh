# Run 45 (issue 31): multiplanar.sh after the NV12 luma write refusal; multi_image.sh with the one-part baseline (--color-part-only).
# multiplanar.sh), then multi_image.sh steps 1-5 again after the
# --with-depth targets moved to device-local memory.
# Carry [".gl", ".gpu-run", ".gst45"].
set -u
cd "$(dirname "$0")/.."
LOGS=$OUT; OUT=/tmp/run-logs; mkdir -p $OUT
exec > >(tee $LOGS/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
cat .gst45/BUILT
echo "=== P: multiplanar.sh"
OUT=$OUT timeout 200 bash .gpu-run/multiplanar.sh .gst45/test-planar; echo "multiplanar.sh: exit $?"
echo "=== M: multi_image.sh"
DEMO_DIR=.gst45/multi-image OUT=$OUT timeout 300 bash .gpu-run/multi_image.sh; echo "multi_image.sh: exit $?"
tar -C /tmp -czf $LOGS/logs.tgz run-logs
