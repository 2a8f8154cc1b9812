# Run 57 (issue 31): the submitted commit: multi_image and image_frames
# (device-local, no validation layer: the direct depth copies); the three-part
# 1080p frame (depth direct, main queue) against a colour-only ring of the
# same bytes on the transfer queue and one of the same resolution, torch
# checking every value, two rounds; the same three parts with
# --concurrent-targets --depth-through-buffer (now on the main queue).
# Carry [".gl", ".gpu-run", ".gst57"].
set -u
cd "$(dirname "$0")/.."
exec > >(tee $OUT/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export XDG_RUNTIME_DIR=/tmp/d-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
B=.gst57
cat $B/BUILT
nvidia-smi -L
mkdir -p /tmp/py; cp $B/cuda_interop.abi3.so /tmp/py/; export PYTHONPATH=/tmp/py
BA=$PWD/$B
for t in multi_image image_frames; do
  (cd /tmp && timeout 60 $BA/test-$t --test-threads=1 > /tmp/test-$t.txt 2>&1; echo "test-$t: exit $?")
  grep -E "^test |^test result|panicked" /tmp/test-$t.txt | grep -vE " ok$" | head -6
done
grep -E "^test depth" /tmp/test-multi_image.txt
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
  one torch 1 3240 "colour only (same bytes), transfer queue" --concurrent-targets
  one torch 1 1080 "colour only, transfer queue" --concurrent-targets
done
one torch 3 1080 "CONCURRENT targets, depth through a buffer (main queue now)" --concurrent-targets --depth-through-buffer
tar czf $OUT/logs.tgz /tmp/srv-*.txt /tmp/torch-*.txt /tmp/test-*.txt 2>/dev/null
