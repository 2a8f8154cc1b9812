# Run 46 (issue 31, diagnosis): where the three-part ring's frame time goes.
# Matrix: parts (1: --color-part-only, 3) x the present's copies (main queue;
# transfer queue: --concurrent-targets) x consumer (torch checking every
# value; frame_client --no-check, the Rust CUDA receiver's hand-off alone).
# The sender prints its per-frame split (waiting for a slot / presenting),
# torch its host time (in next() / enqueueing the check).
# Carry [".gl", ".gpu-run", ".gst46"].
set -u
cd "$(dirname "$0")/.."
exec > >(tee $OUT/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export XDG_RUNTIME_DIR=/tmp/d-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
B=.gst46
cat $B/BUILT
nvidia-smi -L
mkdir -p /tmp/py; cp $B/cuda_interop.abi3.so /tmp/py/; export PYTHONPATH=/tmp/py
n=0
one() { # CONSUMER PARTS QUEUE
  n=$((n+1)); local name=r$n
  local args="--with-depth"
  [ "$2" = 1 ] && args="$args --color-part-only"
  [ "$3" = transfer ] && args="$args --concurrent-targets"
  $B/frame_server --name $name --width 1920 --height 1080 --slots 3 --seconds 60 --hold-timeout 30 \
     --wait-for-receivers 1 --wait-timeout 20 $args > /tmp/srv-$name.txt 2>&1 &
  local S=$!
  for _ in $(seq 100); do grep -q announced /tmp/srv-$name.txt && break; kill -0 $S 2>/dev/null || break; sleep 0.1; done
  grep -q announced /tmp/srv-$name.txt || { cat /tmp/srv-$name.txt; tar czf $OUT/logs.tgz /tmp/srv-*.txt; exit 1; }
  echo "--- $1, $2 part(s), copies on $3 queue"
  if [ "$1" = torch ]; then
    timeout 90 python3 $B/gpu_consumer.py --name $name --lib torch --frames 1500 --delivery lossless --timeout 20 --quiet 2>&1 | grep -E "frames,|host time"
  else
    timeout 90 $B/frame_client --name $name --frames 1500 --no-check --lossless --timeout 20 2>&1 | tail -1
  fi
  for _ in $(seq 100); do kill -0 $S 2>/dev/null || break; sleep 0.1; done
  kill $S 2>/dev/null; wait $S 2>/dev/null
  grep -E "done:|per frame" /tmp/srv-$name.txt
}
for round in 1 2; do
  for c in client torch; do
    for q in main transfer; do
      for p in 1 3; do one $c $p $q; done
    done
  done
done
tar czf $OUT/logs.tgz /tmp/srv-*.txt 2>/dev/null
