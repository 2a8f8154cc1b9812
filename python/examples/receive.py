#!/usr/bin/env python3
"""Receive frames from a cuda-interop sender and use them as tensors.

    python3 python/examples/receive.py --list
    python3 python/examples/receive.py (SOCKET | --name NAME) [--frames 10] [--delivery latest]

A frame sender (the `frame_server` example of cuda-interop-frames, or your
own `cuda_interop_frames::sender`) shares a ring of slots: with a GPU whose
drivers export semaphores (NVIDIA), each frame is a CUDA tensor (PyTorch if
installed, else CuPy) over the sender's memory, no copy; without (lavapipe,
`frame_server --host-visible --no-semaphores`), each frame is read on the
host into a NumPy array. A producer of one buffer per message
(`vk_export::socket::Connection::send_exported`) gives 1-D uint8 CUDA
tensors. Without a CUDA driver, a ring with semaphores raises RuntimeError
saying what is missing.

    maturin build --release -m cuda-interop-py/Cargo.toml
    pip install target/wheels/cuda_interop-*.whl
"""

import argparse
import sys

import cuda_interop


def consumer(device_type):
    """`from_dlpack` for the frame's DLPack device: 1 (host) NumPy, 2
    (CUDA) PyTorch, else CuPy."""
    if device_type == 1:
        import numpy

        return "numpy", numpy.from_dlpack
    try:
        import torch

        return "torch", torch.from_dlpack
    except ImportError:
        import cupy

        return "cupy", cupy.from_dlpack


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket", nargs="?", help="the sender's socket path (or --name)")
    ap.add_argument("--name", help="the sender's name (see --list)")
    ap.add_argument("--list", action="store_true", help="list the senders that have a name")
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--delivery", choices=("latest", "lossless"), default="latest")
    args = ap.parse_args()
    if args.list:
        for s in cuda_interop.list_senders():
            print(f"{s.name}: {s.width}x{s.height} {s.format} {s.kind} x{s.slots}, "
                  f"{s.fps:.1f} fps, pid {s.pid}, {s.socket}")
        return 0
    if (args.socket is None) == (args.name is None):
        ap.error("give the sender's SOCKET path or its --name, one of them")
    if args.name is not None:
        # Waits up to the timeout for a sender of that name to appear.
        receiver = cuda_interop.connect_named(args.name, args.timeout, delivery=args.delivery)
    else:
        receiver = cuda_interop.connect(args.socket, args.timeout, delivery=args.delivery)
    with receiver:
        print(f"connected to {receiver.path}: ring (slots, width, height, row pitch) "
              f"{receiver.layout}, delivery {receiver.delivery}")
        for _ in range(args.frames):
            try:
                frame = receiver.next(args.timeout)
            except TimeoutError as e:
                sys.exit(f"no frame: {e}")
            except ConnectionError as e:
                # The sender stopped, or dropped this receiver: the message
                # says why (a frame held too long, ...).
                sys.exit(f"disconnected: {e}")
            # Released when the block ends, after the work on the stream
            # from_dlpack ordered (the sender may then write the slot again).
            with frame:
                name, from_dlpack = consumer(frame.__dlpack_device__()[0])
                tensor = from_dlpack(frame)
                print(
                    f"frame {frame.tag}: {tuple(tensor.shape)} {tensor.dtype} on DLPack device "
                    f"{frame.__dlpack_device__()} ({name}), first word "
                    f"{int(tensor.reshape(-1)[0])}, frames missed so far {receiver.dropped}"
                )
                del tensor
    return 0


if __name__ == "__main__":
    sys.exit(main())
