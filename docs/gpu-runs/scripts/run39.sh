# Run 39 (issues 32, 33), at the commit in .gst/BUILT: D (the C ABI on NVIDIA: the engine-plugin
# harness at 1080p and 4K, both modes, checked by vk_recv; the C hand-off against frame_client, interleaved),
# R (the C++ CUDA-runtime receiver, new), C (two hosts with CUDA memory at both ends).
# Carry [".gl", ".gpu-run", ".gst"].
set -u
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
nvidia-smi -L; cat .gst/BUILT
echo "=== D: the C ABI on NVIDIA (prebuilt in .gst/capi: engine_host, libengine_plugin.so, vk_recv, cuda_handoff, frame_server, frame_client)"
(
export XDG_RUNTIME_DIR=/tmp/capi-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
# The validation layer is not carried.
export CUDA_INTEROP_VALIDATION=off
C=$PWD/.gst/capi
for run in "1920 1080 record" "1920 1080 submit" "1920 1080 own" "3840 2160 record" "3840 2160 submit"; do
  {
    set -- $run; W=$1; H=$2; mode=$3; N=engine-$mode-$W
    timeout 150 $C/engine_host $C/libengine_plugin.so $N $W $H 600 $mode > $OUT/engine-$mode-$W.txt 2>&1 &
    E=$!
    timeout 150 $C/vk_recv $N 600 $W $H 0 0 $((H / 2)) 4 > $OUT/vkrecv-$mode-$W.txt 2>&1; R=$?
    wait $E; EC=$?
    echo "engine $mode ${W}x$H: engine exit $EC, receiver exit $R"
    grep -E "device|publishing|presented|frames rendered|FAIL|error" $OUT/engine-$mode-$W.txt | head -6
    grep -E "checked|wrong|fail" $OUT/vkrecv-$mode-$W.txt | tail -3
  }
done
echo "--- hand-off, C ABI (cuda_handoff) vs Rust (frame_client --no-check), 1080p RGBA8 buffer ring, 6 slots, lossless, 3000 frames, interleaved"
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
echo "=== R: a C++ receiver on the CUDA runtime API (runtime_recv.cu, built here by nvcc against the header and the staticlib)"
(
export XDG_RUNTIME_DIR=/tmp/rt-xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
export CUDA_INTEROP_VALIDATION=off
C=$PWD/.gst/capi; R=/tmp/rt; mkdir -p $R
NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
echo "nvcc: $NVCC"; $NVCC --version | tail -2
xz -dc .gst/rt/libcuda_interop.a.xz > $R/libcuda_interop.a
$NVCC -std=c++17 -O2 -I .gst/rt .gst/rt/runtime_recv.cu $R/libcuda_interop.a \
  -Xlinker --no-as-needed -lpthread -ldl -lm -lrt -lutil -o $R/runtime_recv 2>&1 | tail -20
ls -la $R/runtime_recv || exit 0
for ring in "buffer" "image rgba8"; do
  set -- $ring; N=rt-$1
  $C/frame_server --name $N --width 1920 --height 1080 --slots 4 --seconds 60 ${2:+--image $2} > $OUT/srv-$N.txt 2>&1 &
  S=$!
  timeout 90 $R/runtime_recv $N 300 > $OUT/runtime-$1.txt 2>&1; echo "runtime_recv $1 ring: exit $?"
  kill $S 2>/dev/null; wait $S 2>/dev/null
  tail -4 $OUT/runtime-$1.txt
done
)
echo "=== C: two hosts, CUDA memory at both ends (GStreamer 1.22 + nvcodec)"
(
G=$PWD/.gst/root
# Part A unpacked these; again only if it did not.
[ -x $G/usr/bin/gst-launch-1.0 ] || for f in .gst/*.deb; do dpkg -x "$f" $G; done
N=$PWD/.gst/nvcodec
if [ ! -e $N/libgstnvcodec.so ]; then
  mkdir -p $N
  cp /tmp/pbad/x/usr/lib/x86_64-linux-gnu/gstreamer-1.0/libgstnvcodec.so $N/ 2>/dev/null \
    || echo "NO $N/libgstnvcodec.so (carry .gst/nvcodec)"
fi
ls -la $N
# nvcodec registers cudaupload and cudadownload only where it loads
# libcuda.so.1 and NVDEC or NVENC (libnvcuvid.so.1, libnvidia-encode.so.1).
NV=""
for l in libcuda.so.1 libnvcuvid.so.1 libnvidia-encode.so.1; do
  p=$(ldconfig -p | awk -v n=$l '$1 == n { print $NF; exit }')
  where="ldconfig"
  if [ -z "$p" ]; then
    p=$(find /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/lib64 -maxdepth 3 -name "$l" 2>/dev/null | head -1)
    where="found"
    [ -n "$p" ] && NV="$NV:$(dirname $p)"
  fi
  echo "$l: ${p:-MISSING} ${p:+($where)}"
done
export LD_LIBRARY_PATH=$G/usr/lib/x86_64-linux-gnu:$G/lib/x86_64-linux-gnu:$G/extra$NV
export GST_PLUGIN_SYSTEM_PATH=$G/usr/lib/x86_64-linux-gnu/gstreamer-1.0
export GST_PLUGIN_SCANNER=$G/usr/lib/x86_64-linux-gnu/gstreamer1.0/gstreamer-1.0/gst-plugin-scanner
export GST_PLUGIN_PATH=$PWD/.gst/plugin:$N GST_REGISTRY=/tmp/gst-registry-nvcodec.bin
rm -f $GST_REGISTRY
export PATH=$G/usr/bin:$PATH
export XDG_RUNTIME_DIR=/tmp/gst-xdg-c; mkdir -p -m 700 $XDG_RUNTIME_DIR
echo "gst-launch-1.0: $(command -v gst-launch-1.0)"; gst-inspect-1.0 --version | head -2
echo "ip: $(command -v ip || echo 'none: the test runs on loopback')"
for e in rtpvrawpay rtpvrawdepay rtpstreampay rtpstreamdepay tcpclientsink tcpserversrc cudainteropsrc cudainteropsink; do
  gst-inspect-1.0 $e > /dev/null 2>&1 && echo "$e: yes" || echo "$e: MISSING"
done
I=$OUT/nvcodec-inspect.txt
{ echo "--- gst-inspect-1.0 nvcodec"; gst-inspect-1.0 nvcodec 2>&1
  for e in cudaupload cudadownload; do echo "--- gst-inspect-1.0 $e"; gst-inspect-1.0 $e 2>&1; done
  echo "--- nvcodec's plugin_init, in process (GST_DEBUG=nvcodec:5)"
  GST_REGISTRY=/tmp/gst-registry-nvcodec-probe.bin GST_REGISTRY_FORK=no GST_DEBUG=nvcodec:5 \
    gst-inspect-1.0 nvcodec 2>&1 | grep -iE "nvcodec|cuda|nvenc|nvdec|load" | head -40
} > $I 2>&1
echo "--- gst-inspect-1.0 nvcodec, cudaupload, cudadownload (trimmed; whole in nvcodec-inspect.txt)"
grep -E "^---|Filename|^  Version|Binary package|No such|Failed|^  [a-z0-9]+: |template:|memory:|Long-name" $I | head -60
# The test finds the plugin beside its own binary (plugin_dir()).
cp .gst/plugin/libgstcudainterop.so .gst/libgstcudainterop.so
timeout 300 .gst/test-two_hosts --ignored raw_rtp_in_cuda_memory --nocapture --test-threads=1 > $OUT/two-hosts-cuda.txt 2>&1
echo "two_hosts CUDA memory test (1.22 + nvcodec): exit $?"
grep -E "^test |test result|panicked|^two hosts|LOOPBACK|RTP raw|^baseline|chose on|host [AB]: gst-launch|RESULT|ERROR|WARNING|rror:|negotiat|stopped: |checker failed|no cuda|no [a-z]+ element|exited first" $OUT/two-hosts-cuda.txt | grep -v "^\[host A sender\] frame " | head -80
)
