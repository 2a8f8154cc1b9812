#!/usr/bin/env bash
# The frame-sharing matrix on a GPU (NEEDS A GPU), every step under `timeout`.
#
#   DEMO_DIR=/path/with/binaries bash frames_matrix.sh [SENDER...]
#
# DEMO_DIR (default: this script's folder; `cargo xtask wheel` makes it:
# target/gpu-demo) holds renderer, frame_server, frame_client, vulkan_client,
# gpu_consumer.py and cuda_interop.abi3.so; PYTHON (default python3) has torch.
# LOGS (default: a temporary folder) keeps every process's whole output.
#
# A SENDER is one of (default: all eight, in this order)
#   image:rgba8:WxH    the `renderer` example: its own ash device wrapped by
#   image:rgba16f:WxH  Context::from_raw, its own command buffers on its
#                      transfer queue writing an OPTIMAL image ring by name
#   buffer:WxH         `frame_server`: a pitched RGBA8 buffer ring, filled
#                      on the transfer queue
#   buffer:nv12:WxH    the same with planar NV12 or P010 frames (issue 31:
#   buffer:p010:WxH    the luma plane, then the chroma plane; the checks
#                      read both)
# at 1920x1080 and 3840x2160. Each sender runs in its own process; against
# each, every receiver below runs in a process of its own, connected by name:
#   cuda     frame_client (Rust CUDA): --no-check for the hand-off (packet
#            -> CUDA stream waited for "produced"), then checked (image
#            rings: every row; buffer rings: five rows) on fewer frames
#   staging  frame_client --host-staging --no-check: the baseline, each
#            frame copied to host memory and uploaded again, same run
#   torch    gpu_consumer.py --lib torch: every frame checked on the GPU
#            (every word), ms/frame
#   vulkan   vulkan_client (Rust Vulkan, own VkDevice; image rings): every
#            pixel of every frame read back and checked
# in latest and in lossless delivery; then four receivers at once (two cuda,
# torch, and vulkan for image rings or a third cuda for buffer rings), latest
# and lossless; then the same four again with a private CUDA MPS daemon
# running (issue 30; stopped after; "MPS: NOT RUN (why)" where there is
# none, not a failure), and a "FOUR RECEIVERS:" line with the hand-off
# medians of one cuda receiver alone and of the cuda receivers of four,
# without and with MPS. Each receiver prints its frames, bad frames, dropped frames,
# frames/s and per-frame cost; each sender its frame rate every 5 s (its log
# is shown after its cells). `RATIO:` lines compare the staging baseline's
# hand-off median with the zero-copy one's of the same sender.
# PASS/FAIL per step; exit status 0 only if every step passed.
set -u
D=${DEMO_DIR:-$(cd "$(dirname "$0")" && pwd)}
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$D${PYTHONPATH:+:$PYTHONPATH}"
export XDG_RUNTIME_DIR
XDG_RUNTIME_DIR=$(mktemp -d)
chmod 700 "$XDG_RUNTIME_DIR"
LOGS=${LOGS:-$XDG_RUNTIME_DIR/logs}
mkdir -p "$LOGS"
FAILED=0
SERVER=
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null
  sleep 0.5
  [ -n "$SERVER" ] && kill -9 "$SERVER" 2>/dev/null
  rm -rf "$XDG_RUNTIME_DIR/cuda-interop-frames"
}
trap 'mps_stop; cleanup' EXIT
check() { # what status
  if [ "$2" -eq 0 ]; then echo "PASS: $1"; else echo "FAIL: $1 (status $2)"; FAILED=1; fi
}
# A receiver in the foreground: its log kept, its summary line(s) shown.
# receiver LOGNAME LINES COMMAND...
receiver() {
  local log=$LOGS/$1.log lines=$2
  shift 2
  timeout 120 "$@" >"$log" 2>&1
  local rc=$?
  grep -v '^\[torch\] [0-9]* frames$' "$log" | tail -n "$lines"
  return $rc
}
# (`timeout` runs programs, not shell functions: these are arrays.)
cuda=("$D/frame_client" --name matrix --timeout 10)
torch=("$PYTHON" "$D/gpu_consumer.py" --name matrix --lib torch --quiet --timeout 10)
vulkan=("$D/vulkan_client" --name matrix --timeout 10)
median() { sed -n 's/.*hand-off ([^)]*) median \([0-9.]*\) us.*/\1/p' "$1" | tail -n 1; }

