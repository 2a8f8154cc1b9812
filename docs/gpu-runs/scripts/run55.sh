# Run 55 (issue 31): the three-part 1080p frame with its depth part copied by
# one vkCmdCopyImage on the main queue (VK_KHR_maintenance8, depth first)
# against the same frame through a buffer, and against colour-only rings of
# the same resolution (1920x1080) and of the same bytes (1920x3240 RGBA8);
# torch checks every value. Then the multi_image tests on the GPU (direct
# path: no validation layer), and render-once copies to frame_client.
# Carry [".gl", ".gpu-run", ".gst55"].
set -u
cd "$(dirname "$0")/.."
exec > >(tee $OUT/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export XDG_RUNTIME_DIR=/tmp/d-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
B=.gst55
cat $B/BUILT
nvidia-smi -L
echo "--- copy probe (docs/gpu-runs/scripts/copy_probe.rs): each op N times in one submission, host time minus an empty one"; timeout 60 ./.gpu-run/m8probe
mkdir -p /tmp/py; cp $B/cuda_interop.abi3.so /tmp/py/; export PYTHONPATH=/tmp/py
BA=$PWD/$B; (cd /tmp && timeout 120 $BA/test-multi_image --test-threads=1 > /tmp/test-multi_image.txt 2>&1; echo "test-multi_image: exit $?")
grep -E "^test |^test result|panicked" /tmp/test-multi_image.txt | grep -vE " ok$" | head -8
n=0
one() { # CONSUMER PARTS HEIGHT LABEL EXTRA-ARGS...
  n=$((n+1)); local name=r$n c=$1 p=$2 h=$3 label=$4; shift 4
  $B/frame_server --name $name --width 1920 --height $h --slots 3 --seconds 60 --hold-timeout 30 \
     --wait-for-receivers 1 --wait-timeout 20 --with-depth --parts $p "$@" > /tmp/srv-$name.txt 2>&1 &
  local S=$!
  for _ in $(seq 100); do grep -q announced /tmp/srv-$name.txt && break; kill -0 $S 2>/dev/null || break; sleep 0.1; done
  grep -q announced /tmp/srv-$name.txt || { cat /tmp/srv-$name.txt; tar czf $OUT/logs.tgz /tmp/srv-*.txt; exit 1; }
  echo "--- $c: $p part(s) of 1920x$h, $label ($*)"
  grep -E "depth copies" /tmp/srv-$name.txt
  if [ "$c" = torch ]; then
    timeout 90 python3 $B/gpu_consumer.py --name $name --lib torch --frames 1500 --delivery lossless --timeout 20 --quiet > /tmp/torch-$name.txt 2>&1
    echo "torch status $?"; grep -E "frames,|every value" /tmp/torch-$name.txt
  else
    timeout 90 $B/frame_client --name $name --frames 1500 --no-check --lossless --timeout 20 2>&1 | tail -1
  fi
  for _ in $(seq 100); do kill -0 $S 2>/dev/null || break; sleep 0.1; done
  kill $S 2>/dev/null; wait $S 2>/dev/null
  grep -E "per frame" /tmp/srv-$name.txt
}
for round in 1 2; do
  one torch 3 1080 "depth direct, main queue"
  one torch 3 1080 "depth through a buffer, main queue" --depth-through-buffer
  one torch 3 1080 "depth through a buffer, transfer queue" --depth-through-buffer --concurrent-targets
  one torch 3 1080 "CONCURRENT targets, depth direct (main queue)" --concurrent-targets
  one torch 1 1080 "colour only, transfer queue" --concurrent-targets
  one torch 1 1080 "colour only, main queue"
  one torch 1 3240 "colour only (same bytes), transfer queue" --concurrent-targets
  one torch 1 3240 "colour only (same bytes), main queue"
done
one client 3 1080 "render once, depth direct" --render-once
one client 3 1080 "render once, through a buffer, transfer" --render-once --depth-through-buffer --concurrent-targets
one client 1 1080 "render once, colour only, transfer" --render-once --concurrent-targets
one client 1 3240 "render once, same bytes, transfer" --render-once --concurrent-targets
one client 1 3240 "render once, same bytes, main" --render-once
tar czf $OUT/logs.tgz /tmp/srv-*.txt /tmp/torch-*.txt /tmp/test-multi_image.txt 2>/dev/null
