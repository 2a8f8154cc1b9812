# Run 60 (issue 30): run 59's binaries (.gst59, 8ac3c33) again, the whole
# bench and host_wait only: a second sample of S6 at one entry (1.45x in
# run 59, against 1.5x) and of the host wait.
# Carry [".gl", ".gst59"].
set -u
cd "$(dirname "$0")/../../.."
LOGS=$OUT
exec > >(tee $LOGS/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export BENCH_MPS_CONTROL=/usr/local/nvidia/bin/nvidia-cuda-mps-control
export PATH=$PATH:/usr/local/nvidia/bin
export XDG_RUNTIME_DIR=/tmp/d-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
nvidia-smi -L; cat .gst59/BUILT
B=$PWD/.gst59
(cd /tmp && timeout 200 $B/bench --json $LOGS/bench.json > $LOGS/bench.txt 2>&1; echo "bench: exit $?")
grep -E "^S6" $LOGS/bench.txt
(cd /tmp && timeout 60 $B/host_wait 300 --json $LOGS/host_wait.json > $LOGS/host_wait.txt 2>&1; echo "host_wait: exit $?")
tail -7 $LOGS/host_wait.txt