# Four receivers at once (two cuda, torch, and vulkan for image rings or a
# third cuda for buffer rings): four TAG MODE KIND FLAG SUFFIX TITLE.
four() {
  local tag=$1 mode=$2 kind=$3 flag=$4 sfx=$5 pids=() names=() i
  echo "=== $tag, $mode: $6"
  timeout 120 "${cuda[@]}" --frames 2000 --no-check $flag >"$LOGS/$tag-four-$mode-$sfx-cuda1.log" 2>&1 &
  pids+=($!); names+=(cuda1)
  timeout 120 "${cuda[@]}" --frames 2000 --no-check $flag >"$LOGS/$tag-four-$mode-$sfx-cuda2.log" 2>&1 &
  pids+=($!); names+=(cuda2)
  timeout 120 "${torch[@]}" --frames 600 --delivery "$mode" >"$LOGS/$tag-four-$mode-$sfx-torch.log" 2>&1 &
  pids+=($!); names+=(torch)
  if [ "$kind" = image ]; then
    timeout 120 "${vulkan[@]}" --frames 60 $flag >"$LOGS/$tag-four-$mode-$sfx-vulkan.log" 2>&1 &
    pids+=($!); names+=(vulkan)
  else
    timeout 120 "${cuda[@]}" --frames 2000 --no-check $flag >"$LOGS/$tag-four-$mode-$sfx-cuda3.log" 2>&1 &
    pids+=($!); names+=(cuda3)
  fi
  for i in 0 1 2 3; do
    wait "${pids[$i]}"
    local rc=$?
    grep -v '^\[torch\] [0-9]* frames$' "$LOGS/$tag-four-$mode-$sfx-${names[$i]}.log" | grep -v 'stream rules' | tail -n 1
    check "$tag $mode, ${names[$i]} of four ($sfx)" $rc
  done
}

