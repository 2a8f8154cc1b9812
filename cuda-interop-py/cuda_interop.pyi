"""Type stubs of the `cuda_interop` extension module (Rust, pyo3).

Receive video frames that a Vulkan sender in another process shares,
without copying: into PyTorch, CuPy or JAX on CUDA through DLPack
(`torch.from_dlpack`) and the CUDA Array Interface (`cupy.asarray`), or
(a sender without GPU semaphores, such as lavapipe's) into NumPy on the
host (`numpy.from_dlpack`). The module's contract is in
cuda-interop-py/src/lib.rs; the guide's "Python" section shows it in use.
"""

from types import TracebackType
from typing import Any, List, Literal, Optional, Tuple, Type, Union

__version__: str
PROTOCOL_VERSION: int

StreamArg = Union[None, int, Any]
"""`None` (the legacy default stream), `-1` (no ordering), `1` (legacy
default), `2` (per-thread default), another int: a `CUstream` handle the
caller vouches is a live stream of the frame's device (as DLPack has it), or
a stream object with an int `cuda_stream` or `ptr` attribute. `0` and ints
that cannot be a stream (other values below 4096, unmapped addresses) raise
`ValueError` before any driver call."""

Delivery = Literal["latest", "lossless"]
"""How a receiver of a frame ring wants its frames: `"latest"` (the newest
frame when it asks; the sender never waits for it; the frames it missed
are counted in `Receiver.dropped`) or `"lossless"` (every frame, in order;
the sender waits, bounded, for its releases)."""

SlotKind = Literal["buffer", "image"]
"""What a sender's slots are: pitched buffers or images."""

def connect(socket_path: str, timeout: float, delivery: Delivery = "latest") -> Receiver:
    """Connects to the sender's socket at `socket_path`, subscribes in
    `delivery` and takes its ring (imported into CUDA, or read on the host
    when the sender shares no semaphores), all within `timeout` seconds.
    `ConnectionError` if nobody listens, the listener's user is another,
    or the sender closed or refused the connection (saying why);
    `TimeoutError` if the sender did not send its ring in time;
    `ValueError` for another delivery or a malformed ring; `RuntimeError`
    for CUDA or Vulkan (no driver, no matching device). A producer of one
    buffer per message is recognised by its first message."""
    ...

def connect_named(name: str, timeout: float, delivery: Delivery = "latest") -> Receiver:
    """`connect` to the sender named `name` in the directory of senders
    (`$XDG_RUNTIME_DIR/cuda-interop-frames`, else a private directory under
    `$TMPDIR` or `/tmp`), waiting up to `timeout` seconds for it to appear
    and connecting within what is left. `ConnectionError` if no sender of
    that name appeared in time (`list_senders()` shows those there),
    `ValueError` for a name that cannot be one."""
    ...

def list_senders() -> List[SenderInfo]:
    """The live senders of the directory of senders, sorted by name."""
    ...

class SenderInfo:
    """One announced sender, as `list_senders()` found it (read-only)."""

    @property
    def name(self) -> str:
        """Its name (what `connect_named` takes)."""
        ...
    @property
    def width(self) -> int:
        """Pixels per row."""
        ...
    @property
    def height(self) -> int:
        """Rows."""
        ...
    @property
    def row_pitch(self) -> int:
        """Bytes from one row to the next."""
        ...
    @property
    def format(self) -> str:
        """The pixel format, e.g. `"r8g8b8a8_unorm"`."""
        ...
    @property
    def kind(self) -> SlotKind:
        """What the ring's slots are: `"buffer"` or `"image"`."""
        ...
    @property
    def slots(self) -> int:
        """Slots in the ring."""
        ...
    @property
    def fps(self) -> float:
        """Frames presented per second, over the last second or so (0
        before the first)."""
        ...
    @property
    def pid(self) -> int:
        """The sender's process id as it sees itself (for people: in another
        pid namespace it names another process or none)."""
        ...
    @property
    def socket(self) -> str:
        """Its socket's path (what `connect` takes)."""
        ...

