"""CPU tests of frame receiving (no GPU) against the real `frame_server`
example on lavapipe (host-visible memory, no semaphores), whose path
`cargo xtask test` passes in CUDA_INTEROP_FRAME_SERVER: host rings read
into NumPy through `connect`, and the `_connect_recording` test hook (the
real session, with host memory standing in for CUDA slots and "released"
signals recorded) for the stream rules of CUDA frames.
"""

import ctypes
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import weakref

import pytest

import cuda_interop

from frame_server_process import FrameServerProcess, need_server
from test_module import DLManagedTensorVersioned, PyCapsule_GetPointer

# Fake stream handles for the recording rings: addresses of readable
# memory, since the module refuses a handle that cannot be a stream (the
# first page, an address nothing readable is mapped at).
_STREAM_MEMORY = ctypes.create_string_buffer(4096)
S = [ctypes.addressof(_STREAM_MEMORY) + 64 * i for i in range(8)]

WIDTH, HEIGHT, PITCH = 64, 32, 320


class Server(FrameServerProcess):
    """A frame_server process serving a host-visible ring without
    semaphores (what lavapipe can export)."""

    def __init__(self, directory, *extra, name=None, env=None):
        self.path = os.path.join(directory, "frames.sock")
        where = ["--name", name] if name else ["--socket", self.path]
        super().__init__(
            os.path.join(directory, f"server-{name or 'socket'}.log"),
            [*where, "--width", str(WIDTH), "--height", str(HEIGHT),
             "--row-pitch", str(PITCH), "--slots", "4", "--seconds", "120",
             "--host-visible", "--no-semaphores", *extra],
            env=env,
        )

    def wait_listening(self):
        # The socket file exists from the bind, before the listen: the
        # sender's line says when it listens.
        return self.wait_for("listening on")


@pytest.fixture
def server(tmp_path):
    """A sender with a 30 s hold timeout, as fast as its receivers take frames."""
    s = Server(str(tmp_path), "--hold-timeout", "30").wait_listening()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def strict_server(tmp_path):
    """A sender that drops a receiver holding a frame for 0.5 s."""
    s = Server(str(tmp_path), "--hold-timeout", "0.5").wait_listening()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def slow_server(tmp_path):
    """A sender of 2 frames a second."""
    s = Server(str(tmp_path), "--hold-timeout", "30", "--fps", "2").wait_listening()
    try:
        yield s
    finally:
        s.stop()


