# Run 63: host_wait three more times on the warm H100 of run 62, the same
# binaries (.gst62, built from d0af0ed), to see the spread of the CPU figures.
# Carry [".gl", ".gst62"]. (Invoked as one command line; the first branch's
# glob did not match there and the second ran each time.)
cd /tmp && for i in 3 4 5; do /work/*/.gst62/host_wait 300 --json $OUT/host_wait$i.json > $OUT/host_wait$i.txt 2>&1 || (cd - >/dev/null; .gst62/host_wait 300 --json $OUT/host_wait$i.json > $OUT/host_wait$i.txt 2>&1); grep -E "2ms  (cuEventSync|Sleep|Adaptive \(default|Block)|\[" $OUT/host_wait$i.txt; done
