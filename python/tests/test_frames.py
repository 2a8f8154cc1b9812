"""CPU tests of the frame-ring protocol (no GPU): ring frames over host memory
(the `_connect_host_ring` test hook), against a fake producer written here and
against the real `frame_server` example on lavapipe (host-visible memory, no
semaphores), whose path `cargo xtask test` passes in CUDA_INTEROP_FRAME_SERVER.
"""

import ctypes
import gc
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time

import pytest

import cuda_interop

from test_module import DLManagedTensorVersioned, PyCapsule_GetPointer

# Fake stream handles for the rings that record their signals: addresses of
# readable memory, since the module refuses a handle that cannot be a stream
# (the first page, an address nothing readable is mapped at).
_STREAM_MEMORY = ctypes.create_string_buffer(4096)
S = [ctypes.addressof(_STREAM_MEMORY) + 64 * i for i in range(8)]

MAGIC = b"CIFR"
HELLO, FRAME, RELEASE, SUBSCRIBE, ACQUIRE = 1, 2, 3, 4, 5
MODE_LOSSLESS, MODE_LATEST = 0, 1


def packet(kind, slot=0, flags=0, frame=0, width=0, height=0, pitch=0, fmt=0, version=2):
    return struct.pack(
        "<4sHHIIQIIQII", MAGIC, version, kind, slot, flags, frame, width, height, pitch, fmt, 0
    )


def parse(data):
    assert len(data) == 48, len(data)
    magic, version, kind, slot, flags, frame = struct.unpack_from("<4sHHIIQ", data)
    assert (magic, version) == (MAGIC, 2)
    return kind, slot, flags, frame


