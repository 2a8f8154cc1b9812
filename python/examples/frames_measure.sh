#!/usr/bin/env bash
# Measurements of the frame library on a GPU (NEEDS A GPU), each step bounded:
# a named sender (frame_server, fills on the transfer queue) and Rust CUDA
# receivers (frame_client) in other processes, at 1080p and 4K RGBA8:
#   1. discovery by name (frame_client --list)
#   2. one latest receiver, 3000 frames, hand-off only (--no-check)
#   3. one latest receiver, 600 frames checked on the GPU; one lossless
#   4. a slow receiver (holds each frame 500 ms) beside a fast one
#   5. four receivers at once; then (issue 30) the same four again with a
#      private CUDA MPS daemon running (nvidia-cuda-mps-control -d, its pipe
#      and log folders in this run's temporary folder; stopped after), and a
#      "FOUR RECEIVERS" line with each one's hand-off median in both and one
#      receiver's. MPS unavailable: "MPS: NOT RUN (why)", not a failure.
# then image rings (OPTIMAL RGBA8 at 4K, RGBA16F at 1080p) to CUDA receivers
# that check every row, latest and lossless; then (issue 31) RGBA8, NV12 and
# P010 buffer rings at 4K in turn, each one's hand-off and a checked run
# (both planes), and a "PLANAR" line with the NV12/RGBA8 hand-off ratio.
# frame_client prints frames/s, dropped frames and the hand-off (frame packet
# -> CUDA stream waited) median and p99; frame_server prints its frames/s,
# skipped frames and back-pressure timeouts every 5 s.
#
#   DEMO_DIR=/path/with/binaries bash frames_measure.sh
# (`cargo xtask wheel` makes that folder: target/gpu-demo.)
set -u
D=${DEMO_DIR:-$(cd "$(dirname "$0")" && pwd)}
export XDG_RUNTIME_DIR
XDG_RUNTIME_DIR=$(mktemp -d)
chmod 700 "$XDG_RUNTIME_DIR"
FAILED=0
SERVER=
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null
  sleep 0.5
  [ -n "$SERVER" ] && kill -9 "$SERVER" 2>/dev/null
  rm -rf "$XDG_RUNTIME_DIR"
}
trap 'mps_stop; cleanup' EXIT
# CUDA MPS (issue 30): MPS_CONTROL, else PATH, else /usr/local/nvidia/bin.
MPS_CONTROL=${MPS_CONTROL:-$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)}
MPS_WHY=
mps_start() { # sets MPS_WHY and returns 1 when MPS cannot run
  if [ ! -x "$MPS_CONTROL" ]; then MPS_WHY="no nvidia-cuda-mps-control (PATH, /usr/local/nvidia/bin; MPS_CONTROL=PATH)"; return 1; fi
  export CUDA_MPS_PIPE_DIRECTORY=$XDG_RUNTIME_DIR/mps-pipe CUDA_MPS_LOG_DIRECTORY=$XDG_RUNTIME_DIR/mps-log
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
  echo "MPS: daemon stopped; its log:"; tail -n 5 "$CUDA_MPS_LOG_DIRECTORY"/control.log 2>/dev/null
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
median() { sed -n 's/.*hand-off ([^)]*) median \([0-9.]*\) us.*/\1/p' "$1" | tail -n 1; }
check() { # name status
  if [ "$2" -eq 0 ]; then echo "PASS: $1"; else echo "FAIL: $1 (status $2)"; FAILED=1; fi
}
client() { timeout 90 "$D/frame_client" --name cam "$@" 2>&1 | tee "$XDG_RUNTIME_DIR/client.log" | tail -n 2; return "${PIPESTATUS[0]}"; }
four() { # label: four receivers at once, 3000 frames each
  local i pids=()
  for i in 1 2 3 4; do
    timeout 90 "$D/frame_client" --name cam --frames 3000 --no-check >"$XDG_RUNTIME_DIR/four-$1-$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 1 2 3 4; do
    wait "${pids[$((i - 1))]}"
    check "receiver $i of 4, $1 ($W)" $?
    tail -n 1 "$XDG_RUNTIME_DIR/four-$1-$i.log"
  done
}
medians() { local i; for i in 1 2 3 4; do printf '%s ' "$(median "$XDG_RUNTIME_DIR/four-$1-$i.log")"; done; }

pass() { # width height
  echo
  echo "##### $1x$2 RGBA8"
  LOG=$XDG_RUNTIME_DIR/server-$1.log
  "$D/frame_server" --name cam --width "$1" --height "$2" --slots 6 --seconds 150 \
    --hold-timeout 5 >"$LOG" 2>&1 &
  SERVER=$!
  for _ in $(seq 100); do "$D/frame_client" --list 2>/dev/null | grep -q '^cam:' && break; sleep 0.1; done
  echo "=== 1. frame_client --list"
  timeout 10 "$D/frame_client" --list
  check "discovery by name ($1x$2)" $?
  W=$1x$2
  echo "=== 2. one latest receiver, 3000 frames, hand-off only"
  client --frames 3000 --no-check
  check "latest, hand-off ($1x$2)" $?
  ONE=$(median "$XDG_RUNTIME_DIR/client.log")
  echo "=== 3. 600 frames checked on the GPU, latest; then lossless"
  client --frames 600
  check "latest, checked ($1x$2)" $?
  client --frames 600 --lossless
  check "lossless, checked ($1x$2)" $?
  echo "=== 4. a slow receiver (500 ms per frame) beside a fast one"
  timeout 90 "$D/frame_client" --name cam --frames 8 --hold-ms 500 >"$XDG_RUNTIME_DIR/slow.log" 2>&1 &
  SLOW=$!
  sleep 0.5
  client --frames 3000 --no-check
  check "fast receiver beside a slow one ($1x$2)" $?
  wait "$SLOW"
  check "slow receiver ($1x$2)" $?
  tail -n 2 "$XDG_RUNTIME_DIR/slow.log"
  echo "=== 5. four receivers at once, 3000 frames each, without MPS"
  four no-mps
  echo "=== 5b. the same four receivers with CUDA MPS running"
  local with="MPS: NOT RUN"
  if mps_start; then
    four mps
    with="with MPS (us): $(medians mps)"
    mps_stop
  else
    echo "MPS: NOT RUN ($MPS_WHY)"
    with="MPS: NOT RUN ($MPS_WHY)"
  fi
  echo "FOUR RECEIVERS ($1x$2): hand-off medians, one receiver alone: ${ONE:-?} us; four without MPS (us): $(medians no-mps); four $with"

  echo "=== sender log"
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null
  SERVER=
  grep -v '^$' "$LOG" | tail -n 25
}

image_pass() { # format width height
  echo
  echo "##### image ring, $1, $2x$3"
  LOG=$XDG_RUNTIME_DIR/server-image-$1.log
  "$D/frame_server" --name cam --image --image-format "$1" --width "$2" --height "$3" \
    --slots 4 --seconds 60 --hold-timeout 5 >"$LOG" 2>&1 &
  SERVER=$!
  for _ in $(seq 100); do "$D/frame_client" --list 2>/dev/null | grep -q '^cam:' && break; sleep 0.1; done
  echo "=== 300 frames, every row checked, latest; then lossless"
  client --frames 300
  check "image ring $1 $2x$3, latest, checked" $?
  client --frames 300 --lossless
  check "image ring $1 $2x$3, lossless, checked" $?
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null
  SERVER=
  grep -v '^$' "$LOG" | tail -n 5
}

planar_pass() { # width height: issue 31's goal, an NV12 frame's hand-off within
  # 10% of an RGBA8 frame's of the same size: RGBA8, NV12 and P010 buffer
  # rings in turn, 3000 frames each unchecked, then 300 checked (both planes)
  echo
  echo "##### planar buffer rings against RGBA8, $1x$2"
  local f
  for f in rgba8 nv12 p010; do
    LOG=$XDG_RUNTIME_DIR/server-planar-$f.log
    "$D/frame_server" --name cam --format "$f" --width "$1" --height "$2" \
      --slots 6 --seconds 60 --hold-timeout 5 >"$LOG" 2>&1 &
    SERVER=$!
    for _ in $(seq 100); do "$D/frame_client" --list 2>/dev/null | grep -q '^cam:' && break; sleep 0.1; done
    client --frames 3000 --no-check --lossless
    check "$f $1x$2, hand-off" $?
    cp "$XDG_RUNTIME_DIR/client.log" "$XDG_RUNTIME_DIR/planar-$f.log"
    client --frames 300 --lossless
    check "$f $1x$2, checked (every plane)" $?
    kill "$SERVER"
    wait "$SERVER" 2>/dev/null
    SERVER=
  done
  local base nv12 p010
  base=$(median "$XDG_RUNTIME_DIR/planar-rgba8.log")
  nv12=$(median "$XDG_RUNTIME_DIR/planar-nv12.log")
  p010=$(median "$XDG_RUNTIME_DIR/planar-p010.log")
  echo "PLANAR ($1x$2): hand-off medians, RGBA8 $base us, NV12 $nv12 us, P010 $p010 us;" \
    "NV12/RGBA8 $(awk -v a="$nv12" -v b="$base" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }')x" \
    "(goal <= 1.10x)"
}

[ -f "$D/BUILD" ] && { echo "=== built from:"; cat "$D/BUILD"; }
pass 1920 1080
pass 3840 2160
image_pass rgba8 3840 2160
image_pass rgba16f 1920 1080
planar_pass 3840 2160
echo
if [ "$FAILED" -eq 0 ]; then echo "FRAMES MEASURE: ALL PASSED"; else echo "FRAMES MEASURE: FAILED"; fi
exit "$FAILED"
