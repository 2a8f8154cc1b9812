//! The Python module `cuda_interop`: receive the frames a Vulkan sender in
//! another process shares over a Unix socket (the frame ring of
//! `cuda-interop-frames`, or one `vk-export` wire message per buffer),
//! import them into CUDA and hand them to DLPack consumers (PyTorch, CuPy,
//! JAX) without copying, or read a ring without GPU semaphores on the host
//! for NumPy.
//!
//! # Contract
//!
//! * `connect(socket_path, timeout, delivery="latest") -> Receiver` connects
//!   to a `vk_export::socket::Listener` (a `SOCK_SEQPACKET` Unix socket whose
//!   listening process runs as this user), subscribes in `delivery`
//!   (`"latest"` or `"lossless"`, else `ValueError`) and takes the ring (its
//!   layout and setup message), all within `timeout` seconds (GIL
//!   released): a sender that does not send its ring in time is a
//!   `TimeoutError`. `connect_named(name, timeout, delivery="latest")` first
//!   waits up to `timeout` for a sender of that name to appear in the
//!   directory of senders (`cuda_interop_frames::discovery`:
//!   `$XDG_RUNTIME_DIR/cuda-interop-frames`, else a private directory under
//!   `$TMPDIR` or `/tmp`), then connects within what is left of it.
//!   `list_senders()` lists that directory's live senders (`SenderInfo`:
//!   name, size, format, kind, slots, fps, pid, socket).
//! * Ring receiving is the library's one receiver state machine
//!   (`cuda_interop_frames::session`): the module keeps no state of frames
//!   of its own. A `Receiver` wraps the library receiver
//!   (`cuda_receiver::CudaReceiver` for a ring with semaphores, imported
//!   into CUDA on the device whose `deviceUUID` the records name;
//!   `host_receiver::HostReceiver` for a buffer ring without them, such as
//!   lavapipe's, read on the host); a ring `Frame` owns the library's frame
//!   until its release. Latest: each `next()` gets the newest frame (a
//!   request whose call timed out stays asked); `Receiver.dropped` counts
//!   the frames it did not get. Lossless: every frame, in order.
//! * `Receiver.next(timeout) -> Frame` returns within `timeout` seconds
//!   whatever the sender does, with the GIL released while it waits, and
//!   checks for signals at least every 50 ms (Ctrl-C raises
//!   `KeyboardInterrupt`). The producer decided at connect what it speaks:
//!   - **a frame ring** (`cuda_interop_frames::protocol`, served by the
//!     `frame_server` example of `cuda-interop-frames`): with semaphores, a
//!     `(height, width, 4)` `uint8` CUDA tensor over the slot with strides
//!     `(row_pitch, 4, 1)` elements (an image ring: `(height, width,
//!     channels)` of the format's channel type, over this module's copy),
//!     `tag` = the frame number, held until released; without semaphores,
//!     a host (kDLCPU) copy of the frame for NumPy, checked after the read
//!     to be the frame's, whose slot is released before `next()` returns.
//!     A multi-image ring (several named images a slot, one frame;
//!     `frame_server --with-depth`): `Frame.tensors(stream=None)` orders
//!     the frame on `stream` once and gives a dict name -> `Part` (each a
//!     DLPack producer of its image, handed out once, on that stream);
//!     `Frame.part_names` names them; the frame itself is no tensor, and
//!     its one release covers every part.
//!   - **one buffer per message** (a producer that speaks first, with
//!     `vk_export` wire messages): resource 0 must be a device-local
//!     buffer, handed out whole as a 1-D `uint8` tensor; the other
//!     resources are dropped (their fds closed). If its first message
//!     arrives only after `connect` subscribed, that message is consumed
//!     while the protocol is told apart (the frames library's session
//!     takes it).
//! * A receiver the sender dropped (held a frame past the sender's hold
//!   timeout, a GPU release that never came, a protocol fault, ...) gets
//!   `ConnectionError` from `next()` saying why and what to do, and never
//!   a frame from before the drop; so does the release of a frame it held
//!   then (its slot may have been written since).
//! * `Frame.__dlpack__(stream=None, max_version=None, dl_device=None,
//!   copy=None)` hands the frame out once, on `(kDLCUDA, ordinal)`
//!   (`Frame.__dlpack_device__()`: `(2, ordinal)`; a host frame `(1, 0)`,
//!   kDLCPU). With `max_version` of major 1 or more the
//!   capsule is a DLPack 1.0 `"dltensor_versioned"`, with `None` a legacy
//!   `"dltensor"`. The capsule's destructor calls the deleter only if no
//!   consumer took it (`"used_dltensor_versioned"` / `"used_dltensor"`), so
//!   what it keeps alive (a ring slot's mapping, or an import) is freed
//!   exactly once. **Stream ordering** (ring frames): the consumer's `stream`
//!   (a `CUstream` handle; `1` legacy default, `2` per-thread default, `None`
//!   the legacy default as the DLPack protocol says for CUDA, `-1` no
//!   ordering, `0` refused) sees the frame: until the frames library can
//!   make a foreign stream wait on the GPU, `__dlpack__` waits (GIL
//!   released, bounded by 10 s) for the "produced" timeline at the frame's
//!   number before it returns. As DLPack
//!   has it, the consumer vouches that its handle is a live stream of the
//!   frame's device (asking the driver about a garbage pointer is itself
//!   undefined behaviour); a handle that cannot be a stream is refused with
//!   `ValueError` before any driver call, here and in `release`: negative
//!   ints other than `-1`, other ints below 4096, and addresses with nothing
//!   readable mapped (`process_vm_readv` on this process; skipped where a
//!   seccomp filter forbids it).
//! * `Frame.__cuda_array_interface__` (ring frames on CUDA): version 3,
//!   `data`, `shape`, `strides` in bytes, `typestr` `"|u1"`, and `stream`: a
//!   stream of this module on which the "produced" wait is enqueued, which
//!   the consumer must order its work after (CuPy does). It does not say the
//!   consumer's stream, so such a frame's release must name it (as after a
//!   bare handle, below). A frame has one consumer protocol: after
//!   `__dlpack__` the interface raises `BufferError`, and the other way
//!   round.
//! * `Frame.release(stream=None)` (and leaving `with frame:`) gives a ring
//!   slot back: with a CUDA stream (`-1` none) the slot's "released"
//!   timeline is signalled with the frame number after the work enqueued on
//!   it so far, and the producer's next write to the slot waits for it; then
//!   the release message is sent. Without a stream the caller's reads must
//!   have completed. The default is the stream given to `__dlpack__` where
//!   it can still be named: the legacy default (`None` or `1`) or a stream
//!   object, which the frame keeps a reference to until the release (so its
//!   stream lives; not so for an `ExternalStream`, whose owner destroys the
//!   stream). A bare handle is the consumer's to keep alive only during
//!   `__dlpack__`, and `2` (also as an object, CuPy's `Stream.ptds`) names
//!   the calling thread's stream, so neither is used again: `release()`
//!   then raises `ValueError` asking for the stream, and so does leaving
//!   `with frame:` (unless the block raised: its exception wins, and the
//!   frame is given back as a drop would). A release that raises leaves
//!   the frame released (the connection is over, or the frame was not
//!   held). Idempotent; a ring frame dropped unreleased is released the
//!   same way, with the GIL released (after a bare handle: without
//!   ordering, and a `RuntimeWarning`); if that release fails, the
//!   connection is given up (the producer takes the slots back) and the
//!   next call raises `ConnectionError` with the reason (the first reason
//!   the connection ended for). A reference cycle
//!   through a frame and its stream object is not collected (the collector
//!   would run the stream's `__del__`, which destroys it, first). A frame is
//!   used by one thread at a time: a call while another thread's call on
//!   the same frame runs raises `RuntimeError` (nothing is released twice).
//!   Tensors handed out keep the memory mapped after a release, but its
//!   contents are the
//!   producer's again. Handing out after a release, or twice, raises
//!   `BufferError`. A consumer holding every slot stalls the producer (which
//!   drops it after its hold timeout): hold at most `slots - 1` frames.
//! * `Receiver.close()` (and leaving `with receiver:`) shuts the connection
//!   down: the producer takes back the slots this consumer held, so the
//!   releases of frames still out do nothing (no signal, no message, no
//!   error). `next()` on several threads at once is allowed (the session
//!   takes frames in the order they arrive; each call keeps its own
//!   timeout while another receives, then raises `TimeoutError` saying
//!   so), and frames may be released from any thread.
//!   A receiver, a frame and an unconsumed capsule let go of the GIL while
//!   their CUDA resources are torn down (bounded waits for the GPU); a
//!   capsule destroyed while the interpreter shuts down is freed in place.
//! * Errors carry the crates' messages: `TimeoutError` for a timeout,
//!   `ConnectionError` for socket errors and a connection that is over (the
//!   sender closed it or dropped this receiver, or it was given up),
//!   `ValueError` for a malformed message, record or packet and for bad
//!   arguments, `RuntimeError` for CUDA and Vulkan errors (no CUDA driver,
//!   no matching device). No call waits without a bound (packet sends: the
//!   socket's 10 s send timeout).
//! * Built with the `test-hooks` feature (only `cargo xtask test` does, for
//!   pytest), the module also has `_host_frame(n)`, `_host_frames_alive()`,
//!   `_connect_recording(path, timeout, delivery="latest")` (a real
//!   sender's session whose frames are host memory standing in for CUDA
//!   slots and take streams as CUDA frames do) and `_signals(receiver)`
//!   (the "released" signals that would have been enqueued), to test the
//!   protocols without a GPU. The wheel (`cargo xtask wheel`) has no such
//!   hooks.
//!
//! # Modules
//!
//! The protocol, the session (which frames are held, why a connection
//! ended) and the ring's import are `cuda_interop_frames`'s; this crate is
//! the Python face. `errors` (exceptions) and `host` (test-hook host
//! memory) use no other module; `senders` uses `errors`; `ring` uses
//! `host`; `frame` uses `errors`, `ring`, `host`; `receiver` uses those and
//! `frame`; `hooks` (test hooks) uses `errors`, `frame`, `host`,
//! `receiver`. No module uses one that uses it.