@pytest.fixture
def producer():
    """A fake producer: a listener; yields (path, accept())."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "frames.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.bind(path)
        s.listen(1)
        s.settimeout(5.0)
        try:
            yield path, s
        finally:
            s.close()


def ring(producer, slots=3, width=5, height=4, pitch=32):
    path, s = producer
    receiver = cuda_interop._connect_host_ring(path, 1.0)
    peer, _ = s.accept()
    peer.settimeout(5.0)
    peer.send(packet(HELLO, slot=slots, width=width, height=height, pitch=pitch, fmt=1))
    return receiver, peer


def subscribed_ring(producer, delivery, slots=3):
    """A host ring whose receiver subscribed in `delivery`: the fake
    producer checks the subscribe, then sends the hello."""
    path, s = producer
    receiver = cuda_interop._connect_host_ring(path, 1.0, delivery=delivery)
    assert receiver.delivery == delivery
    peer, _ = s.accept()
    peer.settimeout(5.0)
    mode = MODE_LATEST if delivery == "latest" else MODE_LOSSLESS
    assert parse(peer.recv(64)) == (SUBSCRIBE, 0, mode, 0)
    peer.send(packet(HELLO, slot=slots, width=5, height=4, pitch=32, fmt=1))
    return receiver, peer


def test_latest_delivery_asks_and_gets_the_newest_frame(producer):
    """Latest: each next() asks once (a timed-out request stays asked), the
    newest of the frames queued is handed out and the older ones are given
    back unseen, and the gaps are counted as dropped."""
    receiver, peer = subscribed_ring(producer, "latest")
    with peer:
        # The producer presented frames 1 to 3 before it was asked (not
        # pushed to a latest receiver): on the request, its newest.
        peer.send(packet(FRAME, slot=0, frame=4))
        f = receiver.next(1.0)
        assert f.tag == 4 and receiver.dropped == 0  # before its first: not counted
        assert parse(peer.recv(64)) == (ACQUIRE, 0, 0, 0)
        f.release()
        assert parse(peer.recv(64)) == (RELEASE, 0, 0, 4)
        # Two frames queued at once (pushed before the producer read the
        # subscribe): the newer one is handed out, the older given back.
        peer.send(packet(FRAME, slot=1, frame=5))
        peer.send(packet(FRAME, slot=2, frame=6))
        f = receiver.next(1.0)
        assert f.tag == 6
        assert parse(peer.recv(64)) == (ACQUIRE, 0, 0, 0)
        assert parse(peer.recv(64)) == (RELEASE, 1, 0, 5)
        assert receiver.held == 1 and receiver.dropped == 1
        f.release()
        assert parse(peer.recv(64)) == (RELEASE, 2, 0, 6)
        # Frames 7 and 8 went by: dropped.
        peer.send(packet(FRAME, slot=0, frame=9))
        f = receiver.next(1.0)
        assert f.tag == 9 and receiver.dropped == 3
        assert parse(peer.recv(64)) == (ACQUIRE, 0, 0, 0)
        f.release()
        assert parse(peer.recv(64)) == (RELEASE, 0, 0, 9)
        # A request that timed out stays asked: one acquire for both calls.
        for _ in range(2):
            with pytest.raises(TimeoutError):
                receiver.next(0.05)
        assert parse(peer.recv(64)) == (ACQUIRE, 0, 0, 0)
        peer.settimeout(0.2)
        with pytest.raises(socket.timeout):
            peer.recv(64)
        peer.settimeout(5.0)
        peer.send(packet(FRAME, slot=1, frame=10))
        with receiver.next(1.0) as f:
            assert f.tag == 10 and receiver.dropped == 3
        assert parse(peer.recv(64)) == (RELEASE, 1, 0, 10)
        # A bad packet queued behind a good frame: the error, and the good
        # frame (never handed out) goes back.
        peer.send(packet(FRAME, slot=0, frame=11))
        peer.send(packet(FRAME, slot=2, frame=11))
        with pytest.raises(ValueError, match="must go up"):
            receiver.next(1.0)
        assert parse(peer.recv(64)) == (ACQUIRE, 0, 0, 0)
        assert parse(peer.recv(64)) == (RELEASE, 0, 0, 11)
        assert receiver.held == 0


def test_lossless_delivery_gets_every_frame_in_order(producer):
    """Lossless: no requests; every frame the producer pushes, in order,
    none dropped."""
    receiver, peer = subscribed_ring(producer, "lossless")
    with peer:
        for n in (1, 2, 3):
            peer.send(packet(FRAME, slot=n - 1, frame=n))
        frames = [receiver.next(1.0) for _ in range(3)]
        assert [f.tag for f in frames] == [1, 2, 3]
        assert receiver.held == 3 and receiver.dropped == 0
        for f in frames:
            f.release()
        assert [parse(peer.recv(64)) for _ in range(3)] == [
            (RELEASE, n - 1, 0, n) for n in (1, 2, 3)
        ]
        peer.settimeout(0.2)
        with pytest.raises(socket.timeout):
            peer.recv(64)


def test_a_delivery_that_is_neither_is_refused(producer):
    path, _ = producer
    for connect in (cuda_interop.connect, cuda_interop._connect_host_ring):
        with pytest.raises(ValueError, match='"latest" or "lossless", not "newest"'):
            connect(path, 1.0, delivery="newest")


def test_layout_shape_and_strides(producer):
    receiver, peer = ring(producer, width=5, height=4, pitch=32)
    with peer:
        assert receiver.layout is None
        peer.send(packet(FRAME, slot=1, frame=7))
        frame = receiver.next(1.0)
        assert receiver.layout == (3, 5, 4, 32)
        assert (frame.tag, frame.slot) == (7, 1)
        assert frame.shape == (4, 5, 4)
        assert frame.strides == (32, 4, 1)
        assert frame.nbytes == 3 * 32 + 5 * 4
        assert frame.__dlpack_device__() == (1, 0)
        assert receiver.held == 1
        capsule = frame.__dlpack__(max_version=(1, 0))
        m = DLManagedTensorVersioned.from_address(
            PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        )
        t = m.dl_tensor
        assert (t.ndim, t.code, t.bits, t.lanes, t.byte_offset) == (3, 1, 8, 1, 0)
        assert [t.shape[i] for i in range(3)] == [4, 5, 4]
        assert [t.strides[i] for i in range(3)] == [32, 4, 1]
        # Slot 1's host bytes are (index + 1) mod 256: row 2, pixel 3, channel 1.
        assert ctypes.string_at(t.data + 2 * 32 + 3 * 4 + 1, 1)[0] == (2 * 32 + 13 + 1) % 256
        with pytest.raises(BufferError):
            frame.__dlpack__(max_version=(1, 0))  # handed out once
        del capsule, m, t
        frame.release()
        assert parse(peer.recv(64)) == (RELEASE, 1, 0, 7)
        assert receiver.held == 0


def test_interface_dict(producer):
    receiver, peer = ring(producer, width=6, height=3, pitch=64)
    with peer:
        peer.send(packet(FRAME, slot=0, frame=1))
        frame = receiver.next(1.0)
        d = cuda_interop._interface_dict(frame)
        assert d["shape"] == (3, 6, 4)
        assert d["strides"] == (64, 4, 1)
        assert d["typestr"] == "|u1"
        assert d["descr"] == [("", "|u1")]
        assert d["version"] == 3
        assert d["stream"] is None
        data, read_only = d["data"]
        assert data != 0 and read_only is False
        # A host frame has no CUDA Array Interface.
        assert not hasattr(frame, "__cuda_array_interface__")
        frame.release()
        with pytest.raises(BufferError):
            cuda_interop._interface_dict(frame)


def test_release_is_sent_once_and_by_drop_and_with(producer):
    receiver, peer = ring(producer)
    with peer:
        for n in (1, 2, 3):
            peer.send(packet(FRAME, slot=n - 1, frame=n))
        a, b, c = (receiver.next(1.0) for _ in range(3))
        assert receiver.held == 3
        a.release()
        a.release()  # idempotent: one packet
        assert parse(peer.recv(64)) == (RELEASE, 0, 0, 1)
        with b:
            pass
        assert parse(peer.recv(64)) == (RELEASE, 1, 0, 2)
        assert not b.available
        del c  # dropped unreleased: released by its destructor
        gc.collect()
        assert parse(peer.recv(64)) == (RELEASE, 2, 0, 3)
        peer.settimeout(0.2)
        with pytest.raises(socket.timeout):
            peer.recv(64)
        assert receiver.held == 0


def test_tensor_outlives_release(producer):
    gc.collect()  # what earlier tests left for the collector
    before = cuda_interop._host_frames_alive()
    receiver, peer = ring(producer)
    with peer:
        peer.send(packet(FRAME, slot=0, frame=1))
        frame = receiver.next(1.0)
        capsule = frame.__dlpack__(max_version=(1, 0))
        frame.release()
        del frame, receiver
        gc.collect()
        # The capsule still owns its slot's memory.
        assert cuda_interop._host_frames_alive() == before + 1
        del capsule
        gc.collect()
        assert cuda_interop._host_frames_alive() == before


def test_stream_arguments(producer):
    receiver, peer = ring(producer)
    with peer:
        peer.send(packet(FRAME, slot=0, frame=1))
        frame = receiver.next(1.0)
        with pytest.raises(ValueError, match="ambiguous"):
            frame.__dlpack__(stream=0)
        with pytest.raises(ValueError, match="no stream"):
            frame.__dlpack__(stream=S[0])  # a host frame takes no stream
        with pytest.raises(TypeError):
            frame.release(stream="fast")
        with pytest.raises(ValueError):
            frame.release(stream=-7)
        assert frame.available
        frame.release(stream=-1)
        assert parse(peer.recv(64)) == (RELEASE, 0, 0, 1)


@pytest.mark.parametrize(
    "bad, message",
    [
        (packet(FRAME, slot=3, frame=1), "slot 3 of a ring of 3"),
        (packet(HELLO, slot=3, width=5, height=4, pitch=32, fmt=1), "expected a frame packet"),
        (packet(FRAME, slot=0, frame=1, version=1), "version 1"),
        (packet(9, slot=0, frame=1), "kind 9"),
        (b"CIFR" + b"\0" * 10, "14 bytes"),
    ],
)
def test_bad_packets(producer, bad, message):
    receiver, peer = ring(producer)
    with peer:
        peer.send(bad)
        with pytest.raises(ValueError, match=message):
            receiver.next(1.0)


def test_bad_hello_and_ring_errors(producer):
    path, s = producer
    receiver = cuda_interop._connect_host_ring(path, 1.0)
    peer, _ = s.accept()
    with peer:
        peer.send(packet(HELLO, slot=9, width=5, height=4, pitch=32, fmt=1))
        with pytest.raises(ValueError, match="9 slots"):
            receiver.next(1.0)
        # A ring that could not be set up says so from then on.
        with pytest.raises(ConnectionError, match="could not be set up"):
            receiver.next(0.1)


def test_protocol_violations(producer):
    receiver, peer = ring(producer)
    with peer:
        peer.send(packet(FRAME, slot=0, frame=5))
        held = receiver.next(1.0)
        peer.send(packet(FRAME, slot=1, frame=5))
        with pytest.raises(ValueError, match="must go up"):
            receiver.next(1.0)
        peer.send(packet(FRAME, slot=0, frame=6))
        with pytest.raises(ValueError, match="still holds frame 5"):
            receiver.next(1.0)
        held.release()


def test_timeout_close_and_peer_gone(producer):
    receiver, peer = ring(producer)
    peer.send(packet(FRAME, slot=0, frame=1))
    frame = receiver.next(1.0)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        receiver.next(0.2)
    assert 0.15 <= time.monotonic() - start < 1.0
    peer.close()
    with pytest.raises(ConnectionError, match="closed"):
        receiver.next(1.0)
    # The release cannot reach a producer that left: an error, not a hang.
    with pytest.raises(ConnectionError):
        frame.release()
    receiver.close()
    with pytest.raises(ConnectionError, match="was closed"):
        receiver.next(1.0)


def test_a_dropped_frame_whose_release_fails_gives_the_connection_up(producer):
    """A release from a destructor has nobody to raise to: when it fails, the
    consumer shuts the connection down (the producer takes its slots back)
    and the next call says why."""
    receiver, peer = ring(producer)
    with peer:
        peer.send(packet(FRAME, slot=0, frame=1))
        peer.send(packet(FRAME, slot=1, frame=2))
        frame = receiver.next(1.0)
        # The producer stops reading: a send to it fails (EPIPE).
        peer.shutdown(socket.SHUT_RD)
        start = time.monotonic()
        del frame
        gc.collect()
        assert time.monotonic() - start < 1.0
        with pytest.raises(ConnectionError, match="release of dropped frame 1 failed"):
            receiver.next(1.0)
        # The producer sees the consumer leave.
        peer.settimeout(1.0)
        assert peer.recv(64) == b""


def test_a_temporary_whose_release_raises_keeps_its_exception(producer):
    """`receiver.next().release()` that fails drops the frame while its
    ConnectionError propagates; the drop's own failed release must not
    replace it (a SystemError, "error return without exception set")."""
    receiver, peer = ring(producer)
    with peer:
        peer.send(packet(FRAME, slot=0, frame=1))
        time.sleep(0.1)
        peer.shutdown(socket.SHUT_RD)
        with pytest.raises(ConnectionError, match="cannot send a release"):
            receiver.next(1.0).release()
        with pytest.raises(ConnectionError, match="given up"):
            receiver.next(1.0)


def recording_ring(producer, slots=3):
    """A host ring whose frames take streams as a CUDA ring's do and record
    each "released" signal as (slot, frame, stream) instead of enqueueing it."""
    path, s = producer
    receiver = cuda_interop._connect_host_ring(path, 1.0, record_signals=True)
    peer, _ = s.accept()
    peer.settimeout(5.0)
    peer.send(packet(HELLO, slot=slots, width=5, height=4, pitch=32, fmt=1))
    return receiver, peer


class FakeStream:
    """A stream object as torch and CuPy have: an int `ptr`. Its finalizer
    notes how many signals were made by then (the stream is "destroyed")."""

    def __init__(self, handle, receiver, seen):
        self.ptr = handle
        self.receiver = receiver
        self.seen = seen

    def __del__(self):
        self.seen.append(len(cuda_interop._signals(self.receiver)))


def test_release_signals_on_the_stream_the_frame_was_handed_out_on(producer):
    receiver, peer = recording_ring(producer)
    with peer:
        for n in (1, 2, 3):
            peer.send(packet(FRAME, slot=n - 1, frame=n))
        legacy, nosync, bare = (receiver.next(1.0) for _ in range(3))
        # None: the legacy default stream (1), remembered.
        legacy.__dlpack__()
        legacy.release()
        assert parse(peer.recv(64)) == (RELEASE, 0, 1, 1)
        # -1: no ordering, nothing to signal after.
        nosync.__dlpack__(stream=-1)
        nosync.release()
        assert parse(peer.recv(64)) == (RELEASE, 1, 0, 2)
        # A bare handle is used for the hand-out only: release() asks.
        bare.__dlpack__(stream=S[0])
        with pytest.raises(ValueError, match="bare handle"):
            bare.release()
        assert bare.slot == 2 and receiver.held == 1
        bare.release(stream=S[1])
        assert parse(peer.recv(64)) == (RELEASE, 2, 1, 3)
        assert cuda_interop._signals(receiver) == [(0, 1, 1), (2, 3, S[1])]


def unreadable_addresses():
    """Addresses nothing readable is mapped at: a PROT_NONE page, the same
    page unmapped, and an address above user space."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    prot_none, map_private_anonymous = 0, 0x02 | 0x20
    page = libc.mmap(None, 4096, prot_none, map_private_anonymous, -1, 0)
    assert page not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    yield page + 8
    assert libc.munmap(page, 4096) == 0
    yield page + 8
    yield 1 << 63


