"""Block images from Python against a real cluster: round trips that the `spindle image`
command reads back, the exclusive lock and fencing, snapshots, asyncio, bad input."""

from __future__ import annotations

import asyncio
import gc
import os
import time

import pytest

import spindle

MIB = 1 << 20


def test_round_trip_across_objects_and_the_cli_reads_it(client, cluster, tmp_path):
    info = client.image_create("default", "py-disk", 8 * MIB, object_size=64 << 10)
    assert info["size"] == 8 * MIB and info["object_size"] == 64 << 10
    assert info["object_count"] == 128
    assert "py-disk" in [i["name"] for i in client.image_list("default")]
    expect = bytearray(8 * MIB)
    with client.image_open("default", "py-disk") as img:
        assert not img.read_only and img.size == 8 * MIB
        # Never written: zeros.
        assert img.read(0, 4096) == bytes(4096)
        # Across object boundaries, unaligned.
        for offset, length in ((1000, 200_000), (3 * MIB - 7, MIB + 13), (8 * MIB - 512, 512)):
            data = os.urandom(length)
            img.write(offset, data)
            expect[offset : offset + length] = data
        img.flush()
        assert img.read(0, 8 * MIB) == bytes(expect)
        img.discard(64 << 10, 128 << 10)
        expect[64 << 10 : 192 << 10] = bytes(128 << 10)
        assert img.read(0, 256 << 10) == bytes(expect[: 256 << 10])
    assert img.closed
    with pytest.raises(spindle.ClientClosed):
        img.read(0, 1)
    # Another client of the project (the CLI's raw export) sees the same bytes.
    out = tmp_path / "disk.raw"
    cluster.run("image", "export", "py-disk", str(out))
    assert out.read_bytes() == bytes(expect)
    client.image_remove("default", "py-disk")
    assert "py-disk" not in [i["name"] for i in client.image_list("default")]
    with pytest.raises(spindle.NotFound):
        client.image_open("default", "py-disk")


def test_an_imported_image_reads_back_and_resizes(client, cluster, tmp_path):
    raw = os.urandom(3 * MIB)
    src = tmp_path / "in.raw"
    src.write_bytes(raw)
    cluster.run("image", "import", str(src), "py-imported")
    with client.image_open("default", "py-imported") as img:
        assert img.read(0, len(raw)) == raw
        img.resize(4 * MIB)
        assert img.size == 4 * MIB
        assert img.read(3 * MIB, MIB) == bytes(MIB)
        img.resize(MIB)
        with pytest.raises(spindle.InvalidArgument):
            img.read(MIB - 1, 2)
    client.image_remove("default", "py-imported")


def test_erasure_coded_pool(client):
    client.image_create("ec", "py-ec", 4 * MIB)
    data = os.urandom(MIB + 4096)
    with client.image_open("ec", "py-ec") as img:
        img.write(12345, data)
        assert img.read(12345, len(data)) == data
    client.image_remove("ec", "py-ec")


def test_one_writer_read_only_views_and_take_over_fences(client, cluster):
    client.image_create("default", "py-locked", 4 * MIB)
    first = client.image_open("default", "py-locked")
    first.write(0, b"a" * 4096)
    # A second writer is refused while the first holds the lock, in this process too.
    other = spindle.Client(cluster.dir)
    with pytest.raises(spindle.Locked) as e:
        other.image_open("default", "py-locked")
    assert "locked" in str(e.value).lower()
    assert isinstance(e.value, spindle.Conflict)
    # Removal is refused too: someone serves the image.
    with pytest.raises(spindle.Locked):
        other.image_remove("default", "py-locked")
    # A read-only view needs no lock and cannot write.
    with other.image_open("default", "py-locked", read_only=True) as view:
        assert view.read_only
        assert view.read(0, 4096) == b"a" * 4096
        with pytest.raises(spindle.ReadOnly):
            view.write(0, b"b")
        with pytest.raises(PermissionError):
            view.resize(MIB)
    # Taking over fences the first writer: its writes are refused from then on.
    second = other.image_open("default", "py-locked", take_over=True)
    second.write(0, b"c" * 4096)
    with pytest.raises(spindle.Fenced):
        for _ in range(100):  # the daemons learn of the new lock holder within a map epoch
            first.write(0, b"X" * 4096)
            time.sleep(0.1)
    with pytest.raises(spindle.Fenced):
        first.write(0, b"X" * 4096)
    assert second.read(0, 4096) == b"c" * 4096
    first.close()
    # The fenced client takes no lock any more (a client is fenced whole).
    with pytest.raises(spindle.Fenced):
        client.image_open("default", "py-locked")
    second.close()
    other.image_remove("default", "py-locked")
    other.close()


