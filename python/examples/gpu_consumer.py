#!/usr/bin/env python3
"""A GPU consumer of `frame_server` (NEEDS A GPU): receives frames, checks each
one ON THE GPU against its frame number, and prints milliseconds per frame.

    python3 gpu_consumer.py (SOCKET | --name NAME) [--lib torch|cupy] [--frames 300]
        [--timeout 10] [--delivery lossless|latest]

torch: `torch.from_dlpack(frame)` (DLPack, the current stream made to wait for
the producer's write), `frame.release()` signals back on that stream; then two
frames on a side stream check the release rules for bare handles and stream
objects.
cupy: `cupy.asarray(frame)` (`__cuda_array_interface__`), `frame.release(stream=
the current CuPy stream)`.

The frame pattern (cuda-interop-frames/src/protocol.rs): every 32-bit word of a
frame, read as a little-endian u32, is the frame number, except in a band of
height // 16 rows starting at row (8 * frame) % (height - rows + 1), where it
is its bitwise NOT. Buffer rings give (height, width, 4) uint8 tensors with
pitched rows; image rings (height, width, channels) tensors of the channel
type (uint8 for RGBA8, float16 for RGBA16F), whose words are the same pattern
bit for bit: the check views every frame as int32 words.
A multi-image ring (`frame_server --with-depth`, torch only): each frame is
`frame.tensors(stream)`, a dict of colour (uint8 RGBA), depth (float32) and
segmentation (uint32) tensors of one frame; every value of every part is
checked against its part's words (`part_words`, as `demo::part_words` has
them: the colour's are the pattern above, the depth's the float bits of
k/4096 and (2k+1)/8192 for k = frame % 4096, the labels' frame << 8 | 1 and
| 2), so a part of another frame counts as bad.
Bad frames are counted on the GPU and read once at the end; the exit status is
non-zero if any frame was bad or not all frames came.
"""

import argparse
import gc
import struct
import sys
import time
import weakref

import cuda_interop


def s32(x):
    """A u32 pixel value as the int32 torch and CuPy compare with."""
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


# The ring's frame height, once connected: a planar ring's tensor has more
# rows than the frame (the chroma plane's follow the luma plane's), and the
# band lies in the luma plane.
GEOMETRY = {"height": None}