def test_a_handle_that_cannot_be_a_stream_is_refused_before_the_driver(producer):
    """Issue 18 item 9: `__dlpack__(stream=3)` or a garbage pointer (and the
    same given to `release`) reached the driver and crashed the interpreter.
    Handles in the first page other than 1 and 2, and addresses with nothing
    readable mapped, are refused with ValueError, before any signal, and the
    frame stays usable."""
    receiver, peer = recording_ring(producer)
    with peer:
        peer.send(packet(FRAME, slot=0, frame=1))
        frame = receiver.next(1.0)
        for bad in [3, 4, 0xFFF, *unreadable_addresses()]:
            with pytest.raises(ValueError, match="cannot be a CUDA stream handle"):
                frame.__dlpack__(stream=bad)
            with pytest.raises(ValueError, match="cannot be a CUDA stream handle"):
                frame.__dlpack__(stream=FakeStream(bad, receiver, []))
            with pytest.raises(ValueError, match="cannot be a CUDA stream handle"):
                frame.release(stream=bad)
        assert frame.available and receiver.held == 1
        assert cuda_interop._signals(receiver) == []
        # 1, 2 and readable memory pass (the caller vouches for them).
        frame.__dlpack__(stream=2)
        frame.release(stream=S[7])
        assert parse(peer.recv(64)) == (RELEASE, 0, 1, 1)
        assert cuda_interop._signals(receiver) == [(0, 1, S[7])]


