"""zarr-python's own store conformance suite, and arrays round-tripped through SpindleStore
on a real cluster."""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import threading

import numpy as np
import numpy.testing as npt
import pytest
import zarr
from zarr.core.buffer import Buffer, cpu, default_buffer_prototype
from zarr.testing.store import StoreTests

import spindle
from spindle.zarr import SpindleStore

_prefixes = itertools.count()


class TestSpindleStore(StoreTests[SpindleStore, cpu.Buffer]):
    store_cls = SpindleStore
    buffer_cls = cpu.Buffer

    @pytest.fixture
    def store_kwargs(self, cluster) -> dict:
        # A fresh prefix per test: each starts with an empty store.
        return {"pool": "default", "prefix": f"conformance/{next(_prefixes)}", "dir": str(cluster.dir)}

    async def set(self, store: SpindleStore, key: str, value: Buffer) -> None:
        store.client.put(store.pool, store._name(key), value.to_bytes())

    async def get(self, store: SpindleStore, key: str) -> Buffer:
        return self.buffer_cls.from_bytes(store.client.get(store.pool, store._name(key)))

    def test_store_repr(self, store: SpindleStore) -> None:
        assert repr(store).startswith("SpindleStore('spindle://")
        assert store.prefix in repr(store)

    def test_store_supports_writes(self, store: SpindleStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: SpindleStore) -> None:
        assert store.supports_listing


def _store(cluster, name: str, pool: str = "default", **kw) -> SpindleStore:
    return SpindleStore(pool=pool, prefix=f"arrays/{name}", dir=str(cluster.dir), **kw)


CASES = [
    # dtype, shape, chunks, shards, compressed
    ("float32", (100, 70), (32, 16), None, True),
    ("int16", (1000,), (333,), None, False),
    ("uint8", (17, 5, 9), (4, 5, 2), None, True),
    ("float64", (64, 64), (8, 8), (32, 32), False),
    ("int64", (200, 30), (10, 10), (50, 30), True),
    ("complex64", (12, 12), (5, 7), None, False),
    ("bool", (300,), (64,), None, True),
]


@pytest.mark.parametrize("pool", ["default", "ec"])
@pytest.mark.parametrize("dtype,shape,chunks,shards,compressed", CASES)
def test_array_round_trip(cluster, pool, dtype, shape, chunks, shards, compressed):
    name = f"{pool}-{dtype}-{'x'.join(map(str, shape))}-{shards is not None}-{compressed}"
    rng = np.random.default_rng(abs(hash(name)) % (1 << 32))
    if dtype == "bool":
        data = rng.integers(0, 2, size=shape).astype(bool)
    elif np.dtype(dtype).kind == "c":
        data = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    elif np.dtype(dtype).kind == "f":
        data = rng.standard_normal(shape).astype(dtype)
    else:
        info = np.iinfo(dtype)
        data = rng.integers(info.min, info.max, size=shape, dtype=dtype)
    store = _store(cluster, name, pool)
    a = zarr.create_array(
        store=store,
        shape=shape,
        chunks=chunks,
        shards=shards,
        dtype=dtype,
        compressors="auto" if compressed else None,
        overwrite=True,
    )
    a[...] = data
    b = zarr.open_array(store=_store(cluster, name, pool, read_only=True), mode="r")
    npt.assert_array_equal(b[...], data)
    # A partial selection, and an update of one region.
    sel = tuple(slice(1, max(2, s // 2)) for s in shape)
    npt.assert_array_equal(b[sel], data[sel])
    a[sel] = data[sel] * 0 if dtype != "bool" else ~data[sel]
    expected = data.copy()
    expected[sel] = data[sel] * 0 if dtype != "bool" else ~data[sel]
    npt.assert_array_equal(zarr.open_array(store=store, mode="r")[...], expected)
    with pytest.raises(Exception):
        b[sel] = data[sel]  # read-only store


def test_concurrent_writers_to_different_chunks(cluster):
    store = _store(cluster, "concurrent")
    a = zarr.create_array(store=store, shape=(8, 1000), chunks=(1, 1000), dtype="int32", overwrite=True)
    rows = [np.arange(1000, dtype="int32") * (i + 1) for i in range(8)]

    def writer(i):
        # Each thread its own store object (and view of the array): separate writers.
        w = zarr.open_array(store=_store(cluster, "concurrent"), mode="r+")
        w[i, :] = rows[i]

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    npt.assert_array_equal(a[...], np.stack(rows))


def test_store_pickles_to_its_settings(cluster):
    store = _store(cluster, "pickled")
    a = zarr.create_array(store=store, shape=(10,), chunks=(5,), dtype="uint16", overwrite=True)
    a[...] = np.arange(10, dtype="uint16")
    clone = pickle.loads(pickle.dumps(store))
    assert clone == store and clone is not store
    npt.assert_array_equal(zarr.open_array(store=clone, mode="r")[...], np.arange(10))


def test_daemon_killed_while_an_array_is_written_and_read(cluster):
    store = _store(cluster, "failover")
    data = np.random.default_rng(7).standard_normal((256, 256)).astype("float32")
    a = zarr.create_array(store=store, shape=data.shape, chunks=(32, 32), dtype="float32", overwrite=True)
    a[:128] = data[:128]
    cluster.kill_osd(1)
    try:
        a[128:] = data[128:]
        npt.assert_array_equal(zarr.open_array(store=_store(cluster, "failover"), mode="r")[...], data)
    finally:
        cluster.start_osd(1)
        cluster.wait_clean()
    npt.assert_array_equal(zarr.open_array(store=_store(cluster, "failover"), mode="r")[...], data)


def test_missing_keys_and_bad_input(cluster):
    store = _store(cluster, "missing")

    async def main():
        assert await store.get("nope", default_buffer_prototype()) is None
        assert not await store.exists("nope")
        await store.delete("nope")  # deleting a missing key does not raise
        with pytest.raises(TypeError):
            await store.set("k", b"not a Buffer")
        with pytest.raises(TypeError):
            await store.get(7, default_buffer_prototype())

    asyncio.run(main())
    with pytest.raises(TypeError):
        SpindleStore(pool=None)
    with pytest.raises(FileNotFoundError):
        zarr.open_array(store=store, mode="r")


def test_cluster_down_gives_a_clear_error(tmp_path):
    store = SpindleStore(pool="default", mon="127.0.0.1:9", timeout=2.0)
    with pytest.raises((spindle.Timeout, spindle.ConnectionFailed)):
        zarr.open_array(store=store, mode="r")
