#!/usr/bin/env python3
"""Receive frames from a cuda-interop producer and use them as CUDA tensors.

NEEDS A GPU: an NVIDIA GPU with its driver (libcuda), a Vulkan driver for the
same GPU, PyTorch with CUDA (or CuPy), and a producer process (Rust, the
vk-export crate) that listens on SOCKET and sends messages whose resource 0 is
a device-local buffer (`Connection::send_exported(tag, &[&buffer])`). Without
a CUDA driver, `next()` raises RuntimeError saying what is missing.

    maturin build --release -m cuda-interop-py/Cargo.toml
    pip install target/wheels/cuda_interop-*.whl
    python3 python/examples/receive.py /tmp/producer.sock [FRAMES]
"""

import sys

import cuda_interop


def consumer():
    """`from_dlpack` of PyTorch, else of CuPy."""
    try:
        import torch

        return "torch", torch.from_dlpack
    except ImportError:
        import cupy

        return "cupy", cupy.from_dlpack


def main():
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} SOCKET [FRAMES]")
    path = sys.argv[1]
    frames = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    name, from_dlpack = consumer()

    receiver = cuda_interop.connect(path, timeout=5.0)
    for _ in range(frames):
        try:
            frame = receiver.next(timeout=5.0)
        except TimeoutError as e:
            sys.exit(f"no frame: {e}")
        except ConnectionError as e:
            print(f"producer gone: {e}")
            break
        # Zero copy: the tensor owns the CUDA import from here on and frees it
        # when it is garbage collected.
        tensor = from_dlpack(frame)
        print(
            f"frame {frame.tag}: {frame.nbytes} bytes on DLPack device "
            f"{frame.__dlpack_device__()}, {name} {tuple(tensor.shape)} {tensor.dtype}, "
            f"first bytes {tensor[:8].tolist()}, sum {int(tensor.sum())}"
        )
        del tensor


if __name__ == "__main__":
    main()