class Receiver:
    """A connection to a sender. `next()` returns its frames; leave
    `with receiver:` (or call `close()`) to disconnect."""

    def next(self, timeout: float) -> Frame:
        """Waits at most `timeout` seconds (GIL released; Ctrl-C raises
        `KeyboardInterrupt` within 50 ms) for the next frame: a frame of the
        sender's ring, or the buffer of a one-buffer message.
        `TimeoutError` (none in time, also while another thread's `next()`
        was receiving), `ConnectionError` (the sender left, or dropped this
        receiver: the message says why and what to do; no frame from before
        a drop is ever returned), `ValueError` (malformed message),
        `RuntimeError` (CUDA or Vulkan)."""
        ...
    @property
    def layout(self) -> Optional[Tuple[int, int, int, int]]:
        """The ring's `(slots, width, height, row_pitch)`; `None` for a
        producer of one buffer per message."""
        ...
    @property
    def format(self) -> Optional[str]:
        """What the ring's frames are: `"r8g8b8a8_unorm"` (an RGBA8 buffer
        ring, frames `(height, width, 4)` `uint8`); `"nv12"` or `"p010"` (a
        planar YUV 4:2:0 buffer ring: a frame is one `(rows, width)` tensor of
        `uint8` or `uint16` samples, the luma plane's `height` rows, then from
        row `chroma_row` the chroma plane's `height // 2` rows of
        `width // 2` Cb, Cr pairs; P010 holds 10-bit values in the top bits);
        an image ring's `VkFormat` in lower case. `None` for a producer of one
        buffer per message."""
        ...
    @property
    def chroma_row(self) -> Optional[int]:
        """A planar ring's first chroma row in a frame's tensor (`height`
        when the chroma plane follows the luma plane):
        `luma = t[:height]`, `chroma = t[chroma_row:].view(height // 2,
        width // 2, 2)` in PyTorch (`reshape` in NumPy and CuPy), both views
        of the frame. `None` for other rings."""
        ...
    @property
    def held(self) -> int:
        """How many ring slots this receiver holds (received, not released;
        a host ring's frames are released by `next()` itself)."""
        ...
    @property
    def path(self) -> str:
        """The socket path this receiver connected to."""
        ...
    @property
    def delivery(self) -> Delivery:
        """The delivery it subscribed in."""
        ...
    @property
    def dropped(self) -> int:
        """Ring frames it did not get: those presented between two it
        received (frames before its first are not counted)."""
        ...
    @property
    def received(self) -> int:
        """Ring frames it received."""
        ...
    def close(self) -> None:
        """Shuts the connection down now: the sender takes back the slots
        this receiver held, and releases of frames still out do nothing.
        Later calls raise `ConnectionError`."""
        ...
    def __enter__(self) -> Receiver: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        """Closes the receiver; never swallows the block's exception."""
        ...

