"""A real embedded cluster for the Python tests: `spindle up` with the repository's own
binary (``$SPINDLE_BIN``, else ``target/debug/spindle`` or ``target/release/spindle``),
3 daemons, a 3-way replicated pool ``default`` and an erasure-coded pool ``ec`` (2+1)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def spindle_bin() -> str:
    if os.environ.get("SPINDLE_BIN"):
        return os.environ["SPINDLE_BIN"]
    for profile in ("debug", "release"):
        p = REPO / "target" / profile / "spindle"
        if p.exists():
            return str(p)
    raise RuntimeError("no spindle binary: build it (cargo build -p spindle) or set SPINDLE_BIN")


class Cluster:
    def __init__(self, root: Path) -> None:
        self.dir = root
        self.bin = spindle_bin()

    def run(self, *args: str, timeout: float = 180) -> str:
        out = subprocess.run(
            [self.bin, *args, "--dir", str(self.dir)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"spindle {' '.join(args)} failed: {out.stderr}{out.stdout}")
        return out.stdout

    def status(self) -> dict:
        return json.loads(self.run("status", "--json"))

    def osd_pid(self, osd: int) -> int:
        return int((self.dir / f"osd.{osd}" / "pid").read_text().strip())

    def kill_osd(self, osd: int) -> None:
        pid = self.osd_pid(osd)
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        raise RuntimeError(f"osd.{osd} (pid {pid}) did not die")

    def start_osd(self, osd: int) -> None:
        self.run("osd", "start", str(osd))

    def wait_clean(self, timeout: float = 90) -> None:
        deadline = time.time() + timeout
        keys = ("degraded", "recovering", "backfilling", "peering", "incomplete", "inactive")
        while True:
            s = self.status()
            if all(s["pgs"][k] == 0 for k in keys) and all(o["up"] for o in s["osds"]):
                return
            if time.time() > deadline:
                raise RuntimeError(f"cluster not clean after {timeout} s: {s['pgs']}")
            time.sleep(0.2)


@pytest.fixture(scope="session")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="spindle-py-"))
    c = Cluster(root)
    try:
        c.run("up", "--osds", "3", "--pg-count", "16", "--wait-seconds", "90")
        c.run("pool", "create", "ec", "--pg-count", "8", "--erasure", "k=2,m=1")
        c.wait_clean()
        yield c
    finally:
        try:
            c.run("down", timeout=60)
        except Exception as e:  # still remove the directory; say why it failed
            print(f"spindle down: {e}")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(cluster):
    import spindle

    c = spindle.Client(cluster.dir)
    yield c
    c.close()