def test_a_stream_object_is_kept_alive_until_the_release_that_uses_it(producer):
    receiver, peer = recording_ring(producer)
    seen = []
    with peer:
        peer.send(packet(FRAME, slot=0, frame=1))
        peer.send(packet(FRAME, slot=1, frame=2))
        a, b = receiver.next(1.0), receiver.next(1.0)
        stream = FakeStream(S[2], receiver, seen)
        a.__dlpack__(stream=stream)
        del stream
        gc.collect()
        assert seen == [], "the frame holds the stream object"
        a.release()
        assert parse(peer.recv(64)) == (RELEASE, 0, 1, 1)
        gc.collect()
        assert seen == [1], "let go after the release that used it"
        # Dropped unreleased: the signal is made before the object goes.
        stream = FakeStream(S[3], receiver, seen)
        b.__dlpack__(stream=stream)
        del stream, b
        gc.collect()
        assert parse(peer.recv(64)) == (RELEASE, 1, 1, 2)
        assert cuda_interop._signals(receiver) == [(0, 1, S[2]), (1, 2, S[3])]
        # The first object went at its release (1 signal made by then), the
        # second after the drop's signal (2).
        assert seen == [1, 2]


def test_a_per_thread_stream_object_is_not_reused(producer):
    """Handle 2 names the calling thread's default stream (CuPy's
    `Stream.ptds` is such an object): as a bare handle, never reused."""
    receiver, peer = recording_ring(producer)
    with peer:
        peer.send(packet(FRAME, slot=0, frame=1))
        frame = receiver.next(1.0)
        frame.__dlpack__(stream=FakeStream(2, receiver, []))
        with pytest.raises(ValueError, match="bare handle"):
            frame.release()
        frame.release(stream=-1)
        assert parse(peer.recv(64)) == (RELEASE, 0, 0, 1)