class Frame:
    """One received buffer or ring slot: hand it to one consumer, then
    `release()` it (or leave `with frame:`)."""

    def __dlpack__(
        self,
        *,
        stream: StreamArg = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """The frame as a DLPack capsule (`"dltensor_versioned"` for
        `max_version` major >= 1, else `"dltensor"`), handed out once;
        work enqueued afterwards on `stream` sees the sender's write (and,
        for an image ring, the copy of the image into the frame's buffer).
        The caller vouches that `stream` is a live stream of the frame's
        device. A host frame takes no stream (`None` only)."""
        ...
    def __dlpack_device__(self) -> Tuple[int, int]:
        """`(device_type, device_id)`: `(2, ordinal)` (kDLCUDA, the CUDA
        device's ordinal) for a CUDA frame, `(1, 0)` (kDLCPU) for a host
        frame (a ring read on the host, for NumPy)."""
        ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface (version 3) of a ring frame on CUDA; its
        `stream` is a stream of this module the consumer must order after.
        Such a frame's release must name the consumer's stream. A host
        frame has none (`AttributeError`)."""
        ...
    @property
    def tag(self) -> int:
        """The producer's tag: the frame number for a ring frame."""
        ...
    @property
    def slot(self) -> Optional[int]:
        """The ring slot of a ring frame held until its release, else
        `None` (also for a host ring's frames, released by `next()`)."""
        ...
    @property
    def shape(self) -> Tuple[int, ...]:
        """The tensor's shape: `(height, width, 4)` (`uint8`, a buffer
        ring), `(height, width, channels)` (an image ring: the format's
        channel type, e.g. `float16` for R16G16B16A16_SFLOAT, over this
        module's copy of the image) or `(nbytes,)`. An image ring's
        channels are the texel's bytes in memory order: B8G8R8A8 frames are
        `uint8` B, G, R, A (`[..., 0]` is blue), sRGB frames the encoded
        bytes, A2B10G10R10_UNORM_PACK32 frames one `uint32` word a texel
        (`channels` 1; bits 0-9 R, 10-19 G, 20-29 B, 30-31 A), R16_UNORM
        and R16G16_UNORM `uint16` with 1 and 2 channels. A multi-image
        ring's frame: its first part's (its parts are `tensors()`)."""
        ...
    @property
    def strides(self) -> Tuple[int, ...]:
        """The tensor's strides in elements (bytes for `uint8` frames)."""
        ...
    @property
    def nbytes(self) -> int:
        """Bytes the frame's memory spans."""
        ...
    @property
    def available(self) -> bool:
        """Whether the frame can still be handed out."""
        ...
    @property
    def part_names(self) -> List[str]:
        """A multi-image ring's parts (e.g. `["color", "depth",
        "segmentation"]`), in slot order; empty for any other frame."""
        ...
    def tensors(self, stream: StreamArg = None) -> dict[str, Part]:
        """A multi-image ring's frame as its images by name, all of one
        frame: the frame is ordered on `stream` once (as `__dlpack__` takes
        it: the sender's write, every part's copy), then each `Part` is
        handed to a DLPack consumer once (`torch.from_dlpack(part)`), which
        must pass that same stream. Handed out once; `release()` orders
        after that stream. `TypeError` for a frame of any other ring (the
        frame itself is the tensor there); such a frame's own `__dlpack__`
        and `__cuda_array_interface__` raise `BufferError`."""
        ...
    def release(self, stream: StreamArg = None) -> None:
        """Gives the frame back (idempotent): the sender's next write of
        the slot waits for the work enqueued on `stream` so far (`-1`: none;
        the caller's reads must then have completed). Defaults to the stream
        given to `__dlpack__` where it can still be named, else raises
        `ValueError` asking for it. `ConnectionError` if the sender dropped
        this receiver while it held the frame (what was read from it since
        may be a later frame's); the frame is released either way."""
        ...
    def __enter__(self) -> Frame: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        """Releases the frame as `release()` does; if the block raised, its
        exception wins (never swallowed)."""
        ...

class Part:
    """One image of a multi-image frame (`Frame.tensors`): a DLPack
    producer of a `(height, width, channels)` tensor of its format's
    channel type (`uint8` RGBA8, `float32` depth, `uint32` labels), handed
    out once; the frame's release covers it."""

    def __dlpack__(
        self,
        *,
        stream: StreamArg = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """The part as a DLPack capsule, handed out once; `stream` must be
        the one given to `Frame.tensors` (`BufferError` otherwise)."""
        ...
    def __dlpack_device__(self) -> Tuple[int, int]:
        """The frame's `(device_type, device_id)`."""
        ...
    @property
    def name(self) -> str:
        """The part's name."""
        ...
    @property
    def shape(self) -> Tuple[int, ...]:
        """`(height, width, channels)`."""
        ...