use pyo3::prelude::*;

mod errors;
mod frame;
#[cfg(feature = "test-hooks")]
mod hooks;
#[cfg(feature = "test-hooks")]
mod host;
mod receiver;
mod ring;
mod senders;

/// Receive video frames that a Vulkan sender in another process shares,
/// without copying: into PyTorch, CuPy or JAX on CUDA through DLPack and the
/// CUDA Array Interface, or (a sender without GPU semaphores, such as
/// lavapipe's) into NumPy on the host.
///
///     import cuda_interop, torch
///     with cuda_interop.connect_named("camera", timeout=5.0) as rx:
///         while True:
///             with rx.next(timeout=1.0) as frame:
///                 image = torch.from_dlpack(frame)  # (height, width, 4) uint8
///                 ...  # work on the current stream; the release follows it
///
/// connect(socket_path, timeout) and connect_named(name, timeout) return a
/// Receiver; list_senders() shows the senders that can be connected to by
/// name. Receiver.next(timeout) returns the next Frame within its timeout
/// (TimeoutError otherwise); release each frame (frame.release(), or leave
/// its with-block) soon: the sender drops a receiver that holds a frame
/// past its hold timeout, and next() then raises ConnectionError saying
/// why.
#[pymodule(name = "cuda_interop")]
fn cuda_interop_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(receiver::connect, m)?)?;
    m.add_function(wrap_pyfunction!(receiver::connect_named, m)?)?;
    m.add_function(wrap_pyfunction!(senders::list_senders, m)?)?;
    #[cfg(feature = "test-hooks")]
    {
        m.add_function(wrap_pyfunction!(hooks::_host_frame, m)?)?;
        m.add_function(wrap_pyfunction!(hooks::_host_frames_alive, m)?)?;
        m.add_function(wrap_pyfunction!(hooks::_connect_recording, m)?)?;
        m.add_function(wrap_pyfunction!(hooks::_signals, m)?)?;
    }
    m.add_class::<senders::SenderInfo>()?;
    m.add_class::<receiver::Receiver>()?;
    m.add_class::<frame::Frame>()?;
    m.add_class::<frame::Part>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PROTOCOL_VERSION", cuda_interop_frames::protocol::VERSION)?;
    Ok(())
}