def test_leaving_with_after_a_bare_handle(producer):
    """Without an exception, leaving `with` raises ValueError (the stream
    must be named) and the frame stays held until released or dropped;
    with one, the block's exception wins and the slot goes back unordered,
    with a RuntimeWarning."""
    receiver, peer = recording_ring(producer)
    with peer:
        peer.send(packet(FRAME, slot=0, frame=1))
        peer.send(packet(FRAME, slot=1, frame=2))
        with pytest.raises(ValueError, match="bare handle"):
            with receiver.next(1.0) as frame:
                frame.__dlpack__(stream=S[0])
        assert receiver.held == 1
        with pytest.warns(RuntimeWarning, match="given back unreleased"):
            del frame
            gc.collect()
        assert parse(peer.recv(64)) == (RELEASE, 0, 0, 1)
        with pytest.warns(RuntimeWarning, match="given back unreleased"):
            with pytest.raises(KeyError, match="the body's own"):
                with receiver.next(1.0) as frame:
                    frame.__dlpack__(stream=S[0])
                    raise KeyError("the body's own")
        assert parse(peer.recv(64)) == (RELEASE, 1, 0, 2)
        assert receiver.held == 0
        assert cuda_interop._signals(receiver) == []


def test_a_cycle_through_the_stream_object_is_not_collected(producer):
    """The collector would run the stream's `__del__` (CuPy destroys its
    stream there) before the frame's release could order after it, so the
    frame hides the edge: the cycle stays, and breaking it releases the
    frame on the stream, which goes afterwards."""
    import weakref

    receiver, peer = recording_ring(producer)
    seen = []
    with peer:
        peer.send(packet(FRAME, slot=0, frame=1))
        frame = receiver.next(1.0)
        stream = FakeStream(S[4], receiver, seen)
        stream.frame = frame  # frame -> stream -> frame
        frame.__dlpack__(stream=stream)
        alive = weakref.ref(stream)
        del stream, frame
        gc.collect()
        assert alive() is not None and seen == [] and receiver.held == 1
        alive().frame = None  # the application breaks the cycle
        gc.collect()
        assert parse(peer.recv(64)) == (RELEASE, 0, 1, 1)
        assert cuda_interop._signals(receiver) == [(0, 1, S[4])]
        assert seen == [1]


