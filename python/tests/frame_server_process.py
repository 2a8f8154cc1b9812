"""The real `frame_server` example (its path in CUDA_INTEROP_FRAME_SERVER,
set by `cargo xtask test`) as a child process of a test: its output in a
log file, a bounded wait for a line of it, a bounded stop. test_frames.py
and test_ray.py start it with their own options.
"""

import os
import signal
import subprocess
import time

import pytest

SERVER = os.environ.get("CUDA_INTEROP_FRAME_SERVER")


def need_server():
    if not SERVER or not os.path.exists(SERVER):
        pytest.skip("CUDA_INTEROP_FRAME_SERVER (set by cargo xtask test) names no binary")


class FrameServerProcess:
    """frame_server with `args`, its output in `log_path`."""

    def __init__(self, log_path, args, env=None):
        need_server()
        self.log = open(log_path, "w+")
        self.process = subprocess.Popen(
            [SERVER, *args], stdout=self.log, stderr=subprocess.STDOUT, env=env,
        )

    def wait_for(self, line):
        """Waits (30 s at most) until the server printed `line`; if it never
        does (it exited: no Vulkan?), stops it and skips the test, saying
        why."""
        for _ in range(600):
            if line in self.text() or self.process.poll() is not None:
                break
            time.sleep(0.05)
        if line not in self.text():
            self.stop()
            pytest.skip("frame_server did not start (no Vulkan?): " + self.text())
        return self

    def text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
