# Run 47 (issue 31, diagnosis 2): the sender's present time by part count
# (1, 2, 3), rendering every frame or once (--render-once), the present's
# copies on the main or the transfer queue (--concurrent-targets); the
# consumer is frame_client --no-check (the sender is the limit: run 46).
# Carry [".gl", ".gpu-run", ".gst47"].
set -u
cd "$(dirname "$0")/.."
exec > >(tee $OUT/summary.txt) 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CUDA_INTEROP_VALIDATION=off
export XDG_RUNTIME_DIR=/tmp/d-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
B=.gst47
cat $B/BUILT
nvidia-smi -L
which nsys ncu 2>&1 | head -2
n=0
one() { # PARTS RENDER QUEUE
  n=$((n+1)); local name=r$n
  local args="--with-depth --parts $1"
  [ "$2" = once ] && args="$args --render-once"
  [ "$3" = transfer ] && args="$args --concurrent-targets"
  $B/frame_server --name $name --width 1920 --height 1080 --slots 3 --seconds 60 --hold-timeout 30 \
     --wait-for-receivers 1 --wait-timeout 20 $args > /tmp/srv-$name.txt 2>&1 &
  local S=$!
  for _ in $(seq 100); do grep -q announced /tmp/srv-$name.txt && break; kill -0 $S 2>/dev/null || break; sleep 0.1; done
  grep -q announced /tmp/srv-$name.txt || { cat /tmp/srv-$name.txt; tar czf $OUT/logs.tgz /tmp/srv-*.txt; exit 1; }
  printf -- "--- %s part(s), render %s, copies on %s: " $1 $2 $3
  timeout 90 $B/frame_client --name $name --frames 1500 --no-check --lossless --timeout 20 2>&1 | tail -1 | sed -n 's/.*, \([0-9.]* frames\/s\).*hand-off.*median \([0-9.]* us\) p99.*/\1, hand-off \2/p'
  for _ in $(seq 100); do kill -0 $S 2>/dev/null || break; sleep 0.1; done
  kill $S 2>/dev/null; wait $S 2>/dev/null
  grep -E "per frame" /tmp/srv-$name.txt
}
for q in main transfer; do
  for r in each once; do
    for p in 1 2 3; do one $p $r $q; done
  done
done
tar czf $OUT/logs.tgz /tmp/srv-*.txt 2>/dev/null
