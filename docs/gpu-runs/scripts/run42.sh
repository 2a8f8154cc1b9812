# Run 42 (issues 30, 33), at the commit in .gst42/BUILT:
#  R: runtime_recv.cu again (image rings through ci_cuda_receiver_wait_produced: no pitched copy);
#  D: the doctor (its MPS section);
#  F: bench --drift-only --cycles 50000 (issue 30 item 6);
#  B: the full bench (S1-S4, S6-S9 with MPS, drift, the S3 consumer-alone rows), --json;
#  W: host_wait 300 --json.
# Carry [".gl", ".gpu-run", ".gst42"].
set -u
cd "$(dirname "$0")/.."
LOGS=$OUT; OUT=/tmp/run-logs; mkdir -p $OUT
exec > >(tee $LOGS/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export BENCH_MPS_CONTROL=/usr/local/nvidia/bin/nvidia-cuda-mps-control
export PATH=$PATH:/usr/local/nvidia/bin
nvidia-smi -L; cat .gst42/BUILT
B=$PWD/.gst42/bin
echo "=== R: runtime_recv.cu (nvcc here)"
(
export XDG_RUNTIME_DIR=/tmp/rt-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
R=/tmp/rt; mkdir -p $R
NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
xz -dc .gst42/rt/libcuda_interop.a.xz > $R/libcuda_interop.a
$NVCC -std=c++17 -O2 -I .gst42/rt .gst42/rt/runtime_recv.cu $R/libcuda_interop.a \
  -Xlinker --no-as-needed -lpthread -ldl -lm -lrt -lutil -o $R/runtime_recv 2>&1 | tail -20
for ring in "buffer" "image rgba8"; do
  set -- $ring; N=rt-$1
  $B/frame_server --name $N --width 1920 --height 1080 --slots 4 --seconds 60 ${2:+--image $2} > $OUT/srv-$N.txt 2>&1 &
  S=$!
  timeout 90 $R/runtime_recv $N 300 > $OUT/runtime-$1.txt 2>&1; echo "runtime_recv $1 ring: exit $?"
  kill $S 2>/dev/null; wait $S 2>/dev/null
  tail -3 $OUT/runtime-$1.txt
done
)
echo "=== D: the doctor"
timeout 120 $B/cuda-interop-doctor > $LOGS/doctor.txt 2>&1; echo "doctor: exit $?"
grep -iE "verdict|mps|receivers|switch" $LOGS/doctor.txt | head -20
echo "=== F: bench --drift-only --cycles 50000"
(cd /tmp && timeout 240 $B/bench --drift-only --cycles 50000 --json $LOGS/drift.json > $LOGS/drift.txt 2>&1; echo "drift: exit $?")
grep -E "^Drift|^note: Drift" $LOGS/drift.txt | head -20
echo "=== B: bench --json"
(cd /tmp && timeout 330 $B/bench --json $LOGS/bench.json > $LOGS/bench.txt 2>&1; echo "bench: exit $?")
grep -E "missed|met|^bench" $LOGS/bench.txt | grep -E "^S3.*(4K|8K)|^S6|^S9|^Drift|^bench" | head -60
echo "=== W: host_wait 300 --json"
(cd /tmp && timeout 200 $B/host_wait 300 --json $LOGS/host_wait.json > $LOGS/host_wait.txt 2>&1; echo "host_wait: exit $?")
tail -15 $LOGS/host_wait.txt