def band_rows(frame, height):
    """The demo pattern's band: height / 16 rows (at least 1), 8 rows a frame."""
    rows = max(height // 16, 1)
    start = (frame * 8) % (height - rows + 1)
    return start, start + rows


def check_pattern(np, pixels, f):
    words = pixels.copy().view("<u4")[:, :, 0]
    start, end = band_rows(f, HEIGHT)
    want = np.full((HEIGHT, WIDTH), f & 0xFFFFFFFF, dtype="<u4")
    want[start:end] = ~np.uint32(f & 0xFFFFFFFF)
    return (words == want).all()


# Host rings, read into NumPy.


def test_a_ring_without_semaphores_is_read_on_the_host_as_numpy(server):
    """Without semaphores (lavapipe), `connect` reads the host-visible ring
    on a Vulkan device of this process: each frame is a host (kDLCPU) array
    of its own that NumPy takes, with the sender's pattern in every pixel,
    and its slot is back with the sender already."""
    np = pytest.importorskip("numpy")  # Debian: python3-numpy
    with cuda_interop.connect(server.path, 5.0, delivery="lossless") as r:
        assert r.layout == (4, WIDTH, HEIGHT, PITCH) and r.delivery == "lossless"
        assert r.format == "r8g8b8a8_unorm" and r.chroma_row is None
        assert server.path in repr(r)
        tags = []
        for _ in range(12):
            frame = r.next(5.0)
            assert frame.__dlpack_device__() == (1, 0)
            assert frame.slot is None and r.held == 0
            pixels = np.from_dlpack(frame)
            assert pixels.shape == (HEIGHT, WIDTH, 4) and pixels.dtype == np.uint8
            assert pixels.strides == (PITCH, 4, 1)
            assert check_pattern(np, pixels, frame.tag), (frame.tag, server.text())
            tags.append(frame.tag)
            frame.release()  # nothing left to give back: a no-op
        assert tags == list(range(tags[0], tags[0] + 12))
        assert r.dropped == 0 and r.received == 12
        with pytest.raises(AttributeError, match="host"):
            r.next(5.0).__cuda_array_interface__
        with pytest.raises(ValueError, match="no stream"):
            r.next(5.0).__dlpack__(stream=S[0])
    with pytest.raises(ConnectionError, match="was closed"):
        r.next(1.0)


@pytest.mark.parametrize("fmt,sample_bytes", [("nv12", 1), ("p010", 2)])
def test_a_planar_ring_frame_is_one_tensor_of_both_planes(tmp_path, fmt, sample_bytes):
    """An NV12 or P010 ring (frame_server --format): each frame is one
    `(height * 3 / 2, width)` array of its samples with pitched rows, the
    luma plane then the chroma plane; both planes are views of it (the
    chroma one as `(height / 2, width / 2, 2)` Cb, Cr pairs), and carry the
    demo pattern of the frame's own number (the band in the luma plane, the
    chroma plane the background)."""
    np = pytest.importorskip("numpy")  # Debian: python3-numpy
    s = Server(str(tmp_path), "--hold-timeout", "30", "--format", fmt).wait_listening()
    try:
        with cuda_interop.connect(s.path, 5.0, delivery="lossless") as r:
            assert r.format == fmt and r.chroma_row == HEIGHT
            for _ in range(6):
                frame = r.next(5.0)
                t = np.from_dlpack(frame)
                assert t.dtype == np.dtype("uint8" if sample_bytes == 1 else "<u2")
                assert t.shape == (HEIGHT * 3 // 2, WIDTH)
                assert t.strides == (PITCH, sample_bytes)
                luma = t[:HEIGHT]
                chroma = t[r.chroma_row:].reshape(HEIGHT // 2, WIDTH // 2, 2)
                assert np.shares_memory(luma, t) and np.shares_memory(chroma, t)
                f = frame.tag & 0xFFFFFFFF
                start, end = band_rows(frame.tag, HEIGHT)
                words = luma.copy().view("<u4")
                want = np.full(words.shape, f, dtype="<u4")
                want[start:end] = ~np.uint32(f)
                assert (words == want).all(), (frame.tag, fmt)
                rows = chroma.copy().reshape(HEIGHT // 2, -1)
                assert (rows.view("<u4") == f).all(), (frame.tag, fmt)
                frame.release()
    finally:
        s.stop()


def test_latest_and_lossless_receivers(server):
    """A lossless receiver gets every frame in order; a latest one gets
    frames whose numbers go up, and what it did not get is exactly what it
    counts as dropped (whatever the timing)."""
    with cuda_interop.connect(server.path, 5.0, delivery="lossless") as lossless, \
            cuda_interop.connect(server.path, 5.0, delivery="latest") as latest:
        tags = [lossless.next(5.0).tag for _ in range(10)]
        assert tags == list(range(tags[0], tags[0] + 10)), server.text()
        seen = []
        for _ in range(10):
            seen.append(latest.next(5.0).tag)
            lossless.next(5.0)  # keeps up meanwhile (the sender waits for it)
        assert seen == sorted(set(seen)), seen
        assert latest.dropped == seen[-1] - seen[0] + 1 - len(seen)
        assert lossless.dropped == 0


def test_next_is_bounded_while_the_sender_floods(server):
    """Whatever the sender does, next(t) returns (a frame or TimeoutError)
    within t, and other Python threads run meanwhile (GIL released)."""
    ticks, stop = [], threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.002)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        with cuda_interop.connect(server.path, 5.0, delivery="lossless") as flood, \
                cuda_interop.connect(server.path, 5.0, delivery="latest") as r:
            worst, got, last = 0.0, 0, 0
            start_all = time.monotonic()
            for i in range(200):
                timeout = (0.0, 0.001, 0.01, 0.05)[i % 4]
                flood.next(5.0)  # the sender presents as fast as this takes them
                start = time.monotonic()
                try:
                    tag = r.next(timeout).tag
                    assert tag > last
                    last, got = tag, got + 1
                except TimeoutError:
                    pass
                worst = max(worst, time.monotonic() - start - timeout)
            assert worst < 0.1, worst
            assert got > 0
            total = time.monotonic() - start_all
    finally:
        stop.set()
        t.join()
    assert len(ticks) > total / 0.002 / 10, (len(ticks), total)


def test_next_is_interruptible(slow_server):
    """Ctrl-C (SIGINT) during a long next() raises KeyboardInterrupt at
    once, and the receiver goes on afterwards."""
    with cuda_interop.connect(slow_server.path, 5.0, delivery="latest") as r:
        r.next(5.0)
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        start = time.monotonic()
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                r.next(30.0)
        finally:
            timer.cancel()
        assert time.monotonic() - start < 1.0
        assert r.next(5.0).tag >= 1


def test_next_on_two_threads(server):
    """Two threads' next() calls share the session: each frame goes to one
    of them, in order, and a call keeps its own timeout while the other
    receives."""
    with cuda_interop.connect(server.path, 5.0, delivery="lossless") as r:
        tags, errors = [[], []], []

        def take(mine):
            try:
                for _ in range(30):
                    mine.append(r.next(5.0).tag)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=take, args=(tags[i],)) for i in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert errors == []
        every = sorted(tags[0] + tags[1])
        assert every == list(range(every[0], every[0] + 60))
        assert tags[0] == sorted(tags[0]) and tags[1] == sorted(tags[1])


def test_a_lossless_receiver_that_stops_taking_frames_is_dropped_with_the_reason(strict_server):
    """A lossless receiver's frames count as held from when the sender sends
    them: one that stops calling next() for longer than the hold timeout is
    dropped, and next() then says why, never handing out a frame from
    before the drop."""
    with cuda_interop.connect(strict_server.path, 5.0, delivery="lossless") as r:
        r.next(5.0)
        time.sleep(1.5)
        for _ in range(3):
            with pytest.raises(ConnectionError, match="longer than the sender's hold timeout") as e:
                r.next(1.0)
            assert "frame.release()" in str(e.value)
    assert "longer than" in strict_server.text()


def test_a_frame_held_past_the_hold_timeout_raises_on_release(strict_server):
    """A ring frame held too long: the sender drops the receiver; the
    release says so (the frame's memory may hold a later frame by now),
    every next() says why, and the frame counts as released."""
    r = cuda_interop._connect_recording(strict_server.path, 5.0, delivery="lossless")
    frame = r.next(5.0)
    assert r.held == 1
    time.sleep(1.5)
    with pytest.raises(ConnectionError, match="held frame .* longer than"):
        frame.release()
    frame.release()  # idempotent: released
    assert not frame.available and r.held == 0
    for _ in range(3):
        with pytest.raises(ConnectionError, match="longer than"):
            r.next(1.0)
    # A frame handed out then dropped after the drop: no warning, no error.
    r.close()


# Discovery.


def named_server(tmp_path, name, runtime):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime))
    return Server(str(tmp_path), "--hold-timeout", "30", name=name, env=env)


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime


def test_list_senders(tmp_path, runtime):
    need_server()
    assert cuda_interop.list_senders() == []
    s = named_server(tmp_path, "cam", runtime)
    try:
        deadline = time.monotonic() + 30
        while not (found := cuda_interop.list_senders()):
            assert time.monotonic() < deadline and s.process.poll() is None, s.text()
            time.sleep(0.05)
        [info] = found
        assert isinstance(info, cuda_interop.SenderInfo)
        assert (info.name, info.width, info.height, info.row_pitch) == ("cam", WIDTH, HEIGHT, PITCH)
        assert (info.kind, info.slots, info.pid) == ("buffer", 4, s.process.pid)
        assert info.format in ("r8g8b8a8_unorm", "rgba8"), info.format
        assert isinstance(info.fps, float) and info.fps >= 0
        assert info.socket.endswith("cam.sock") and os.path.exists(info.socket)
        assert '"cam"' in repr(info)
        with pytest.raises(AttributeError):
            info.name = "other"  # read-only
    finally:
        s.stop()
    assert cuda_interop.list_senders() == []


def test_connect_named_waits_for_the_sender_to_appear(tmp_path, runtime):
    """`connect_named` waits up to its timeout for the name: the sender
    starts after the call began."""
    need_server()
    started = []

    def start_later():
        time.sleep(0.5)
        started.append(named_server(tmp_path, "late", runtime))

    t = threading.Thread(target=start_later)
    begin = time.monotonic()
    t.start()
    try:
        with cuda_interop.connect_named("late", 30.0, delivery="lossless") as r:
            assert time.monotonic() - begin >= 0.5
            assert r.delivery == "lossless" and r.path.endswith("late.sock")
            frame = r.next(5.0)
            assert frame.__dlpack_device__() == (1, 0) and frame.shape == (HEIGHT, WIDTH, 4)
    finally:
        t.join()
        for s in started:
            s.stop()