def exit_while_holding(producer, holding_lines):
    """Runs a child that receives frame 1 of a two-slot ring, runs
    `holding_lines` (Python, with `f` the frame), prints "holding 1", waits
    for a line on stdin and exits; the producer leaves before that line.
    Returns the child's exit status and stderr."""
    path, s = producer
    child = subprocess.Popen(
        ["python3", "-c",
         "import sys, cuda_interop\n"
         f"r = cuda_interop._connect_host_ring({path!r}, 2.0)\n"
         "f = r.next(5.0)\n"
         + "".join(line + "\n" for line in holding_lines)
         + "print('holding', f.tag, flush=True)\n"
         "sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    peer, _ = s.accept()
    with peer:
        peer.send(packet(HELLO, slot=2, width=5, height=4, pitch=32, fmt=1))
        peer.send(packet(FRAME, slot=0, frame=1))
        assert child.stdout.readline().strip() == "holding 1"
    _, err = child.communicate("\n", timeout=10)  # the producer is gone
    return child.returncode, err


def test_a_frame_alive_at_exit_whose_release_fails_exits_quietly(producer):
    """A frame kept in a global is given back while the interpreter shuts
    down; its release fails (the producer left): no panic, no traceback."""
    status, err = exit_while_holding(producer, [])
    assert status == 0, err
    assert "panicked" not in err and "Traceback" not in err, err


def test_release_on_one_thread_and_next_on_another_lose_no_frame(producer):
    """The slot is marked free before its release is sent: the producer's
    next frame for it, received at once by a next() on another thread, is
    never taken for a frame into a slot still held."""
    import queue
    import threading

    path, s = producer
    n_frames = 20000
    # One CPU for both processes: the release and the next() interleave at
    # every preemption (how the race was found).
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    pid = os.fork()
    if pid == 0:  # the producer: one slot, a new frame for each release
        try:
            peer, _ = s.accept()
            peer.settimeout(5.0)
            peer.send(packet(HELLO, slot=1, width=5, height=4, pitch=32, fmt=1))
            n = 1
            peer.send(packet(FRAME, slot=0, frame=n))
            while peer.recv(64) and n < n_frames:  # each release: a new frame
                n += 1
                peer.send(packet(FRAME, slot=0, frame=n))
        finally:
            os._exit(0)
    try:
        receiver = cuda_interop._connect_host_ring(path, 1.0)
        frames, errors = queue.Queue(), []

        def receive():
            try:
                for _ in range(n_frames):
                    frames.put(receiver.next(5.0))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
            frames.put(None)

        def release():
            while (frame := frames.get()) is not None:
                frame.release()

        threads = [threading.Thread(target=receive), threading.Thread(target=release)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert errors == [] and receiver.held == 0
    finally:
        os.sched_setaffinity(0, cpus)
        os.waitpid(pid, 0)


def test_two_threads_calling_next_accept_frames_in_order(producer):
    """Receiving a packet and accepting it are one step: two threads' next()
    calls never accept frame 7 before frame 5 (which would refuse 5)."""
    path, s = producer
    for _ in range(20):
        two_threads_take_six_frames(path, s)


def two_threads_take_six_frames(path, s):
    import threading

    # A pause between receiving a packet and accepting it widens the window
    # (without the lock around both, this fails most rounds).
    receiver = cuda_interop._connect_host_ring(path, 1.0, accept_delay=0.002)
    peer, _ = s.accept()
    with peer:
        peer.send(packet(HELLO, slot=7, width=5, height=4, pitch=32, fmt=1))
        for n in range(1, 8):
            peer.send(packet(FRAME, slot=n - 1, frame=n))
        frames, errors = [receiver.next(1.0)], []

        def take():
            for _ in range(3):
                try:
                    frames.append(receiver.next(1.0))
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

        threads = [threading.Thread(target=take) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert errors == [] and sorted(f.tag for f in frames) == list(range(1, 8))
        receiver.close()


def test_frames_after_close_are_the_producers_again(producer):
    """After Receiver.close() the producer has taken every slot back:
    releases (and leaving `with`) are no-ops, nothing is signalled or sent,
    and the receiver holds nothing."""
    receiver, peer = recording_ring(producer)
    with peer:
        for n in (1, 2):
            peer.send(packet(FRAME, slot=n - 1, frame=n))
        a, b = receiver.next(1.0), receiver.next(1.0)
        a.__dlpack__()
        receiver.close()
        assert receiver.held == 0
        a.release()
        with b:
            pass
        assert cuda_interop._signals(receiver) == []
        with pytest.raises(ConnectionError, match="was closed"):
            receiver.next(1.0)


def test_a_frame_read_through_the_array_interface_must_name_its_stream(producer):
    """`__cuda_array_interface__` does not tell the consumer's stream: a
    release must name it (or -1); a drop gives the slot back unordered, with
    a RuntimeWarning, which a filter that makes warnings errors sends to
    sys.unraisablehook instead of losing it."""
    import sys

    receiver, peer = recording_ring(producer)
    with peer:
        for n in (1, 2):
            peer.send(packet(FRAME, slot=n - 1, frame=n))
        frame = receiver.next(1.0)
        assert frame.__cuda_array_interface__["shape"] == (4, 5, 4)
        with pytest.raises(ValueError, match="__cuda_array_interface__"):
            frame.release()
        frame.release(stream=S[5])
        assert parse(peer.recv(64)) == (RELEASE, 0, 1, 1)
        frame = receiver.next(1.0)
        frame.__cuda_array_interface__
        seen = []
        hook, sys.unraisablehook = sys.unraisablehook, seen.append
        try:
            with warnings_as_errors():
                del frame
                gc.collect()
        finally:
            sys.unraisablehook = hook
        assert parse(peer.recv(64)) == (RELEASE, 1, 0, 2)
        assert len(seen) == 1 and isinstance(seen[0].exc_value, RuntimeWarning)
        assert cuda_interop._signals(receiver) == [(0, 1, S[5])]


class warnings_as_errors:
    def __enter__(self):
        import warnings

        self.catch = warnings.catch_warnings()
        self.catch.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self.catch.__exit__(*exc)


def test_a_frame_given_back_in_with_stays_a_ring_frame(producer):
    receiver, peer = recording_ring(producer)
    with peer:
        peer.send(packet(FRAME, slot=2, frame=1))
        with pytest.warns(RuntimeWarning):
            with pytest.raises(KeyError):
                with receiver.next(1.0) as frame:
                    frame.__dlpack__(stream=S[0])
                    raise KeyError("the body's own")
        assert parse(peer.recv(64)) == (RELEASE, 2, 0, 1)
        assert frame.slot == 2 and not frame.available
        with pytest.raises(BufferError, match="released"):
            frame.__cuda_array_interface__


def test_a_capsule_alive_at_exit_is_freed_without_a_crash(producer):
    """An unconsumed capsule in a global is destroyed while the interpreter
    shuts down, when nothing may attach to it: its deleter runs in place."""
    status, err = exit_while_holding(producer, [
        "cap = f.__dlpack__(max_version=(1, 0))",
        "legacy = cuda_interop._host_frame(16).__dlpack__()",
    ])
    assert status == 0, err
    assert "panicked" not in err, err


def test_close_while_next_waits_gives_no_frame_and_holds_nothing(producer):
    """A frame received but not yet accepted when close() runs is not
    handed out: the producer has taken its slot back."""
    import threading

    path, s = producer
    receiver = cuda_interop._connect_host_ring(path, 1.0, accept_delay=0.5)
    peer, _ = s.accept()
    with peer:
        peer.send(packet(HELLO, slot=3, width=5, height=4, pitch=32, fmt=1))
        peer.send(packet(FRAME, slot=0, frame=1))
        receiver.next(2.0)  # sets the ring up
        peer.send(packet(FRAME, slot=1, frame=2))
        outcome = []

        def take():
            try:
                outcome.append(receiver.next(2.0))
            except ConnectionError as e:
                outcome.append(e)

        t = threading.Thread(target=take)
        t.start()
        time.sleep(0.2)  # the packet is received, its accept pending
        receiver.close()
        t.join()
        assert isinstance(outcome[0], ConnectionError), outcome
        assert "closed" in str(outcome[0])
        assert receiver.held == 0


def test_next_keeps_its_timeout_while_another_thread_receives(producer):
    import threading

    path, s = producer
    receiver = cuda_interop._connect_host_ring(path, 1.0, accept_delay=1.0)
    peer, _ = s.accept()
    with peer:
        peer.send(packet(HELLO, slot=3, width=5, height=4, pitch=32, fmt=1))
        peer.send(packet(FRAME, slot=0, frame=1))
        peer.send(packet(FRAME, slot=1, frame=2))
        first = threading.Thread(target=receiver.next, args=(5.0,))
        first.start()
        time.sleep(0.2)  # it holds the receive step for about a second
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="another thread"):
            receiver.next(0.1)
        assert time.monotonic() - start < 0.5
        first.join()


def test_one_consumer_protocol_per_frame(producer):
    receiver, peer = recording_ring(producer)
    with peer:
        for n in (1, 2):
            peer.send(packet(FRAME, slot=n - 1, frame=n))
        a, b = receiver.next(1.0), receiver.next(1.0)
        a.__cuda_array_interface__
        a.__cuda_array_interface__  # again: the same consumer
        with pytest.raises(BufferError, match="__cuda_array_interface__"):
            a.__dlpack__(stream=S[0])
        b.__dlpack__(stream=S[0])
        with pytest.raises(BufferError, match="__dlpack__"):
            b.__cuda_array_interface__
        a.release(stream=-1)
        b.release(stream=S[6])
        assert cuda_interop._signals(receiver) == [(1, 2, S[6])]


def timed_out(receiver, seconds):
    try:
        receiver.next(seconds)
    except TimeoutError:
        return True
    return False


def test_getters_do_not_hold_the_gil_while_a_first_next_waits(producer):
    """A first `next()` holds the receiver's state while it waits for the
    producer's first message (with the GIL released); `layout` and `held`
    wait for it without the GIL, so other Python threads keep running."""
    import threading

    receiver, peer = ring(producer)
    path, s = producer
    # A second receiver whose producer says nothing yet.
    quiet = cuda_interop._connect_host_ring(path, 1.0)
    quiet_peer, _ = s.accept()
    with peer, quiet_peer:
        outcome = []
        waiter = threading.Thread(
            target=lambda: outcome.append(timed_out(quiet, 0.6))
        )
        ticks = []
        stop = threading.Event()

        def ticker():
            while not stop.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.005)

        waiter.start()
        time.sleep(0.1)  # the waiter holds the state now
        t = threading.Thread(target=ticker)
        t.start()
        start = time.monotonic()
        assert quiet.layout is None  # waits for the first next() to give up
        waited = time.monotonic() - start
        assert quiet.held == 0
        stop.set()
        t.join()
        waiter.join()
        assert waited > 0.3, waited
        during = [x for x in ticks if start <= x <= start + waited]
        # Roughly one tick per 5 ms while the getter waited; with the GIL
        # held, none.
        assert len(during) > 20, (len(during), waited)
        assert outcome == [True]


def test_no_cuda_is_a_runtime_error(producer):
    """The real `connect` imports the ring into CUDA: without a driver that
    is a RuntimeError naming what is missing (here the setup message is not
    even valid: a ValueError or RuntimeError, never a hang)."""
    path, s = producer
    receiver = cuda_interop.connect(path, 1.0)
    peer, _ = s.accept()
    with peer:
        peer.send(packet(HELLO, slot=2, width=4, height=4, pitch=16, fmt=1))
        peer.send(b"\xde\xad\xbe\xef" * 4)
        with pytest.raises((ValueError, RuntimeError)):
            receiver.next(1.0)


SERVER = os.environ.get("CUDA_INTEROP_FRAME_SERVER")


@pytest.fixture
def frame_server():
    if not SERVER or not os.path.exists(SERVER):
        pytest.skip("CUDA_INTEROP_FRAME_SERVER (set by cargo xtask test) names no binary")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "frames.sock")
        log = open(os.path.join(d, "server.log"), "w+")
        p = subprocess.Popen(
            [SERVER, "--socket", path, "--width", "64", "--height", "32",
             "--row-pitch", "320", "--slots", "3", "--seconds", "60",
             "--hold-timeout", "2", "--host-visible", "--no-semaphores"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            for _ in range(200):
                if os.path.exists(path) or p.poll() is not None:
                    break
                time.sleep(0.05)
            if not os.path.exists(path):
                log.seek(0)
                pytest.skip("frame_server did not start (no Vulkan?): " + log.read())
            yield path, p, log
        finally:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def server_log(log):
    log.flush()
    log.seek(0)
    return log.read()


def test_real_server_two_consumers_and_a_killed_one(frame_server):
    path, _, log = frame_server
    # A consumer in another process, killed (SIGKILL) mid-stream.
    victim = subprocess.Popen(
        ["python3", "-c",
         "import sys, time, cuda_interop\n"
         f"r = cuda_interop._connect_host_ring({path!r}, 2.0)\n"
         "f = r.next(5.0)\n"
         "print('running', f.tag, flush=True)\n"
         "f.release()\n"
         "while True:\n"
         "    r.next(5.0).release()\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert victim.stdout.readline().startswith("running")
        a = cuda_interop._connect_host_ring(path, 2.0)
        seen = []
        for _ in range(20):
            frame = a.next(5.0)
            assert frame.shape == (32, 64, 4) and frame.strides == (320, 4, 1)
            seen.append(frame.tag)
            frame.release()
        victim.kill()
        victim.wait(5)
        # The producer gives the victim's slots back and keeps serving `a`.
        for _ in range(50):
            frame = a.next(5.0)
            assert frame.tag > seen[-1]
            seen.append(frame.tag)
            frame.release()
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(5)
    assert seen == sorted(seen)
    a.close()
    del a, frame
    gc.collect()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "consumers=0" not in server_log(log).split("left after")[-1]:
        time.sleep(0.1)
    text = server_log(log)
    assert text.count("left after") == 2, text
    # The producer learns of a consumer that left either way: its reader
    # sees the hang-up, or its next frame packet meets a closed socket.
    assert all(
        "(disconnected" in l or "could not be sent" in l
        for l in text.splitlines() if "left after" in l
    ), text
    # fds back at the value before any consumer.
    last = [l for l in text.splitlines() if "left after" in l][-1]
    fds = last.split(" fds=")[1].split()[0]
    before = last.split("before any consumer: fds=")[1].split()[0]
    assert fds == before, last


def test_real_server_drops_a_consumer_that_holds_too_long(frame_server):
    path, _, log = frame_server
    slow = cuda_interop._connect_host_ring(path, 2.0)
    kept = [slow.next(5.0)]  # held past --hold-timeout 2
    fast = cuda_interop._connect_host_ring(path, 2.0)
    got = 0
    deadline = time.monotonic() + 15
    while got < 10 and time.monotonic() < deadline:
        try:
            f = fast.next(5.0)
        except TimeoutError:
            continue
        got += 1
        f.release()
    assert got == 10, server_log(log)
    assert "longer than" in server_log(log)
    with pytest.raises(ConnectionError):
        while True:
            slow.next(1.0).release()
    del kept, slow, fast, f
    gc.collect()


def band_rows(frame, height):
    """protocol::band_rows: height / 16 rows (at least 1), 8 rows a frame."""
    rows = max(height // 16, 1)
    start = (frame * 8) % (height - rows + 1)
    return start, start + rows


def test_real_server_without_semaphores_is_read_on_the_host_as_numpy(frame_server):
    """Without CUDA and without semaphores (lavapipe), `connect` reads the
    host-visible ring on a Vulkan device of this process: each frame is a
    host (kDLCPU) array of its own that NumPy takes, with the sender's
    pattern in every pixel, and its slot is back with the sender already."""
    np = pytest.importorskip("numpy")  # CI installs python3-numpy
    path, _, log = frame_server
    with cuda_interop.connect(path, 2.0, delivery="lossless") as r:
        tags = []
        for _ in range(12):
            frame = r.next(5.0)
            assert frame.__dlpack_device__() == (1, 0)
            assert frame.slot is None and r.held == 0
            pixels = np.from_dlpack(frame)
            assert pixels.shape == (32, 64, 4) and pixels.dtype == np.uint8
            assert pixels.strides == (320, 4, 1)
            words = pixels.copy().view("<u4")[:, :, 0]
            f = frame.tag
            start, end = band_rows(f, 32)
            want = np.full((32, 64), f & 0xFFFFFFFF, dtype="<u4")
            want[start:end] = ~np.uint32(f & 0xFFFFFFFF)
            assert (words == want).all(), (f, start, end, server_log(log))
            tags.append(f)
            frame.release()  # nothing left to give back: a no-op
        assert tags == list(range(tags[0], tags[0] + 12))
        assert r.dropped == 0
        with pytest.raises(AttributeError, match="host"):
            r.next(5.0).__cuda_array_interface__


def test_real_server_serves_latest_and_lossless_receivers(frame_server):
    """Against the real sender: a lossless receiver gets every frame in
    order; a latest one gets frames whose numbers go up, and what it did
    not get is exactly what it counts as dropped (whatever the timing)."""
    path, _, log = frame_server
    lossless = cuda_interop._connect_host_ring(path, 2.0, delivery="lossless")
    latest = cuda_interop._connect_host_ring(path, 2.0, delivery="latest")
    tags = []
    for _ in range(10):
        with lossless.next(5.0) as f:
            tags.append(f.tag)
    assert tags == list(range(tags[0], tags[0] + 10)), server_log(log)
    assert lossless.dropped == 0
    seen = []
    for _ in range(10):
        with latest.next(5.0) as f:
            seen.append(f.tag)
        # The lossless one keeps up meanwhile (the sender waits for it).
        lossless.next(5.0).release()
    assert seen == sorted(set(seen)), seen
    assert latest.dropped == seen[-1] - seen[0] + 1 - len(seen)
    lossless.close()
    latest.close()


def test_connect_named_finds_a_sender_by_name(tmp_path, monkeypatch):
    """`connect_named` resolves a name in $XDG_RUNTIME_DIR's directory of
    senders; an unknown name is a ConnectionError that says so, a name that
    cannot be one a ValueError."""
    if not SERVER or not os.path.exists(SERVER):
        pytest.skip("CUDA_INTEROP_FRAME_SERVER (set by cargo xtask test) names no binary")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with pytest.raises(ConnectionError, match='no sender named "cam"'):
        cuda_interop.connect_named("cam", 1.0)
    with pytest.raises(ValueError, match="bad sender name"):
        cuda_interop.connect_named("../cam", 1.0)
    p = subprocess.Popen(
        [SERVER, "--name", "cam", "--width", "64", "--height", "32", "--row-pitch", "320",
         "--slots", "3", "--seconds", "60", "--host-visible", "--no-semaphores"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        env=dict(os.environ, XDG_RUNTIME_DIR=str(runtime)),
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = cuda_interop.connect_named("cam", 2.0, delivery="lossless")
                break
            except ConnectionError:
                assert time.monotonic() < deadline and p.poll() is None, "no sender"
                time.sleep(0.05)
        assert r.delivery == "lossless" and r.path.endswith(".sock")
        # Not the host-ring hook: the real ring, read on the host (it has no
        # semaphores), a kDLCPU frame of the sender's size.
        with r.next(5.0) as frame:
            assert frame.__dlpack_device__() == (1, 0)
            assert tuple(frame.shape) == (32, 64, 4) and frame.tag >= 1
        r.close()
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