def test_an_image_dropped_without_close_gives_its_lock_back(client):
    client.image_create("default", "py-dropped", MIB)
    img = client.image_open("default", "py-dropped")
    img.write(0, b"z" * 512)
    del img
    gc.collect()
    deadline = time.time() + 10
    while True:
        try:
            again = client.image_open("default", "py-dropped")
            break
        except spindle.Locked:
            assert time.time() < deadline, "the lock of a dropped image was not released"
            time.sleep(0.1)
    assert again.read(0, 512) == b"z" * 512
    again.close()
    client.image_remove("default", "py-dropped")


def test_a_snapshot_reads_as_taken_and_is_read_only(client, cluster):
    client.image_create("default", "py-snap", 2 * MIB)
    with client.image_open("default", "py-snap") as img:
        img.write(0, b"1" * 8192)
    cluster.run("image", "snap", "create", "py-snap@s1")
    with client.image_open("default", "py-snap") as img:
        img.write(0, b"2" * 8192)
    with client.image_open("default", "py-snap", snapshot="s1") as snap:
        assert snap.read_only
        assert snap.read(0, 8192) == b"1" * 8192
        with pytest.raises(spindle.ReadOnly):
            snap.write(0, b"x")
    with client.image_open("default", "py-snap", read_only=True) as head:
        assert head.read(0, 8192) == b"2" * 8192
    with pytest.raises(spindle.NotFound):
        client.image_open("default", "py-snap", snapshot="nope")
    # An image with snapshots is not removed.
    with pytest.raises(spindle.SpindleError, match="snapshots"):
        client.image_remove("default", "py-snap")
    cluster.run("image", "snap", "rm", "py-snap@s1")
    client.image_remove("default", "py-snap")


async def test_many_writes_in_flight_from_one_coroutine(client):
    client.image_create("default", "py-async", 16 * MIB, object_size=1 * MIB)
    blocks = {i: os.urandom(64 << 10) for i in range(128)}
    img = await client.image_open_async("default", "py-async")
    async with img:
        await asyncio.gather(*(img.write_async(i * (128 << 10), b) for i, b in blocks.items()))
        await img.flush_async()
        got = await asyncio.gather(*(img.read_async(i * (128 << 10), 64 << 10) for i in blocks))
        assert got == list(blocks.values())
    assert img.closed
    client.image_remove("default", "py-async")


def test_bad_input(client):
    with pytest.raises(spindle.AlreadyExists):
        client.image_create("default", "py-bad", MIB)
        client.image_create("default", "py-bad", MIB)
    with pytest.raises(FileExistsError):
        client.image_create("default", "py-bad", MIB)
    with pytest.raises(spindle.InvalidArgument, match="multiple of 512"):
        client.image_create("default", "py-odd", 1000)
    with pytest.raises(spindle.InvalidArgument, match="invalid image name"):
        client.image_create("default", "no/slashes", MIB)
    with pytest.raises(spindle.NotFound):
        client.image_create("nosuchpool", "py-x", MIB)
    with pytest.raises(TypeError):
        client.image_create("default", "py-x", "1M")
    with client.image_open("default", "py-bad") as img:
        with pytest.raises(ValueError, match="negative"):
            img.read(-1, 10)
        with pytest.raises(TypeError):
            img.write(0, "text")
        with pytest.raises(spindle.InvalidArgument, match="outside the image"):
            img.write(MIB - 10, b"x" * 20)
        with pytest.raises(ValueError, match="at most"):
            img.read(0, 2 << 30)
    with pytest.raises(spindle.NotFound):
        client.image_open("default", "py-missing")
    client.image_remove("default", "py-bad")
    closed = spindle.Client(client.settings["dir"])
    closed.close()
    with pytest.raises(spindle.ClientClosed):
        closed.image_open("default", "py-bad")