def test_connect_named_errors(runtime):
    start = time.monotonic()
    with pytest.raises(ConnectionError, match='no sender named "cam"'):
        cuda_interop.connect_named("cam", 0.0)
    with pytest.raises(ConnectionError, match="after waiting"):
        cuda_interop.connect_named("cam", 0.3)
    assert time.monotonic() - start < 2.0
    with pytest.raises(ValueError, match="bad sender name"):
        cuda_interop.connect_named("../cam", 1.0)


def test_an_image_ring_without_semaphores_is_refused_with_what_to_do(tmp_path):
    s = Server(str(tmp_path), "--image")
    try:
        s.wait_listening()
        with pytest.raises(ValueError, match="images and no semaphores"):
            cuda_interop.connect(s.path, 5.0)
    finally:
        s.stop()


# The stream rules of ring frames, on the recording test hook.


def recording(server, delivery="latest"):
    return cuda_interop._connect_recording(server.path, 5.0, delivery=delivery)


class FakeStream:
    """A stream object as torch and CuPy have: an int `ptr`. Its finalizer
    notes how many signals were made by then (the stream is "destroyed")."""

    def __init__(self, handle, receiver, seen):
        self.ptr = handle
        self.receiver = receiver
        self.seen = seen

    def __del__(self):
        self.seen.append(len(cuda_interop._signals(self.receiver)))


def test_layout_shape_strides_and_capsule(server):
    gc.collect()
    before = cuda_interop._host_frames_alive()
    r = recording(server)
    assert cuda_interop._host_frames_alive() == before + 4  # its slots
    frame = r.next(5.0)
    assert frame.shape == (HEIGHT, WIDTH, 4) and frame.strides == (PITCH, 4, 1)
    assert frame.nbytes == (HEIGHT - 1) * PITCH + WIDTH * 4
    assert frame.__dlpack_device__() == (1, 0) and r.held == 1
    slot = frame.slot
    assert 0 <= slot < 4 and f"slot={slot}" in repr(frame)
    capsule = frame.__dlpack__(max_version=(1, 0))
    m = DLManagedTensorVersioned.from_address(PyCapsule_GetPointer(capsule, b"dltensor_versioned"))
    t = m.dl_tensor
    assert (t.ndim, t.code, t.bits, t.lanes, t.byte_offset) == (3, 1, 8, 1, 0)
    assert [t.shape[i] for i in range(3)] == [HEIGHT, WIDTH, 4]
    assert [t.strides[i] for i in range(3)] == [PITCH, 4, 1]
    # The stand-in slot's bytes are (index + slot) mod 256.
    assert ctypes.string_at(t.data + 2 * PITCH + 13, 1)[0] == (2 * PITCH + 13 + slot) % 256
    with pytest.raises(BufferError):
        frame.__dlpack__(max_version=(1, 0))  # handed out once
    del m, t
    frame.release()
    assert r.held == 0
    r.close()
    del frame, r
    gc.collect()
    # The capsule still owns its slot's memory (the other slots are freed).
    assert cuda_interop._host_frames_alive() == before + 1
    del capsule
    gc.collect()
    assert cuda_interop._host_frames_alive() == before