def float_bits(x):
    """The bits of `x` as a 32-bit float, as a u32."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


def part_words(part, frame):
    """(background, band) words of part `part` of frame `frame` of a
    `--with-depth` ring (cuda-interop-frames/examples/common/demo.rs)."""
    if part == 0:
        return frame, ~frame
    if part == 1:
        k = frame % 4096
        return float_bits(k / 4096.0), float_bits((2 * k + 1) / 8192.0)
    return (frame << 8) | 1, (frame << 8) | 2


def band_rows(frame, height):
    rows = max(height // 16, 1)
    start = (frame * 8) % (height - rows + 1)
    return start, start + rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket", nargs="?", help="the sender's socket path (or --name)")
    ap.add_argument("--name", help="the sender's name in $XDG_RUNTIME_DIR's directory")
    ap.add_argument("--lib", choices=("torch", "cupy"), default="torch")
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--quiet", action="store_true")
    # Lossless by default here: the demo checks every frame the producer
    # makes; "latest" gets the newest frame when asked (frames skipped).
    ap.add_argument("--delivery", choices=("lossless", "latest"), default="lossless")
    args = ap.parse_args()
    if (args.socket is None) == (args.name is None):
        ap.error("give the sender's SOCKET path or its --name, one of them")

    if args.lib == "torch":
        import torch

        def verify(t, tag, words_of=None):
            words = t.view(torch.int32)  # (height, width, words per pixel)
            if words.dim() == 2:  # a planar ring's (rows, width): both planes
                words = words.unsqueeze(-1)
            rows = words.shape[0]
            start, end = band_rows(tag, GEOMETRY["height"] or rows)
            background, band = words_of or (tag, ~tag)
            want = torch.full((rows, 1, 1), s32(background), dtype=torch.int32, device=t.device)
            want[start:end] = s32(band)
            return (words != want).any()

        def check_parts(frame):
            # One ordering on the current stream for the whole frame.
            parts = frame.tensors(stream=torch.cuda.current_stream())
            wrong = zero()
            for p, name in enumerate(frame.part_names):
                t = torch.from_dlpack(parts[name])
                wrong = wrong | verify(t, frame.tag, part_words(p, frame.tag))
            frame.release()  # after that stream
            return wrong

        def release(frame):
            frame.release()  # on the stream torch.from_dlpack named

        def check(frame):
            if frame.part_names:
                return check_parts(frame)
            t = torch.from_dlpack(frame)  # (height, width, channels)
            wrong = verify(t, frame.tag)
            frame.release()  # on the stream from_dlpack ordered after the write
            return wrong

        def stream_rules(receiver):
            """Frames read on a side stream: handed out on a bare handle
            (torch passes an int), release() must ask for the stream; handed
            out on a stream object, release() uses it. Returns (bad, notes)."""
            side = torch.cuda.Stream()
            notes = []
            frame = receiver.next(args.timeout)
            with torch.cuda.stream(side):
                wrong = verify(torch.from_dlpack(frame), frame.tag)
            try:
                frame.release()
                notes.append("bare handle: release() did NOT refuse")
            except ValueError:
                notes.append("bare handle: release() -> ValueError")
            frame.release(stream=side)
            notes.append("release(stream=side) ok")
            frame = receiver.next(args.timeout)
            own = torch.cuda.Stream()
            alive = weakref.ref(own)
            with torch.cuda.stream(own):
                # The legacy capsule: torch.from_dlpack takes it as is.
                capsule = frame.__dlpack__(stream=own)
                wrong = wrong | verify(torch.from_dlpack(capsule), frame.tag)
            del own, capsule
            gc.collect()
            kept = alive() is not None  # only the frame refers to it now
            frame.release()  # after that stream: the frame kept the object
            notes.append(
                "stream object: " + ("kept alive by the frame" if kept else "NOT kept")
                + ", release() ok"
            )
            torch.cuda.synchronize()
            ok = notes[0].endswith("ValueError") and kept
            return int(wrong.item()), ok, "; ".join(notes)

        def zero():
            return torch.zeros((), dtype=torch.int64, device="cuda")

        def sync():
            torch.cuda.synchronize()

        def layout(frame):
            if frame.part_names:
                parts = frame.tensors(stream=torch.cuda.current_stream())
                return {
                    name: (tuple(t.shape), str(t.dtype))
                    for name, t in ((n, torch.from_dlpack(parts[n])) for n in frame.part_names)
                }
            t = torch.from_dlpack(frame)
            return tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device)

    else:
        import cupy

        def current_stream():
            return cupy.cuda.get_current_stream()  # .ptr 0: the legacy default stream

        def release(frame):
            # __cuda_array_interface__ does not tell the consumer's stream:
            # name it (release() alone raises ValueError).
            frame.release(stream=current_stream())

        def check(frame):
            a = cupy.asarray(frame)  # __cuda_array_interface__, synced on its stream
            words = a.view(cupy.int32)  # (height, width, words per pixel)
            if words.ndim == 2:  # a planar ring's (rows, width): both planes
                words = words[:, :, None]
            rows = words.shape[0]
            start, end = band_rows(frame.tag, GEOMETRY["height"] or rows)
            want = cupy.full((rows, 1, 1), s32(frame.tag), dtype=cupy.int32)
            want[start:end] = s32(~frame.tag)
            wrong = (words != want).any()
            frame.release(stream=current_stream())
            return wrong

        def zero():
            return cupy.zeros((), dtype=cupy.int64)

        def sync():
            cupy.cuda.runtime.deviceSynchronize()

        def layout(frame):
            a = cupy.asarray(frame)
            return a.shape, a.strides, str(a.dtype), "cuda:%d" % a.device.id

    if args.lib == "cupy":
        # CuPy compiles its elementwise kernels on first use (seconds): do it
        # before connecting, so that the first frame is not held that long.
        # Kernels are specialized by layout too: warm them on a pitched,
        # non-contiguous view like a frame's, and run the whole check.
        rows = cupy.zeros((8, 40, 4), dtype=cupy.uint8)[:, :32, :]
        d = rows.view(cupy.int32)
        w = cupy.full((8, 1, 1), 1, dtype=cupy.int32)
        w[2:4] = 2
        warm = zero()
        warm += (d != w).any()
        int(warm.item())
        sync()
    if args.name is not None:
        receiver = cuda_interop.connect_named(args.name, args.timeout, delivery=args.delivery)
    else:
        receiver = cuda_interop.connect(args.socket, timeout=args.timeout, delivery=args.delivery)
    GEOMETRY["height"] = receiver.layout[2]
    first = receiver.next(args.timeout)
    multi = bool(first.part_names)
    if multi and args.lib != "torch":
        print(f"[{args.lib}] a multi-image ring ({first.part_names}): use --lib torch", flush=True)
        return 1
    slots, width, height, pitch = receiver.layout
    print(
        f"[{args.lib}] ring of {slots} slots, {width}x{height}, row pitch {pitch}; "
        f"first frame {first.tag} on DLPack device {first.__dlpack_device__()}, "
        f"{args.lib} sees shape/strides/dtype/device {layout(first)}",
        flush=True,
    )
    release(first)
    bad = zero()
    received = 1
    start = time.perf_counter()
    last = first.tag
    skipped = 0
    split = None
    # Host time per frame in next() (waiting for the sender) and in the
    # check (enqueueing it: the GPU runs it asynchronously).
    waiting = checking = 0.0
    for i in range(args.frames - 1):
        if i == 50:
            split = time.perf_counter()
        asked = time.perf_counter()
        try:
            frame = receiver.next(args.timeout)
        except ConnectionError as e:
            # The sender stopped or dropped this receiver; the message says
            # why (a frame held past its hold timeout, ...).
            print(f"[{args.lib}] disconnected after {received} frames: {e}", flush=True)
            return 1
        skipped += frame.tag - last - 1
        last = frame.tag
        got = time.perf_counter()
        bad += check(frame)
        waiting += got - asked
        checking += time.perf_counter() - got
        received += 1
        if not args.quiet and received % 100 == 0:
            print(f"[{args.lib}] {received} frames", flush=True)
    sync()
    elapsed = time.perf_counter() - start
    bad = int(bad.item())
    ms = elapsed * 1e3 / max(received - 1, 1)
    later = ""
    if split is not None and received > 52:
        later = f"; after the first 50: {(elapsed - (split - start)) * 1e3 / (received - 51):.3f} ms/frame"
    print(
        f"[{args.lib}] {received} frames, {bad} bad, {ms:.3f} ms/frame "
        f"(checked on the GPU; {skipped} frame numbers skipped{later})",
        flush=True,
    )
    n = max(received - 1, 1)
    print(
        f"[{args.lib}] host time per frame: {waiting * 1e6 / n:.1f} us in next(), "
        f"{checking * 1e6 / n:.1f} us enqueueing the check and release",
        flush=True,
    )
    rules_ok = True
    if args.lib == "torch" and multi:
        print(f"[torch] parts {first.part_names}: every value of every part checked", flush=True)
    elif args.lib == "torch":
        rules_bad, rules_ok, notes = stream_rules(receiver)
        rules_ok = rules_ok and rules_bad == 0
        print(f"[torch] stream rules on a side stream: {notes}; {rules_bad} bad", flush=True)
    receiver.close()
    return 0 if bad == 0 and received == args.frames and rules_ok else 1


if __name__ == "__main__":
    sys.exit(main())
