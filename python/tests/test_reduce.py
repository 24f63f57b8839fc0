"""Reductions next to the data: each chunk reduced by a program on the daemon holding it,
against NumPy on the same data. Floats: sums within rtol 1e-9 of NumPy's float64 sum
(the daemons sum in double precision), min and max exact; integers exact."""

from __future__ import annotations

import numpy as np
import numpy.testing as npt
import pytest
import zarr

from spindle.zarr import SpindleStore, reduce


def _array(cluster, name, data, chunks, pool="default", **kw):
    store = SpindleStore(pool=pool, prefix=f"reduce/{name}", dir=str(cluster.dir))
    a = zarr.create_array(
        store=store, shape=data.shape, chunks=chunks, dtype=data.dtype, overwrite=True,
        compressors=kw.pop("compressors", None), **kw
    )
    a[...] = data
    return a


def _check(r, data):
    assert r["count"] == data.size
    if data.dtype.kind == "f":
        npt.assert_allclose(r["sum"], data.sum(dtype=np.float64), rtol=1e-9)
        npt.assert_allclose(r["mean"], data.mean(dtype=np.float64), rtol=1e-9)
        assert r["min"] == float(data.min()) and r["max"] == float(data.max())
    else:
        assert r["sum"] == int(data.sum(dtype=np.int64 if data.dtype.kind in "ib" else np.uint64))
        assert r["min"] == int(data.min()) and r["max"] == int(data.max())