def test_release_once_by_drop_and_by_with(server):
    r = recording(server, "lossless")
    a, b, c = (r.next(5.0) for _ in range(3))
    assert r.held == 3
    a.release()
    a.release()  # idempotent
    assert r.held == 2
    with b:
        pass
    assert not b.available and r.held == 1
    del c  # dropped unreleased: released by its destructor
    gc.collect()
    assert r.held == 0 and cuda_interop._signals(r) == []
    r.close()


def test_interface_dict(server):
    r = recording(server)
    frame = r.next(5.0)
    d = frame.__cuda_array_interface__
    assert d["shape"] == (HEIGHT, WIDTH, 4) and d["strides"] == (PITCH, 4, 1)
    assert d["typestr"] == "|u1" and d["descr"] == [("", "|u1")] and d["version"] == 3
    assert d["stream"] is None  # no CUDA stream to order after here
    data, read_only = d["data"]
    assert data != 0 and read_only is False
    frame.release(stream=-1)
    with pytest.raises(BufferError):
        frame.__cuda_array_interface__
    r.close()


def test_stream_arguments(server):
    r = recording(server)
    frame = r.next(5.0)
    with pytest.raises(ValueError, match="ambiguous"):
        frame.__dlpack__(stream=0)
    with pytest.raises(TypeError):
        frame.release(stream="fast")
    with pytest.raises(ValueError):
        frame.release(stream=-7)
    assert frame.available
    frame.release(stream=-1)
    assert cuda_interop._signals(r) == []
    r.close()


def test_release_signals_on_the_stream_the_frame_was_handed_out_on(server):
    r = recording(server, "lossless")
    legacy, nosync, bare = (r.next(5.0) for _ in range(3))
    legacy.__dlpack__()  # None: the legacy default stream (1), remembered
    legacy.release()
    nosync.__dlpack__(stream=-1)  # no ordering, nothing to signal after
    nosync.release()
    bare.__dlpack__(stream=S[0])  # a bare handle is used for the hand-out only
    with pytest.raises(ValueError, match="bare handle"):
        bare.release()
    assert r.held == 1
    bare.release(stream=S[1])
    assert cuda_interop._signals(r) == [(legacy.slot, legacy.tag, 1), (bare.slot, bare.tag, S[1])]
    r.close()


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


def test_a_handle_that_cannot_be_a_stream_is_refused_before_the_driver(server):
    """Handles in the first page other than 1 and 2, and addresses with
    nothing readable mapped, are refused with ValueError, before any
    signal, and the frame stays usable."""
    r = recording(server)
    frame = r.next(5.0)
    for bad in [3, 4, 0xFFF, *unreadable_addresses()]:
        with pytest.raises(ValueError, match="cannot be a CUDA stream handle"):
            frame.__dlpack__(stream=bad)
        with pytest.raises(ValueError, match="cannot be a CUDA stream handle"):
            frame.__dlpack__(stream=FakeStream(bad, r, []))
        with pytest.raises(ValueError, match="cannot be a CUDA stream handle"):
            frame.release(stream=bad)
    assert frame.available and r.held == 1
    assert cuda_interop._signals(r) == []
    frame.__dlpack__(stream=2)  # 1, 2 and readable memory pass
    frame.release(stream=S[7])
    assert cuda_interop._signals(r) == [(frame.slot, frame.tag, S[7])]
    r.close()


def test_a_stream_object_is_kept_alive_until_the_release_that_uses_it(server):
    r = recording(server, "lossless")
    seen = []
    a, b = r.next(5.0), r.next(5.0)
    stream = FakeStream(S[2], r, seen)
    a.__dlpack__(stream=stream)
    del stream
    gc.collect()
    assert seen == [], "the frame holds the stream object"
    a.release()
    gc.collect()
    assert seen == [1], "let go after the release that used it"
    # Dropped unreleased: the signal is made before the object goes.
    stream = FakeStream(S[3], r, seen)
    b.__dlpack__(stream=stream)
    slot, tag = b.slot, b.tag
    del stream, b
    gc.collect()
    assert cuda_interop._signals(r) == [(a.slot, a.tag, S[2]), (slot, tag, S[3])]
    assert seen == [1, 2] and r.held == 0
    r.close()


