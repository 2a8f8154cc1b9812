# Run 48 (issue 31): the three-part 1080p frame against colour-only rings
# through the same renderer and copies: of the same resolution (1920x1080,
# one part) and of the same bytes (1920x3240 RGBA8, one part: 24.9 MB, as
# colour + depth + segmentation at 1080p). Torch checks every value; the
# present's copies on the main queue and on the transfer queue.
# Carry [".gl", ".gpu-run", ".gst47"] (frame_server and frame_client of
# 1581527) and .gst46's Python module and consumer.
set -u
cd "$(dirname "$0")/.."
exec > >(tee $OUT/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export XDG_RUNTIME_DIR=/tmp/d-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
B=.gst47
cat $B/BUILT .gst46/BUILT
nvidia-smi -L
mkdir -p /tmp/py; cp .gst46/cuda_interop.abi3.so /tmp/py/; export PYTHONPATH=/tmp/py
n=0
one() { # PARTS HEIGHT QUEUE
  n=$((n+1)); local name=r$n
  local args="--with-depth --parts $1"
  [ "$3" = transfer ] && args="$args --concurrent-targets"
  $B/frame_server --name $name --width 1920 --height $2 --slots 3 --seconds 60 --hold-timeout 30 \
     --wait-for-receivers 1 --wait-timeout 20 $args > /tmp/srv-$name.txt 2>&1 &
  local S=$!
  for _ in $(seq 100); do grep -q announced /tmp/srv-$name.txt && break; kill -0 $S 2>/dev/null || break; sleep 0.1; done
  grep -q announced /tmp/srv-$name.txt || { cat /tmp/srv-$name.txt; tar czf $OUT/logs.tgz /tmp/srv-*.txt; exit 1; }
  echo "--- $1 part(s) of 1920x$2, copies on $3 queue, torch"
  timeout 90 python3 .gst46/gpu_consumer.py --name $name --lib torch --frames 1500 --delivery lossless --timeout 20 --quiet > /tmp/torch-$name.txt 2>&1
  echo "torch status $?"; grep -E "frames,|host time|every value" /tmp/torch-$name.txt
  for _ in $(seq 100); do kill -0 $S 2>/dev/null || break; sleep 0.1; done
  kill $S 2>/dev/null; wait $S 2>/dev/null
  grep -E "per frame" /tmp/srv-$name.txt
}
for round in 1 2; do
  for q in main transfer; do
    one 3 1080 $q; one 1 1080 $q; one 1 3240 $q
  done
done
tar czf $OUT/logs.tgz /tmp/srv-*.txt /tmp/torch-*.txt 2>/dev/null
