"""CPU tests of python/examples/ray_pipeline.py: frames from the real
`frame_server` example (lavapipe, host-visible ring, no semaphores; its path
in CUDA_INTEROP_FRAME_SERVER, as for test_frames.py) through a Ray actor
pipeline, a receiving actor `ray.put`ting NumPy frames for a processing
actor that checks every pixel.

Ray is not in the normal pytest run: `cargo xtask test` runs this file alone
with the interpreter of its own virtual environment, target/xtask-ray (Ray
pinned there, see xtask/src/ray_env.rs), and leaves it out of the other run
(`--ignore`). Run by hand without Ray, it skips and says why.

Every wait is bounded: the pipeline's own (`next(timeout)`, `ray.get(...,
timeout)`), the server's (`--seconds`), and the subprocess's.
"""

import os
import subprocess
import sys
import threading
import time

import pytest

ray = pytest.importorskip(
    "ray", reason="Ray is not installed (cargo xtask test runs this file in target/xtask-ray)")
np = pytest.importorskip("numpy")

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
EXAMPLE = os.path.join(EXAMPLES, "ray_pipeline.py")
sys.path.insert(0, EXAMPLES)
import ray_pipeline  # noqa: E402
from frame_server_process import FrameServerProcess  # noqa: E402

WIDTH, HEIGHT = 256, 128


class NamedServer(FrameServerProcess):
    """frame_server announcing a host-visible ring without semaphores (what
    lavapipe can export) by `name`, presenting only once a receiver has
    subscribed (so a lossless receiver sees every frame from the first)."""

    def __init__(self, directory, name, *extra):
        self.name = name
        super().__init__(
            os.path.join(directory, f"server-{name}.log"),
            ["--name", name, "--width", str(WIDTH), "--height", str(HEIGHT),
             "--slots", "4", "--seconds", "120", "--hold-timeout", "30",
             "--wait-for-receivers", "1", "--host-visible", "--no-semaphores", *extra],
        )
        self.wait_for("announced as")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray instance (2 CPUs, no dashboard, loopback only) whose
    workers find the example module and share this run's directory of
    senders."""
    runtime = tmp_path_factory.mktemp("run")
    runtime.chmod(0o700)
    saved = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "PYTHONPATH")}
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (EXAMPLES, saved["PYTHONPATH"]) if p)
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        yield runtime
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def server(cluster, tmp_path):
    servers = []

    def start(name, *extra):
        servers.append(NamedServer(str(tmp_path), name, *extra))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def test_every_pixel_of_every_lossless_frame_is_checked_by_the_processing_actor(server):
    s = server("ray-lossless")
    frames = 60
    out = ray_pipeline.run_pipeline(s.name, frames=frames, seconds=120, delivery="lossless",
                                    check=True, in_flight=4, timeout=10)
    assert out["error"] is None, (out["error"], s.text())
    assert out["frames"] == frames
    tags = out["tags"]
    assert tags == list(range(tags[0], tags[0] + frames)), tags
    # The processing actor saw each frame once, in order, and checked
    # every pixel of each against the demo pattern of its number.
    assert out["checked_tags"] == tags
    assert out["pixels_checked"] == frames * WIDTH * HEIGHT
    assert out["bad_frames"] == []
    assert out["dropped"] == 0
    assert out["transport"] == ["object store (NumPy)"]
    assert len(out["means"]) == frames and all(0 <= m <= 255 for m in out["means"])


def test_a_latest_receiver_counts_what_it_skipped(server):
    s = server("ray-latest")
    out = ray_pipeline.run_pipeline(s.name, frames=30, seconds=120, delivery="latest",
                                    check=True, in_flight=2, timeout=10)
    assert out["error"] is None, (out["error"], s.text())
    tags = out["tags"]
    assert len(tags) == 30 and tags == sorted(set(tags)), tags
    assert out["checked_tags"] == tags and out["bad_frames"] == []
    assert out["pixels_checked"] == 30 * WIDTH * HEIGHT
    assert out["dropped"] == tags[-1] - tags[0] + 1 - len(tags)


def test_a_killed_sender_ends_the_pipeline_with_the_reason(server):
    """The sender is killed while the pipeline runs: run_pipeline returns
    (no hang) with the frames it got, all checked, and why it stopped."""
    s = server("ray-killed", "--fps", "20")
    result = {}

    def run():
        try:
            result["out"] = ray_pipeline.run_pipeline(
                s.name, frames=100000, seconds=120, delivery="lossless", check=True,
                in_flight=4, timeout=10)
        except BaseException as e:  # noqa: BLE001 - reported below
            result["raised"] = e

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 60
    while "connected (lossless)" not in s.text():
        assert time.monotonic() < deadline and t.is_alive(), s.text()
        time.sleep(0.05)
    s.process.kill()
    s.process.wait(5)
    t.join(90)
    assert not t.is_alive(), "the pipeline did not end within 90 s of the sender's death"
    assert "raised" not in result, result
    out = result["out"]
    assert out["error"] and out["error"].startswith("disconnected:"), out["error"]
    assert out["checked_tags"] == out["tags"] and out["bad_frames"] == []
    assert out["pixels_checked"] == len(out["tags"]) * WIDTH * HEIGHT


def test_the_script_stops_with_the_senders_reason_and_its_summary(server):
    """The command line: a sender that stops after 20 frames (frame_server
    --frames 20) ends a run asked for 1000 with exit status 1, the reason on
    stderr and the summary line of what it did check."""
    s = server("ray-stops", "--frames", "20")
    child = subprocess.run(
        [sys.executable, EXAMPLE, "--name", s.name, "--frames", "1000", "--seconds", "120",
         "--delivery", "lossless", "--check", "--device", "cpu", "--num-cpus", "1",
         "--timeout", "10"],
        capture_output=True, text=True, timeout=240,
    )
    assert child.returncode == 1, (child.stdout, child.stderr[-3000:])
    assert "ray_pipeline: 20 frames in " in child.stdout, child.stdout
    assert ", 0 bad, 0 dropped, " in child.stdout, child.stdout
    assert f"{20 * WIDTH * HEIGHT} pixels checked" in child.stdout, child.stdout
    assert "stopped early: disconnected: " in child.stderr, child.stderr[-3000:]
    assert "sender stops" in child.stderr, child.stderr[-3000:]