def test_a_per_thread_stream_object_is_not_reused(server):
    """Handle 2 names the calling thread's default stream (CuPy's
    `Stream.ptds` is such an object): as a bare handle, never reused."""
    r = recording(server)
    frame = r.next(5.0)
    frame.__dlpack__(stream=FakeStream(2, r, []))
    with pytest.raises(ValueError, match="bare handle"):
        frame.release()
    frame.release(stream=-1)
    assert cuda_interop._signals(r) == []
    r.close()


def test_leaving_with_after_a_bare_handle(server):
    """Without an exception, leaving `with` raises ValueError (the stream
    must be named) and the frame stays held until released or dropped;
    with one, the block's exception wins and the slot goes back unordered,
    with a RuntimeWarning."""
    r = recording(server)
    with pytest.raises(ValueError, match="bare handle"):
        with r.next(5.0) as frame:
            frame.__dlpack__(stream=S[0])
    assert r.held == 1
    with pytest.warns(RuntimeWarning, match="given back unreleased"):
        del frame
        gc.collect()
    assert r.held == 0
    with pytest.warns(RuntimeWarning, match="given back unreleased"):
        with pytest.raises(KeyError, match="the body's own"):
            with r.next(5.0) as frame:
                frame.__dlpack__(stream=S[0])
                raise KeyError("the body's own")
    assert r.held == 0 and not frame.available and frame.slot is not None
    assert cuda_interop._signals(r) == []
    with pytest.raises(BufferError, match="released"):
        frame.__cuda_array_interface__
    r.close()


def test_a_cycle_through_the_stream_object_is_not_collected(server):
    """The collector would run the stream's `__del__` (CuPy destroys its
    stream there) before the frame's release could order after it, so the
    frame hides the edge: the cycle stays, and breaking it releases the
    frame on the stream, which goes afterwards."""
    r = recording(server)
    seen = []
    frame = r.next(5.0)
    slot, tag = frame.slot, frame.tag
    stream = FakeStream(S[4], r, seen)
    stream.frame = frame  # frame -> stream -> frame
    frame.__dlpack__(stream=stream)
    alive = weakref.ref(stream)
    del stream, frame
    gc.collect()
    assert alive() is not None and seen == [] and r.held == 1
    alive().frame = None  # the application breaks the cycle
    gc.collect()
    assert cuda_interop._signals(r) == [(slot, tag, S[4])]
    assert seen == [1] and r.held == 0
    r.close()


def test_frames_after_close_are_the_senders_again(server):
    """After Receiver.close() the sender has taken every slot back:
    releases (and leaving `with`) are no-ops, nothing is signalled."""
    r = recording(server, "lossless")
    a, b = r.next(5.0), r.next(5.0)
    a.__dlpack__()
    r.close()
    assert r.held == 0
    a.release()
    with b:
        pass
    assert cuda_interop._signals(r) == []
    with pytest.raises(ConnectionError, match="was closed"):
        r.next(1.0)


def test_a_frame_read_through_the_array_interface_must_name_its_stream(server):
    """`__cuda_array_interface__` does not tell the consumer's stream: a
    release must name it (or -1); a drop gives the slot back unordered, with
    a RuntimeWarning, which a filter that makes warnings errors sends to
    sys.unraisablehook instead of losing it."""
    import warnings

    r = recording(server, "lossless")
    frame = r.next(5.0)
    assert frame.__cuda_array_interface__["shape"] == (HEIGHT, WIDTH, 4)
    with pytest.raises(ValueError, match="__cuda_array_interface__"):
        frame.release()
    frame.release(stream=S[5])
    first = (frame.slot, frame.tag, S[5])
    frame = r.next(5.0)
    frame.__cuda_array_interface__
    seen = []
    hook, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            del frame
            gc.collect()
    finally:
        sys.unraisablehook = hook
    assert r.held == 0
    assert len(seen) == 1 and isinstance(seen[0].exc_value, RuntimeWarning)
    assert cuda_interop._signals(r) == [first]
    r.close()


