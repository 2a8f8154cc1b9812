# Run 41 (issues 33, 30), at the commit in .gst41/BUILT (after c6a8e31: a
# foreign primary-context stream takes the semaphore calls itself; the GL
# receiver's GPU-side wait merged):
#  H: the C ABI's hand-off (cuda_handoff, spinning on cuStreamQuery) against
#     frame_client's, interleaved, 3 rounds;
#  R: the C++ CUDA-runtime receiver (cudaStream_t through the new direct path);
#  P: gpu_demo.sh (torch and CuPy consumers on raw streams, the Rust one,
#     a SIGKILLed torch consumer);
#  G: gl_wait.sh (the OpenGL receiver's GPU-side wait on NVIDIA's EGL).
# Carry [".gl", ".gpu-run", ".gst41"].
set -u
cd "$(dirname "$0")/.."
LOGS=$OUT; OUT=/tmp/run-logs; mkdir -p $OUT
exec > >(tee $LOGS/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
nvidia-smi -L; cat .gst41/BUILT
C=$PWD/.gst41/capi
echo "=== H: hand-off, C ABI (cuda_handoff) vs Rust (frame_client --no-check), 1080p RGBA8 buffer ring, 6 slots, lossless, 3000 frames, interleaved"
(
export XDG_RUNTIME_DIR=/tmp/capi-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
for round in 1 2 3; do
  for who in rust c; do
    N=ho-$round-$who
    $C/frame_server --name $N --width 1920 --height 1080 --slots 6 --seconds 60 > $OUT/srv-$N.txt 2>&1 &
    S=$!
    if [ $who = rust ]; then
      line=$(timeout 60 $C/frame_client --name $N --frames 3000 --no-check 2>&1 | grep -oE 'hand-off \([^)]*\) median [0-9.]* us p99 [0-9.]* us')
    else
      line=$(timeout 60 $C/cuda_handoff $N 3000 2>&1 | grep -oE 'hand-off \([^)]*\) median [0-9.]* us p99 [0-9.]* us over [0-9]* frames|cannot.*|.*->.*')
    fi
    kill $S 2>/dev/null; wait $S 2>/dev/null
    echo "HANDOFF round $round $who: ${line:-NO RESULT}"
    [ -n "$line" ] || tail -3 $OUT/srv-$N.txt
  done
done
)
echo "=== R: the C++ CUDA-runtime receiver (runtime_recv.cu, nvcc here)"
(
export XDG_RUNTIME_DIR=/tmp/rt-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
R=/tmp/rt; mkdir -p $R
NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
xz -dc .gst41/rt/libcuda_interop.a.xz > $R/libcuda_interop.a
$NVCC -std=c++17 -O2 -I .gst41/rt .gst41/rt/runtime_recv.cu $R/libcuda_interop.a \
  -Xlinker --no-as-needed -lpthread -ldl -lm -lrt -lutil -o $R/runtime_recv 2>&1 | tail -20
for ring in "buffer" "image rgba8"; do
  set -- $ring; N=rt-$1
  $C/frame_server --name $N --width 1920 --height 1080 --slots 4 --seconds 60 ${2:+--image $2} > $OUT/srv-$N.txt 2>&1 &
  S=$!
  timeout 90 $R/runtime_recv $N 300 > $OUT/runtime-$1.txt 2>&1; echo "runtime_recv $1 ring: exit $?"
  kill $S 2>/dev/null; wait $S 2>/dev/null
  tail -3 $OUT/runtime-$1.txt
done
)
echo "=== P: gpu_demo.sh (torch, CuPy, Rust, a SIGKILLed torch consumer)"
(
export XDG_RUNTIME_DIR=/tmp/py-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
DEMO_DIR=$PWD/.gst41/demo timeout 300 bash .gst41/demo/gpu_demo.sh > $OUT/gpu-demo.txt 2>&1; echo "gpu_demo.sh: exit $?"
tail -25 $OUT/gpu-demo.txt
)
echo "=== G: gl_wait.sh"
OUT=$OUT timeout 400 bash .gpu-run/gl_wait.sh .gst41/gl/test-gl_receiver .gst41/gl/test-gl_unit; echo "gl_wait.sh: exit $?"
tar -C /tmp -czf $LOGS/logs.tgz run-logs