@pytest.mark.parametrize("pool", ["default", "ec"])
@pytest.mark.parametrize(
    "dtype,shape,chunks",
    [
        ("float32", (300, 170), (64, 64)),   # edge chunks in both dimensions
        ("float64", (1000,), (128,)),
        ("int16", (40, 30, 20), (16, 16, 16)),
        ("uint8", (5000,), (1024,)),
        ("int64", (64, 64), (64, 64)),
    ],
)
def test_whole_array_reductions_equal_numpy(cluster, pool, dtype, shape, chunks):
    rng = np.random.default_rng(3)
    if np.dtype(dtype).kind == "f":
        data = (rng.standard_normal(shape) * 1000).astype(dtype)
    else:
        info = np.iinfo(dtype)
        data = rng.integers(max(info.min, -10**6), min(info.max, 10**6), size=shape, dtype=dtype)
    a = _array(cluster, f"{pool}-{dtype}", data, chunks, pool=pool)
    r = reduce(a)
    _check(r, data)
    n_chunks = int(np.prod([-(-s // c) for s, c in zip(shape, chunks)]))
    assert r["pushed_down"] == n_chunks and r["read"] == 0
    # 32 bytes per chunk came back, not the chunks.
    assert r["bytes_received"] == 32 * n_chunks


def test_selections_and_missing_chunks(cluster):
    data = np.full((256, 256), 7.0, dtype="float32")
    data[:100, :100] = np.random.default_rng(5).standard_normal((100, 100))
    store = SpindleStore(pool="default", prefix="reduce/sparse", dir=str(cluster.dir))
    a = zarr.create_array(store=store, shape=data.shape, chunks=(64, 64), dtype="float32",
                          fill_value=7.0, compressors=None, overwrite=True)
    a[:100, :100] = data[:100, :100]  # chunks elsewhere stay unwritten: the fill value
    r = reduce(a)
    _check(r, data)
    assert r["missing"] > 0 and r["pushed_down"] == 4
    for sel in [(slice(10, 90), slice(5, 200)), (slice(63, 65), slice(None)), (slice(200, 256), slice(0, 1))]:
        _check(reduce(a, sel), data[sel])
    empty = reduce(a, (slice(5, 5), slice(None)))
    assert empty["count"] == 0 and np.isnan(empty["mean"])
    with pytest.raises(ValueError):
        reduce(a, (slice(0, 10, 2), slice(None)))
    with pytest.raises(ValueError):
        reduce(a, (slice(None),))


def test_nan_propagates_like_numpy(cluster):
    data = np.arange(100, dtype="float64")
    data[37] = np.nan
    r = reduce(_array(cluster, "nan", data, (16,)))
    assert np.isnan(r["sum"]) and np.isnan(r["min"]) and np.isnan(r["max"])


@pytest.mark.parametrize("pool", ["default", "ec"])
def test_zstd_chunks_are_decoded_and_reduced_next_to_the_data(cluster, pool):
    # zarr's default codecs for numbers: bytes (little-endian) then zstd.
    data = np.random.default_rng(9).integers(-1000, 1000, (200, 50)).astype("int32")
    a = _array(cluster, f"zstd-{pool}", data, (64, 25), pool=pool, compressors="auto")
    assert [type(c).__name__ for c in a.compressors] == ["ZstdCodec"]
    r = reduce(a)
    _check(r, data)
    assert r["pushed_down"] == 8 and r["read"] == 0
    assert r["bytes_received"] == 32 * 8
    # A selection cutting chunks, and a checksummed zstd frame.
    f = np.random.default_rng(10).standard_normal((130, 70)).astype("float64")
    from zarr.codecs import ZstdCodec

    b = _array(cluster, f"zstd-ck-{pool}", f, (32, 32), pool=pool,
               compressors=ZstdCodec(level=5, checksum=True))
    r = reduce(b, (slice(10, 101), slice(3, 64)))
    _check(r, f[10:101, 3:64])
    assert r["pushed_down"] == 4 * 2 and r["read"] == 0


@pytest.mark.parametrize("cname", ["lz4", "lz4hc", "zlib", "zstd"])
@pytest.mark.parametrize("shuffle", ["noshuffle", "shuffle", "bitshuffle"])
def test_blosc_chunks_are_decoded_and_reduced_next_to_the_data(cluster, cname, shuffle):
    # Frames made by numcodecs' own c-blosc (the real peer), decoded by the daemons'
    # decoder: chunks of several blocks (a short last one), streams split per byte of
    # the type (lz4, zlib), edge chunks, 1- to 8-byte types, and a chunk under 128 bytes
    # (stored as it is).
    from zarr.codecs import BloscCodec

    from numcodecs import Blosc

    rng = np.random.default_rng(11)
    cases = [
        ("float32", (1300, 512), (600, 512)),  # 1.2 MB chunks: several blocks
        ("int64", (3000,), (1000,)),
        ("uint8", (100_000,), (65_536,)),
        ("int16", (50, 7), (9, 7)),
    ]
    for dtype, shape, chunks in cases:
        # Small values: compressible, so the inner codec's path is taken (random bytes
        # would be stored as they are).
        size = int(np.prod(shape))
        data = ((np.arange(size) // 3) % 50 - 25 + rng.integers(0, 2, size)).astype(dtype).reshape(shape)
        codec = BloscCodec(cname=cname, clevel=5, shuffle=shuffle)
        first = np.ascontiguousarray(data[tuple(slice(0, c) for c in chunks)])
        frame = Blosc(cname=cname, clevel=5, shuffle=["noshuffle", "shuffle", "bitshuffle"].index(shuffle),
                      typesize=first.itemsize).encode(first)
        copied = first.nbytes < 128
        assert bool(frame[2] & 0x02) == copied, (dtype, hex(frame[2]))
        a = _array(cluster, f"blosc-{cname}-{shuffle}-{dtype}", data, chunks, compressors=codec)
        assert [type(c).__name__ for c in a.compressors] == ["BloscCodec"]
        r = reduce(a)
        _check(r, data)
        n_chunks = int(np.prod([-(-s // c) for s, c in zip(shape, chunks)]))
        assert r["pushed_down"] == n_chunks and r["read"] == 0, (dtype, r)


def test_other_codecs_are_read_and_reduced_here(cluster):
    from zarr.codecs import BloscCodec, GzipCodec

    data = np.random.default_rng(9).standard_normal((200, 50)).astype("float32")
    for name, codec in (("gzip", GzipCodec()), ("blosclz", BloscCodec(cname="blosclz"))):
        a = _array(cluster, name, data, (64, 25), compressors=codec)
        r = reduce(a)
        _check(r, data)
        assert r["pushed_down"] == 0 and r["read"] > 0, name


def test_reduce_needs_a_spindle_store():
    a = zarr.create_array(store=zarr.storage.MemoryStore(), shape=(4,), dtype="int32")
    with pytest.raises(TypeError):
        reduce(a)
