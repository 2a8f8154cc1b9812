#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-bundle.sh
# built .gpu/ and .gl/ here and both were carried there.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_LAYER_PATH=$PWD/.gpu/vvl
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
b=.gpu/bundle
out=${OUT:-/tmp}
status=0
run() { echo; echo "=== $*"; "$@" || status=1; }
nvidia-smi -L
nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.mem,mig.mode.current --format=csv
run $b/driver_info
run $b/test-vulkan --test-threads=1 --skip child_
run $b/test-gpu --ignored --skip child_ --test-threads=1
run $b/round_trip 120 --bench
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
run $b/round_trip 30 --device "$uuid"
echo; echo "=== CUDA_VISIBLE_DEVICES= (CUDA hides the GPU; pairing must report it, not pick another)"
CUDA_VISIBLE_DEVICES= $b/round_trip 5 || status=1
run $b/host_wait 300
echo; echo "gpu-run: $([ $status = 0 ] && echo all passed || echo FAILURES)"
exit $status