def test_one_consumer_protocol_per_frame(server):
    r = recording(server, "lossless")
    a, b = r.next(5.0), r.next(5.0)
    a.__cuda_array_interface__
    a.__cuda_array_interface__  # again: the same consumer
    with pytest.raises(BufferError, match="__cuda_array_interface__"):
        a.__dlpack__(stream=S[0])
    b.__dlpack__(stream=S[0])
    with pytest.raises(BufferError, match="__dlpack__"):
        b.__cuda_array_interface__
    a.release(stream=-1)
    b.release(stream=S[6])
    assert cuda_interop._signals(r) == [(b.slot, b.tag, S[6])]
    r.close()


def test_a_frame_dropped_after_the_sender_left_is_quiet_and_next_says_why(server):
    r = recording(server)
    frame = r.next(5.0)
    server.process.kill()
    server.process.wait(5)
    start = time.monotonic()
    del frame  # its release fails: nobody to tell, nothing raised
    gc.collect()
    assert time.monotonic() - start < 1.0
    with pytest.raises(ConnectionError, match="closed"):
        r.next(1.0)


def exit_while_holding(server, holding_lines):
    """Runs a child that receives a frame of a recording ring, runs
    `holding_lines` (Python, with `f` the frame), prints "holding", waits
    for a line on stdin and exits; the sender is killed before that line.
    Returns the child's exit status and stderr."""
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, cuda_interop\n"
         f"r = cuda_interop._connect_recording({server.path!r}, 5.0)\n"
         "f = r.next(5.0)\n"
         + "".join(line + "\n" for line in holding_lines)
         + "print('holding', flush=True)\n"
         "sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert child.stdout.readline().strip() == "holding", child.communicate(timeout=10)
    server.process.kill()
    server.process.wait(5)
    _, err = child.communicate("\n", timeout=10)
    return child.returncode, err


def test_a_frame_alive_at_exit_whose_release_fails_exits_quietly(server):
    """A frame kept in a global is given back while the interpreter shuts
    down; its release fails (the sender left): no panic, no traceback."""
    status, err = exit_while_holding(server, [])
    assert status == 0, err
    assert "panicked" not in err and "Traceback" not in err, err


def test_a_capsule_alive_at_exit_is_freed_without_a_crash(server):
    """An unconsumed capsule in a global is destroyed while the interpreter
    shuts down, when nothing may attach to it: its deleter runs in place."""
    status, err = exit_while_holding(server, [
        "cap = f.__dlpack__(max_version=(1, 0))",
        "legacy = cuda_interop._host_frame(16).__dlpack__()",
    ])
    assert status == 0, err
    assert "panicked" not in err, err


