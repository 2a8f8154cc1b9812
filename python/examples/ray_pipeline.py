#!/usr/bin/env python3
"""Frames from a named sender through a Ray actor pipeline.

    python3 python/examples/ray_pipeline.py --name NAME [--frames 300] [--seconds 30]
        [--delivery latest|lossless] [--check] [--in-flight 4] [--device auto|cpu|cuda]
        [--address ADDRESS]

A receiving actor (`FrameSource`) connects to the sender named NAME (the
`frame_server` example of cuda-interop-frames, or your own
`cuda_interop_frames::sender`), takes its frames, gets each frame's pixels
out of the ring and into Ray, and hands the `ObjectRef` to a processing
actor (`FrameProcessor`), which computes the frame's mean and, with
`--check`, checks every pixel against frame_server's demo pattern (each
pixel's little-endian u32 is the frame number, a band of rows has its bits
flipped). At most `--in-flight` frames are in the pipeline at once: the
receiving actor waits for the oldest result before taking another frame
(backpressure; with `--delivery latest` the sender never waits and the
frames skipped meanwhile are counted as dropped). The run ends after
`--frames` frames or `--seconds` seconds, or when the sender stops (exit
status 1, with the reason); every wait is bounded. It ends with one line:

    ray_pipeline: 60 frames in 1.52 s (39.5 frames/s), 0 bad, 0 dropped, ...

A ring slot belongs to the sender: it must be released promptly, and Ray's
object store never holds one. So each frame is copied out of the ring before
it goes to Ray:

* Host frames (a sender without GPU semaphores, e.g. `frame_server
  --host-visible --no-semaphores` on lavapipe): `numpy.from_dlpack(frame)` is
  an array of this process's own, `ray.put` copies it into the object store,
  and the frame is released at once. The processing actor gets a NumPy array.
* CUDA frames (an NVIDIA GPU, torch installed, `--device cuda` or auto): the
  frame is a torch tensor over the ring slot (`torch.from_dlpack`). Where
  NIXL is importable (`pip install nixl`), it goes through Ray's direct
  transport (RDT) without a copy: each ring slot's memory is registered with
  NIXL once (`ray.experimental.register_nixl_memory`; Ray 2.60.0 keys the
  registration by the storage's address, so later frames in the same slot
  reuse it), the tensor is `ray.put(tensor, _tensor_transport="nixl")`, and
  the frame is released when the processing actor has taken it (its result
  is back); frames held so are kept below the ring's slot count. A
  non-contiguous frame (row padding: RDT sends contiguous tensors only) is
  cloned first. Without NIXL the frame is cloned on the stream it was handed
  out on, released, and the clone goes through `ray.put` (object store).
  Both actors then ask for half a GPU each (on a machine of several GPUs,
  Ray's choice of GPU, through CUDA_VISIBLE_DEVICES, must include the
  sender's).

What ran where (Ray 2.60.0, the version `cargo xtask test` installs in
`target/xtask-ray`): the host path runs in CI, in python/tests/test_ray.py
(60 lossless frames at 256x128, every pixel checked; a latest run; a sender
killed mid-run; the command line with a sender that stops) on lavapipe,
without a GPU. The CUDA path (torch, NIXL) is written against Ray 2.60.0's
API (checked in its source: `ray.put(..., _tensor_transport="nixl")` inside
an actor, `ray.experimental.register_nixl_memory`, the actor option
`enable_tensor_transport`) but has NOT run anywhere: the CI machines have no
GPU, and the project's GPU machine has torch but neither Ray nor NIXL and
cannot fetch packages, and Ray 2.60.0's cp312 wheel alone (75.6 MiB) is
over what one call may carry there (64 MiB; nixl-cu13 1.5.1 is 56 MiB more).
Whether NIXL/UCX can register memory that CUDA imported from Vulkan is not
documented anywhere we found; if `register_nixl_memory` fails on a ring
slot, uninstall nixl to take the clone path.

Ray is not a dependency of the module: `pip install ray==2.60.0 numpy` (and
torch, nixl for the CUDA path) next to cuda_interop.
"""

import argparse
import collections
import importlib.util
import sys
import time

import ray

import cuda_interop