# CUDA MPS (issue 30): a private daemon (pipe and log folders in this run's
# temporary folder) around the second four-receiver cell; MPS_CONTROL, else
# PATH, else /usr/local/nvidia/bin. Unavailable: "MPS: NOT RUN (why)".
MPS_CONTROL=${MPS_CONTROL:-$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)}
MPS_WHY=
mps_start() {
  if [ ! -x "$MPS_CONTROL" ]; then MPS_WHY="no nvidia-cuda-mps-control (PATH, /usr/local/nvidia/bin; MPS_CONTROL=PATH)"; return 1; fi
  export CUDA_MPS_PIPE_DIRECTORY=$XDG_RUNTIME_DIR/mps-pipe CUDA_MPS_LOG_DIRECTORY=$LOGS/mps
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if ! timeout 20 "$MPS_CONTROL" -d; then
    MPS_WHY="$MPS_CONTROL -d failed"; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; return 1
  fi
  for _ in $(seq 100); do [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] && { echo "MPS: daemon started (pipe folder $CUDA_MPS_PIPE_DIRECTORY)"; return 0; }; sleep 0.1; done
  MPS_WHY="no control socket in $CUDA_MPS_PIPE_DIRECTORY after 10 s"; mps_stop; return 1
}
mps_stop() {
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || return 0
  local pid
  pid=$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" 2>/dev/null)
  echo quit | timeout 20 "$MPS_CONTROL"
  for _ in $(seq 100); do { [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; } && break; sleep 0.1; done
  echo "MPS: daemon stopped"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

cells() { # tag kind
  local tag=$1 kind=$2 mode flag
  for mode in latest lossless; do
    flag=$([ "$mode" = lossless ] && echo --lossless)
    echo "=== $tag, $mode: cuda, hand-off only (2000 frames)"
    receiver "$tag-cuda-$mode" 1 "${cuda[@]}" --frames 2000 --no-check $flag
    check "$tag $mode cuda hand-off" $?
    echo "=== $tag, $mode: cuda, checked (100 frames)"
    receiver "$tag-cuda-checked-$mode" 1 "${cuda[@]}" --frames 100 $flag
    check "$tag $mode cuda checked" $?
    echo "=== $tag, $mode: staging baseline, hand-off through host memory (300 frames)"
    receiver "$tag-staging-$mode" 1 "${cuda[@]}" --frames 300 --no-check --host-staging $flag
    check "$tag $mode staging baseline" $?
    local zero staged
    zero=$(median "$LOGS/$tag-cuda-$mode.log")
    staged=$(median "$LOGS/$tag-staging-$mode.log")
    if [ -n "$zero" ] && [ -n "$staged" ]; then
      echo "RATIO: $tag $mode: hand-off median, host staging $staged us / zero copy $zero us = $(awk -v s="$staged" -v z="$zero" 'BEGIN { printf "%.1fx", s / z }')"
    fi
    echo "=== $tag, $mode: torch, every frame checked on the GPU (600 frames)"
    receiver "$tag-torch-$mode" 2 "${torch[@]}" --frames 600 --delivery "$mode"
    check "$tag $mode torch" $?
    if [ "$kind" = image ]; then
      echo "=== $tag, $mode: vulkan (own VkDevice), every pixel (60 frames)"
      receiver "$tag-vulkan-$mode" 1 "${vulkan[@]}" --frames 60 $flag
      check "$tag $mode vulkan" $?
    fi
    four "$tag" "$mode" "$kind" "$flag" no-mps "four receivers at once"
    local one with
    one=$(median "$LOGS/$tag-cuda-$mode.log")
    if mps_start; then
      four "$tag" "$mode" "$kind" "$flag" mps "four receivers at once, CUDA MPS running"
      mps_stop
      with="with MPS: cuda1 $(median "$LOGS/$tag-four-$mode-mps-cuda1.log") us, cuda2 $(median "$LOGS/$tag-four-$mode-mps-cuda2.log") us"
    else
      echo "MPS: NOT RUN ($MPS_WHY)"
      with="MPS: NOT RUN ($MPS_WHY)"
    fi
    echo "FOUR RECEIVERS: $tag $mode: hand-off medians, one cuda receiver alone ${one:-?} us; of four without MPS: cuda1 $(median "$LOGS/$tag-four-$mode-no-mps-cuda1.log") us, cuda2 $(median "$LOGS/$tag-four-$mode-no-mps-cuda2.log") us; $with"
  done
}

sender() { # spec
  local spec=$1 kind format size w h log
  IFS=: read -r kind format size <<<"$spec"
  if [ "$kind" = buffer ] && [ -z "$size" ]; then size=$format; format=rgba8; fi
  w=${size%x*}
  h=${size#*x}
  local tag="$kind-$format-$size"
  log=$LOGS/$tag-sender.log
  echo
  echo "##### $tag"
  case $kind in
    image) "$D/renderer" --name matrix --format "$format" --width "$w" --height "$h" \
      --slots 4 --seconds 400 --hold-timeout 5 --queue transfer >"$log" 2>&1 & ;;
    buffer) "$D/frame_server" --name matrix --format "$format" --width "$w" --height "$h" \
      --slots 4 --seconds 400 --hold-timeout 5 >"$log" 2>&1 & ;;
    *) echo "FAIL: unknown sender $spec (image:FORMAT:WxH or buffer:WxH)"; FAILED=1; return ;;
  esac
  SERVER=$!
  local found=1
  for _ in $(seq 200); do
    if "$D/frame_client" --list 2>/dev/null | grep -q '^matrix:'; then found=0; break; fi
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.1
  done
  timeout 10 "$D/frame_client" --list
  check "$tag announced by name" $found
  if [ "$found" -eq 0 ]; then cells "$tag" "$kind"; fi
  kill "$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
  SERVER=
  echo "=== $tag: the sender's log (frames/s every 5 s)"
  grep -E 'frames/s|done:|FAILED' "$log" | tail -n 30
}

[ -f "$D/BUILD" ] && { echo "=== built from:"; cat "$D/BUILD"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>/dev/null
if [ $# -eq 0 ]; then
  set -- image:rgba8:1920x1080 image:rgba8:3840x2160 image:rgba16f:1920x1080 \
    image:rgba16f:3840x2160 buffer:1920x1080 buffer:3840x2160 buffer:nv12:3840x2160 \
    buffer:p010:1920x1080
fi
for spec in "$@"; do sender "$spec"; done
echo
echo "logs: $LOGS"
if [ "$FAILED" -eq 0 ]; then echo "FRAMES MATRIX: ALL PASSED"; else echo "FRAMES MATRIX: FAILED"; fi
exit "$FAILED"
