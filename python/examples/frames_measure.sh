#!/usr/bin/env bash
# Measurements of the frame library on a GPU (NEEDS A GPU), each step bounded:
# a named sender (frame_server, fills on the transfer queue) and Rust CUDA
# receivers (frame_client) in other processes, at 1080p and 4K RGBA8:
#   1. discovery by name (frame_client --list)
#   2. one latest receiver, 3000 frames, hand-off only (--no-check)
#   3. one latest receiver, 600 frames checked on the GPU; one lossless
#   4. a slow receiver (holds each frame 500 ms) beside a fast one
#   5. four receivers at once
# then image rings (OPTIMAL RGBA8 at 4K, RGBA16F at 1080p) to CUDA receivers
# that check every row, latest and lossless.
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
trap cleanup EXIT
check() { # name status
  if [ "$2" -eq 0 ]; then echo "PASS: $1"; else echo "FAIL: $1 (status $2)"; FAILED=1; fi
}
client() { timeout 90 "$D/frame_client" --name cam "$@" 2>&1 | tail -n 2; return "${PIPESTATUS[0]}"; }

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
  echo "=== 2. one latest receiver, 3000 frames, hand-off only"
  client --frames 3000 --no-check
  check "latest, hand-off ($1x$2)" $?
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
  echo "=== 5. four receivers at once, 3000 frames each"
  PIDS=()
  for i in 1 2 3 4; do
    timeout 90 "$D/frame_client" --name cam --frames 3000 --no-check >"$XDG_RUNTIME_DIR/four-$i.log" 2>&1 &
    PIDS+=($!)
  done
  for i in 1 2 3 4; do
    wait "${PIDS[$((i - 1))]}"
    check "receiver $i of 4 ($1x$2)" $?
    tail -n 1 "$XDG_RUNTIME_DIR/four-$i.log"
  done
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

[ -f "$D/BUILD" ] && { echo "=== built from:"; cat "$D/BUILD"; }
pass 1920 1080
pass 3840 2160
image_pass rgba8 3840 2160
image_pass rgba16f 1920 1080
echo
if [ "$FAILED" -eq 0 ]; then echo "FRAMES MEASURE: ALL PASSED"; else echo "FRAMES MEASURE: FAILED"; fi
exit "$FAILED"
