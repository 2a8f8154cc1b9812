"""Type stubs of the `cuda_interop` extension module (Rust, pyo3).

Receive buffers a Vulkan producer in another process shares over a Unix
socket, import them into CUDA, and hand them to DLPack (`torch.from_dlpack`)
and CUDA Array Interface (`cupy.asarray`) consumers without copying. The
module's contract is in cuda-interop-py/src/lib.rs; the guide's "Python"
section shows it in use.
"""

from types import TracebackType
from typing import Any, Literal, Optional, Tuple, Type, Union

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
frame when it asks; the producer never waits for it; the frames it missed
are counted in `Receiver.dropped`) or `"lossless"` (every frame, in order;
the producer waits, bounded, for its releases)."""

def connect(socket_path: str, timeout: float, delivery: Delivery = "latest") -> Receiver:
    """Connects to the producer's socket at `socket_path`, waiting at most
    `timeout` seconds for room in its backlog, and subscribes in
    `delivery` (a frame ring's; a producer of one buffer per message
    ignores it). `ConnectionError` if nobody listens or the listener's user
    is another; `TimeoutError` on a full backlog; `ValueError` for another
    delivery."""
    ...

def connect_named(name: str, timeout: float, delivery: Delivery = "latest") -> Receiver:
    """`connect` to the sender named `name` in the directory of senders
    under `$XDG_RUNTIME_DIR` (`cuda_interop_frames::discovery`).
    `ConnectionError` if there is none of that name (or no
    `$XDG_RUNTIME_DIR`), `ValueError` for a name that cannot be one."""
    ...

class Receiver:
    """A connection to a producer. `next()` returns its frames."""

    def next(self, timeout: float) -> Frame:
        """Waits at most `timeout` seconds (GIL released) for the next frame:
        a frame of the producer's ring (the first call also imports the
        ring), or the buffer of a one-buffer message. `TimeoutError`,
        `ConnectionError` (peer gone), `ValueError` (malformed message),
        `RuntimeError` (CUDA or Vulkan: no driver, no matching device)."""
        ...
    @property
    def layout(self) -> Optional[Tuple[int, int, int, int]]:
        """The ring's `(slots, width, height, row_pitch)` once known, else
        `None`."""
        ...
    @property
    def held(self) -> int:
        """How many ring slots this consumer holds (received, not released)."""
        ...
    @property
    def path(self) -> str:
        """The socket path this receiver connected to."""
        ...
    @property
    def delivery(self) -> Optional[Delivery]:
        """The delivery it subscribed in."""
        ...
    @property
    def dropped(self) -> int:
        """Ring frames it did not get: those presented between two it
        received, and (latest) those received behind a newer one and given
        back unseen."""
        ...
    def close(self) -> None:
        """Shuts the connection down now: the producer takes back the slots
        this consumer held. Later calls raise `ConnectionError`."""
        ...
    def __enter__(self) -> Receiver: ...
    def __exit__(self, *exc: object) -> bool:
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
        `stream` is made to wait for the producer's write (and, for an image
        ring, the copy of the image into the frame's pitched buffer; with
        `stream=-1` that copy is waited for before this returns). The caller
        vouches that `stream` is a live stream of the frame's device."""
        ...
    def __dlpack_device__(self) -> Tuple[int, int]:
        """`(device_type, device_id)`: `(2, ordinal)` (kDLCUDA) for a
        received frame."""
        ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface (version 3) of a ring frame; its `stream`
        is a stream of this module the consumer must order after. Such a
        frame's release must name the consumer's stream."""
        ...
    @property
    def tag(self) -> int:
        """The producer's tag: the frame number for a ring frame."""
        ...
    @property
    def slot(self) -> Optional[int]:
        """The ring slot of a ring frame, else `None`."""
        ...
    @property
    def shape(self) -> Tuple[int, ...]:
        """The tensor's shape: `(height, width, 4)` (`uint8`, a buffer
        ring), `(height, width, channels)` (an image ring: the format's
        channel type, e.g. `float16` for R16G16B16A16_SFLOAT, over this
        module's copy of the image) or `(nbytes,)`."""
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
    def release(self, stream: StreamArg = None) -> None:
        """Gives the frame back (idempotent): the producer's next write of
        the slot waits for the work enqueued on `stream` so far (`-1`: none;
        the caller's reads must then have completed). Defaults to the stream
        given to `__dlpack__` where it can still be named, else raises
        `ValueError` asking for it."""
        ...
    def __enter__(self) -> Frame: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        _exc_value: Optional[BaseException],
        _traceback: Optional[TracebackType],
    ) -> bool:
        """Releases the frame as `release()` does; if the block raised, its
        exception wins."""
        ...