def test_two_receivers_and_a_killed_one(server):
    """A receiver in another process killed mid-stream: the sender gives
    its slots back and keeps serving the other; both leave with the
    sender's fds back where they started."""
    victim = subprocess.Popen(
        [sys.executable, "-c",
         "import cuda_interop\n"
         f"r = cuda_interop.connect({server.path!r}, 5.0, delivery='lossless')\n"
         "print('running', r.next(5.0).tag, flush=True)\n"
         "while True:\n"
         "    r.next(5.0)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert victim.stdout.readline().startswith("running")
        with cuda_interop.connect(server.path, 5.0, delivery="lossless") as a:
            seen = [a.next(5.0).tag for _ in range(20)]
            victim.kill()
            victim.wait(5)
            seen += [a.next(5.0).tag for _ in range(50)]
            assert seen == list(range(seen[0], seen[0] + 70))
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and server.text().count("left after") < 2:
        time.sleep(0.1)
    text = server.text()
    assert text.count("left after") == 2, text
    # The one that left last (none left after it): the sender may notice
    # the killed one after the other, on a busy machine.
    last = [line for line in text.splitlines()
            if "left after" in line and "consumers=0 " in line]
    assert len(last) == 1, text
    last = last[0]
    fds = last.split(" fds=")[1].split()[0]
    before = last.split("before any consumer: fds=")[1].split()[0]
    assert fds == before, last


# Multi-image rings (frame_server --with-depth): a frame is a dict of
# tensors, all of one present.


class DepthServer(FrameServerProcess):
    """frame_server --with-depth: colour (RGBA8), depth (R32_SFLOAT) and
    segmentation (R32_UINT) images a slot, 3 slots, host-visible, no
    semaphores."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "depth.sock")
        super().__init__(
            os.path.join(directory, "server-depth.log"),
            ["--socket", self.path, "--width", str(WIDTH), "--height", str(HEIGHT),
             "--with-depth", "--seconds", "120", "--hold-timeout", "30",
             "--host-visible", "--no-semaphores"],
        )


@pytest.fixture
def depth_server(tmp_path):
    s = DepthServer(str(tmp_path)).wait_for("listening on")
    try:
        yield s
    finally:
        s.stop()


def test_multi_image_frames_are_dicts_of_tensors(depth_server):
    gc.collect()
    before = cuda_interop._host_frames_alive()
    r = cuda_interop._connect_recording(depth_server.path, 5.0, delivery="lossless")
    # The stand-in ring: 3 slots, and 3 parts of each.
    assert cuda_interop._host_frames_alive() == before + 3 + 9
    frame = r.next(5.0)
    names = ["color", "depth", "segmentation"]
    assert frame.part_names == names
    # Not one tensor.
    with pytest.raises(BufferError, match="tensors"):
        frame.__dlpack__()
    with pytest.raises(BufferError, match="tensors"):
        frame.__cuda_array_interface__
    parts = frame.tensors()
    assert sorted(parts) == sorted(names)
    with pytest.raises(BufferError):
        frame.tensors()  # handed out once
    # (DLPack type code, bits, channels) of each part.
    kinds = {"color": (1, 8, 4), "depth": (2, 32, 1), "segmentation": (1, 32, 1)}
    slot = frame.slot
    for p, name in enumerate(names):
        part = parts[name]
        assert part.name == name and part.__dlpack_device__() == (1, 0)
        code, bits, channels = kinds[name]
        assert part.shape == (HEIGHT, WIDTH, channels)
        capsule = part.__dlpack__(max_version=(1, 0))
        m = DLManagedTensorVersioned.from_address(
            PyCapsule_GetPointer(capsule, b"dltensor_versioned"))
        t = m.dl_tensor
        assert (t.ndim, t.code, t.bits, t.lanes) == (3, code, bits, 1)
        assert [t.shape[i] for i in range(3)] == [HEIGHT, WIDTH, channels]
        assert [t.strides[i] for i in range(3)] == [WIDTH * channels, channels, 1]
        # The stand-in part's bytes are (index + slot + 64 * part) mod 256.
        for at in (0, 7, WIDTH * 4 * HEIGHT - 1):
            want = (at + slot + 64 * p) % 256
            assert ctypes.string_at(t.data + at, 1)[0] == want, (name, at)
        with pytest.raises(BufferError, match="already handed out"):
            part.__dlpack__()
        del m, t, capsule
    frame.release()
    assert r.held == 0
    # A part's consumer must pass the stream the frame was ordered on.
    stream = FakeStream(ctypes.addressof(_STREAM_MEMORY), r, [])
    frame = r.next(5.0)
    parts = frame.tensors(stream=stream)
    with pytest.raises(BufferError, match="ordered on stream"):
        parts["depth"].__dlpack__()
    parts["depth"].__dlpack__(stream=stream)
    frame.release()
    # The release ordered after that stream, once for the whole frame.
    assert cuda_interop._signals(r)[-1][1:] == (frame.tag, stream.ptr)
    r.close()
    del frame, parts, r, stream
    gc.collect()
    assert cuda_interop._host_frames_alive() == before


def test_a_part_is_not_exported_after_its_frame_was_released(depth_server):
    """A part no consumer took before frame.release() is gone with the
    frame: its slot is the sender's again (the adversarial review of stop
    35 exported one after the release); one taken before stays valid."""
    r = cuda_interop._connect_recording(depth_server.path, 5.0, delivery="lossless")
    frame = r.next(5.0)
    parts = frame.tensors()
    taken = parts["color"].__dlpack__()
    frame.release()
    assert r.held == 0
    for name in ("depth", "segmentation"):
        with pytest.raises(BufferError, match="released"):
            parts[name].__dlpack__()
    # A frame given back by its drop (no release call) revokes them too.
    frame = r.next(5.0)
    parts = frame.tensors()
    del frame
    gc.collect()
    with pytest.raises(BufferError, match="released"):
        parts["depth"].__dlpack__()
    del taken, parts
    r.close()
