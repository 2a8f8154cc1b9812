"""CPU tests of the `cuda_interop` extension module (no GPU, no CUDA driver).

Run by `cargo xtask test`, which builds the module and puts it on PYTHONPATH
as target/python/cuda_interop.abi3.so.
"""

import ctypes
import gc
import os
import socket
import struct
import tempfile
import time

import pytest

import cuda_interop


@pytest.fixture
def listener():
    """A SOCK_SEQPACKET listener standing in for the Rust producer."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "producer.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.bind(path)
        s.listen(1)
        try:
            yield s, path
        finally:
            s.close()


MAGIC, VERSION, SUBSCRIBE = b"CIFR", 3, 4


def peer_thread(listener, then):
    """Accepts the one connection on a thread and runs `then(peer)` there
    (connect() takes the ring before it returns, so the fake peer must
    answer while it runs). Returns the thread, joined by the caller."""
    import threading

    s, _ = listener
    s.settimeout(5.0)

    def serve():
        peer, _ = s.accept()
        peer.settimeout(5.0)
        with peer:
            then(peer)

    t = threading.Thread(target=serve)
    t.start()
    return t


def test_import():
    assert callable(cuda_interop.connect)
    assert callable(cuda_interop.connect_named)
    assert callable(cuda_interop.list_senders)
    assert cuda_interop.Receiver.__name__ == "Receiver"
    assert cuda_interop.Frame.__name__ == "Frame"
    assert cuda_interop.SenderInfo.__name__ == "SenderInfo"
    assert isinstance(cuda_interop.__version__, str)
    assert cuda_interop.PROTOCOL_VERSION == 3


def test_connect_missing_path():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "nobody-listens.sock")
        with pytest.raises(ConnectionError) as info:
            cuda_interop.connect(path, timeout=1.0)
        assert path in str(info.value)


def test_bad_timeouts(listener):
    _, path = listener
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            cuda_interop.connect(path, timeout=bad)


def test_a_silent_peer_times_out_within_connects_timeout(listener):
    """connect() subscribes and waits for the ring, bounded by its timeout."""
    _, path = listener
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="did not send its ring"):
        cuda_interop.connect(path, timeout=0.3)
    assert 0.25 <= time.monotonic() - start < 1.5


def test_a_peer_that_is_no_frame_sender_is_read_as_wire_messages(listener):
    """A peer that answers the subscribe with something else than a frame
    packet is a producer of wire messages: its messages are refused one by
    one (ValueError), and the connection stays usable."""
    _, path = listener
    got = []

    def answer(peer):
        got.append(peer.recv(64))
        peer.send(b"\xde\xad\xbe\xef" * 4)  # taken while the protocol is told apart
        peer.send(b"\xde\xad\xbe\xef" * 4)
        time.sleep(1.0)

    t = peer_thread(listener, answer)
    try:
        receiver = cuda_interop.connect(path, timeout=2.0)
        assert receiver.layout is None and receiver.held == 0
        with pytest.raises(ValueError, match="bad magic"):
            receiver.next(timeout=1.0)
        with pytest.raises(TimeoutError):
            receiver.next(timeout=0.05)
    finally:
        t.join()
    # What it sent first: a protocol v3 subscribe.
    assert len(got[0]) == 48 and got[0][:4] == MAGIC
    assert struct.unpack_from("<HH", got[0], 4) == (VERSION, SUBSCRIBE)


def test_peer_closed_is_a_connection_error(listener):
    _, path = listener
    t = peer_thread(listener, lambda peer: None)  # accepts and closes
    try:
        with pytest.raises(ConnectionError, match="closed"):
            cuda_interop.connect(path, timeout=2.0)
    finally:
        t.join()


# The capsule protocol, on a host-memory frame (the test hook).

PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
PyCapsule_IsValid.restype = ctypes.c_int
PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
PyCapsule_GetPointer.restype = ctypes.c_void_p
PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
PyCapsule_SetName = ctypes.pythonapi.PyCapsule_SetName
PyCapsule_SetName.restype = ctypes.c_int
PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def test_versioned_capsule_not_consumed_frees_once():
    gc.collect()  # what earlier tests left for the collector
    before = cuda_interop._host_frames_alive()
    frame = cuda_interop._host_frame(64)
    assert frame.__dlpack_device__() == (1, 0)
    capsule = frame.__dlpack__(max_version=(1, 0))
    assert PyCapsule_IsValid(capsule, b"dltensor_versioned") == 1
    m = DLManagedTensorVersioned.from_address(
        PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    )
    t = m.dl_tensor
    assert (m.major, m.minor) == (1, 0)
    assert (t.device_type, t.ndim, t.code, t.bits, t.lanes) == (1, 1, 1, 8, 1)
    assert (t.shape[0], t.strides[0], t.byte_offset) == (64, 1, 0)
    assert ctypes.string_at(t.data, 4) == b"\x00\x01\x02\x03"
    assert not frame.available
    with pytest.raises(BufferError):
        frame.__dlpack__(max_version=(1, 0))
    assert cuda_interop._host_frames_alive() == before + 1
    del capsule, m, t
    gc.collect()
    assert cuda_interop._host_frames_alive() == before


def test_consumed_capsule_is_left_to_the_consumer():
    gc.collect()  # what earlier tests left for the collector
    before = cuda_interop._host_frames_alive()
    capsule = cuda_interop._host_frame(8).__dlpack__(max_version=(1, 0))
    pointer = PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    # What a consumer does: take the pointer and rename the capsule.
    assert PyCapsule_SetName(capsule, b"used_dltensor_versioned") == 0
    del capsule
    gc.collect()
    assert cuda_interop._host_frames_alive() == before + 1
    # The consumer's one call of the deleter frees it.
    m = DLManagedTensorVersioned.from_address(pointer)
    DELETER(m.deleter)(pointer)
    assert cuda_interop._host_frames_alive() == before


def test_legacy_capsule_without_max_version():
    gc.collect()  # what earlier tests left for the collector
    before = cuda_interop._host_frames_alive()
    capsule = cuda_interop._host_frame(8).__dlpack__()
    assert PyCapsule_IsValid(capsule, b"dltensor") == 1
    del capsule
    gc.collect()
    assert cuda_interop._host_frames_alive() == before


def test_release_and_context_manager():
    gc.collect()  # what earlier tests left for the collector
    before = cuda_interop._host_frames_alive()
    with cuda_interop._host_frame(8) as frame:
        assert frame.available
        assert cuda_interop._host_frames_alive() == before + 1
    assert not frame.available
    assert cuda_interop._host_frames_alive() == before
    frame.release()  # idempotent
    with pytest.raises(BufferError):
        frame.__dlpack__(max_version=(1, 0))


def test_dlpack_arguments():
    frame = cuda_interop._host_frame(8)
    with pytest.raises(BufferError):
        frame.__dlpack__(max_version=(1, 0), copy=True)
    with pytest.raises(BufferError):
        frame.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    assert frame.available
    frame.release()