def band_rows(frame, height):
    """The demo pattern's band: height / 16 rows (at least 1), 8 rows a
    frame (cuda-interop-frames/examples/common/demo.rs `band_rows`)."""
    rows = max(height // 16, 1)
    start = (frame * 8) % (height - rows + 1)
    return start, start + rows


def check_numpy(pixels, tag):
    """(pixels checked, bad pixels, mean) of an (H, W, 4) uint8 array."""
    import numpy as np

    height, width = pixels.shape[:2]
    words = np.ascontiguousarray(pixels).view("<u4").reshape(height, width)
    f = np.uint32(tag & 0xFFFFFFFF)
    want = np.full((height, 1), f, dtype="<u4")
    start, end = band_rows(tag, height)
    want[start:end] = ~f
    return words.size, int((words != want).sum()), float(pixels.mean())


def check_torch(pixels, tag):
    """`check_numpy` for an (H, W, 4) uint8 torch tensor, on its device."""
    import torch

    height, width = pixels.shape[:2]
    words = pixels.contiguous().view(torch.int32).reshape(height, width)
    f = tag & 0xFFFFFFFF
    f = f - (1 << 32) if f >= 1 << 31 else f  # the same 32 bits as an int32
    want = torch.full((height, 1), f, dtype=torch.int32, device=pixels.device)
    start, end = band_rows(tag, height)
    want[start:end] = ~f
    bad = int((words != want).sum())
    return words.numel(), bad, float(pixels.float().mean())


@ray.remote
class FrameProcessor:
    """Takes each frame's pixels (a NumPy array or a torch tensor) and
    keeps a tally of what it checked."""

    def __init__(self, check):
        self.check = check
        self.tags = []
        self.pixels = 0
        self.bad_frames = []
        self.means = []

    def process(self, pixels, tag):
        is_numpy = type(pixels).__module__ == "numpy"
        if self.check and (pixels.ndim != 3 or pixels.shape[2] != 4):
            raise ValueError(f"--check takes RGBA8 frames (H, W, 4), not {tuple(pixels.shape)}")
        if self.check:
            checked, bad, mean = (check_numpy if is_numpy else check_torch)(pixels, tag)
            self.pixels += checked
            if bad:
                self.bad_frames.append((tag, bad))
        else:
            mean = float(pixels.mean()) if is_numpy else float(pixels.float().mean())
        self.tags.append(tag)
        self.means.append(mean)
        return tag

    def stats(self):
        return {"checked_tags": self.tags, "pixels_checked": self.pixels,
                "bad_frames": self.bad_frames, "means": self.means}


@ray.remote
class FrameSource:
    """Receives frames from a named sender and hands them to a processor."""

    def __init__(self, nixl):
        self.nixl = nixl
        self.registered = {}  # ring slot -> the tensor whose memory NIXL registered

    def put(self, frame):
        """The frame's pixels in Ray: (ObjectRef, the frame if it is still
        held, how it went)."""
        if frame.__dlpack_device__()[0] == 1:  # kDLCPU: read on the host
            import numpy

            ref = ray.put(numpy.from_dlpack(frame))
            frame.release()
            return ref, None, "object store (NumPy)"
        import torch

        tensor = torch.from_dlpack(frame)  # ordered after the sender's write
        if self.nixl and tensor.is_contiguous() and frame.slot is not None:
            from ray.experimental import register_nixl_memory

            if frame.slot not in self.registered:
                register_nixl_memory(tensor)
                self.registered[frame.slot] = tensor
            # NIXL reads the memory outside torch's streams.
            torch.cuda.current_stream().synchronize()
            return ray.put(tensor, _tensor_transport="nixl"), frame, "nixl (ring slot, no copy)"
        copy = tensor.clone(memory_format=torch.contiguous_format)
        frame.release()  # on the stream from_dlpack used, after the clone
        if self.nixl:
            return ray.put(copy, _tensor_transport="nixl"), None, "nixl (clone)"
        return ray.put(copy), None, "object store (torch clone)"

    def run(self, processor, name, frames, seconds, delivery, in_flight, timeout):
        """Takes up to `frames` frames for up to `seconds`; returns a
        summary, with `error` set when the sender stopped or went quiet."""
        summary = {"frames": 0, "tags": [], "dropped": 0, "error": None,
                   "transport": set(), "elapsed": 0.0}
        pending = collections.deque()  # (result ref, frame still held or None)

        def settle():
            result, frame = pending.popleft()
            try:
                ray.get(result, timeout=timeout + 30)
            finally:
                if frame is not None:
                    frame.release()

        try:
            receiver = cuda_interop.connect_named(name, timeout, delivery=delivery)
        except (ConnectionError, TimeoutError) as e:
            summary["error"] = f"cannot connect to {name!r}: {e}"
            return summary
        with receiver:
            # A frame kept for NIXL holds its slot until the processor took
            # it: leave the sender a slot.
            max_held = max(receiver.layout[0] - 1, 1) if receiver.layout else 1
            start = time.monotonic()
            deadline = start + seconds
            try:
                while summary["frames"] < frames:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        frame = receiver.next(min(timeout, left))
                    except TimeoutError as e:
                        if time.monotonic() < deadline:
                            summary["error"] = f"no frame: {e}"
                        break
                    except ConnectionError as e:
                        summary["error"] = f"disconnected: {e}"
                        break
                    tag = frame.tag
                    ref, held, how = self.put(frame)
                    summary["transport"].add(how)
                    pending.append((processor.process.remote(ref, tag), held))
                    del ref, held, frame
                    summary["frames"] += 1
                    summary["tags"].append(tag)
                    while len(pending) >= in_flight or \
                            sum(f is not None for _, f in pending) >= max_held:
                        settle()
                while pending:
                    settle()
            finally:
                while pending:  # after an error: give the slots back
                    _, frame = pending.popleft()
                    if frame is not None:
                        frame.release()
            summary["elapsed"] = time.monotonic() - start
            summary["dropped"] = receiver.dropped
        summary["transport"] = sorted(summary["transport"])
        return summary


def cuda_available():
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def run_pipeline(name, frames=300, seconds=30.0, delivery="lossless", check=False,
                 in_flight=4, timeout=5.0, device="cpu"):
    """Runs the pipeline in the Ray cluster this process is connected to
    (`ray.init` first) and returns the summary: the receiving actor's
    (`frames`, `tags`, `dropped`, `error`, `transport`, `elapsed`) and the
    processing actor's (`checked_tags`, `pixels_checked`, `bad_frames`,
    `means`)."""
    if in_flight < 1:
        raise ValueError("in_flight must be at least 1")
    options = {}
    nixl = False
    if device == "cuda":
        nixl = importlib.util.find_spec("nixl") is not None
        options = {"num_gpus": 0.5}  # both actors on one GPU
        if nixl:
            options["enable_tensor_transport"] = True
    processor = FrameProcessor.options(**options).remote(check)
    source = FrameSource.options(**options).remote(nixl)
    try:
        run = source.run.remote(processor, name, frames, seconds, delivery, in_flight, timeout)
        # run() ends by itself within seconds + a few timeouts; the margin
        # covers starting the actors' worker processes.
        summary = ray.get(run, timeout=seconds + 4 * timeout + 60)
        summary.update(ray.get(processor.stats.remote(), timeout=60))
    finally:
        ray.kill(source)
        ray.kill(processor)
    return summary


def summary_line(s):
    rate = s["frames"] / s["elapsed"] if s["elapsed"] > 0 else 0.0
    checked = f", {s['pixels_checked']} pixels checked" if s["pixels_checked"] else ""
    return (f"ray_pipeline: {s['frames']} frames in {s['elapsed']:.2f} s ({rate:.1f} frames/s), "
            f"{len(s['bad_frames'])} bad, {s['dropped']} dropped{checked}, "
            f"via {' + '.join(s['transport']) or 'nothing'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True, help="the sender's name (receive.py --list)")
    ap.add_argument("--frames", type=int, default=300, help="stop after this many frames")
    ap.add_argument("--seconds", type=float, default=30.0, help="stop after this many seconds")
    ap.add_argument("--delivery", choices=("latest", "lossless"), default="latest")
    ap.add_argument("--check", action="store_true",
                    help="check every pixel against frame_server's demo pattern")
    ap.add_argument("--in-flight", type=int, default=4,
                    help="frames in the pipeline at most (backpressure)")
    ap.add_argument("--timeout", type=float, default=5.0,
                    help="seconds to wait for the sender and for each frame")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="cuda: the actors get GPUs (CUDA frames as torch tensors); "
                         "auto: cuda where torch sees one")
    ap.add_argument("--address", default="local",
                    help="the Ray cluster (default: start a local one; 'auto' joins `ray start`'s)")
    ap.add_argument("--num-cpus", type=int, default=None, help="for a local cluster")
    args = ap.parse_args()
    device = args.device
    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    ray.init(address=args.address, num_cpus=args.num_cpus if args.address == "local" else None,
             include_dashboard=False, log_to_driver=True)
    try:
        s = run_pipeline(args.name, args.frames, args.seconds, args.delivery, args.check,
                         args.in_flight, args.timeout, device)
    finally:
        ray.shutdown()
    print(summary_line(s), flush=True)
    if s["error"]:
        print(f"ray_pipeline: stopped early: {s['error']}", file=sys.stderr)
        return 1
    if s["bad_frames"]:
        print(f"ray_pipeline: bad frames (tag, bad pixels): {s['bad_frames'][:10]}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
