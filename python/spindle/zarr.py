"""A Zarr v3 store on a Spindle pool: ``zarr.open_array(store=SpindleStore(...))``.

Each key of the store is one object, named ``PREFIX/KEY`` (``KEY`` without a prefix), in
the pool. Reads, writes and deletes run on the Spindle client's own runtime and complete
``asyncio`` futures, so zarr's concurrent chunk I/O keeps many requests in flight through
one client, with no thread per request. A store pickles to its connection settings, so a
Dask worker process that unpickles it connects on its own.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable, Optional

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.buffer.cpu import Buffer as _CpuBuffer

from . import Client, NotFound

if TYPE_CHECKING:
    from zarr.core.buffer import BufferPrototype

__all__ = ["SpindleStore"]

# One client per process and connection settings, shared by every store that uses them
# (a process forked or spawned by Dask makes its own).
_CLIENTS: dict[tuple, tuple[int, Client]] = {}
_CLIENTS_LOCK = threading.Lock()


def _client_for(settings: tuple) -> Client:
    pid = os.getpid()
    with _CLIENTS_LOCK:
        held = _CLIENTS.get(settings)
        if held is not None and held[0] == pid and not held[1].closed:
            return held[1]
        dir_, mon, keyring, name, timeout = settings
        c = Client(dir_, mon=mon, keyring=keyring, name=name, timeout=timeout)
        _CLIENTS[settings] = (pid, c)
        return c


def _buffer(prototype: BufferPrototype, blob) -> Buffer:
    """A zarr buffer of the bytes of ``blob`` (a :class:`spindle.Blob`): for zarr's CPU
    buffers a read-only NumPy view of them in place (zarr copies a chunk before it
    changes it), else from a copy."""
    if issubclass(prototype.buffer, _CpuBuffer):
        import numpy as np

        return prototype.buffer.from_array_like(np.asarray(blob))
    return prototype.buffer.from_bytes(bytes(blob))


class SpindleStore(Store):
    """A Zarr v3 store whose keys are objects of a Spindle pool.

    Parameters
    ----------
    pool : str
        The pool (default ``"default"``).
    prefix : str
        Object names are ``prefix/key``; ``""`` for none.
    dir, mon, keyring, name, timeout
        How to reach the cluster, as :class:`spindle.Client` takes them.
    read_only : bool
        Refuse writes and deletes.
    """

    supports_writes: bool = True
    supports_deletes: bool = True
    supports_listing: bool = True

    def __init__(
        self,
        pool: str = "default",
        prefix: str = "",
        *,
        dir: Optional[str | os.PathLike] = None,
        mon: Optional[str] = None,
        keyring: Optional[str | os.PathLike] = None,
        name: Optional[str] = None,
        timeout: float = 30.0,
        read_only: bool = False,
    ) -> None:
        super().__init__(read_only=read_only)
        if not isinstance(pool, str) or not pool:
            raise TypeError(f"pool must be a non-empty str, not {pool!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        self.pool = pool
        self.prefix = prefix.strip("/")
        self._settings = (
            None if dir is None else os.fspath(dir),
            mon,
            None if keyring is None else os.fspath(keyring),
            name,
            float(timeout),
        )

    # -- identity -----------------------------------------------------------------------

    def _kwargs(self) -> dict[str, Any]:
        dir_, mon, keyring, name, timeout = self._settings
        return dict(
            pool=self.pool,
            prefix=self.prefix,
            dir=dir_,
            mon=mon,
            keyring=keyring,
            name=name,
            timeout=timeout,
        )

    def with_read_only(self, read_only: bool = False) -> SpindleStore:
        return type(self)(**self._kwargs(), read_only=read_only)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, SpindleStore)
            and self.pool == other.pool
            and self.prefix == other.prefix
            and self._settings == other._settings
            and self.read_only == other.read_only
        )

    def __hash__(self) -> int:
        return hash((self.pool, self.prefix, self._settings, self.read_only))

    def __str__(self) -> str:
        where = self._settings[1] or self._settings[0] or "$SPINDLE_DIR"
        return f"spindle://{where}/{self.pool}/{self.prefix}"

    def __repr__(self) -> str:
        return f"SpindleStore('{self}')"

    def __getstate__(self) -> dict[str, Any]:
        return {"kwargs": self._kwargs(), "read_only": self.read_only}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["kwargs"], read_only=state["read_only"])

    # -- plumbing -----------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """This process's client for the store's cluster (connected on first use)."""
        return _client_for(self._settings)

    def _name(self, key: str) -> str:
        if not isinstance(key, str):
            raise TypeError(f"keys are str, not {type(key).__name__}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _key(self, name: str) -> str:
        return name[len(self.prefix) + 1 :] if self.prefix else name

    async def _open(self) -> None:
        if self._is_open:
            raise ValueError("store is already open")
        self.client  # connect now: a cluster that is down fails here, clearly
        self._is_open = True

    async def _range(self, name: str, byte_range: Optional[ByteRequest]) -> tuple[int, Optional[int]]:
        """(offset, length) of a byte request (a suffix needs the object's size)."""
        if byte_range is None:
            return 0, None
        if isinstance(byte_range, RangeByteRequest):
            if byte_range.start < 0 or byte_range.end < byte_range.start:
                raise ValueError(f"bad byte range {byte_range}")
            return byte_range.start, byte_range.end - byte_range.start
        if isinstance(byte_range, OffsetByteRequest):
            if byte_range.offset < 0:
                raise ValueError(f"bad byte range {byte_range}")
            return byte_range.offset, None
        if isinstance(byte_range, SuffixByteRequest):
            size = (await self.client.stat_async(self.pool, name))["size"]
            return max(0, size - byte_range.suffix), None
        raise TypeError(f"Unexpected byte_range, got {byte_range}")

    # -- reads --------------------------------------------------------------------------

    async def get(
        self,
        key: str,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        if prototype is None:
            prototype = default_buffer_prototype()
        if not self._is_open:
            await self._open()
        name = self._name(key)
        try:
            if byte_range is None:  # the usual case, without a coroutine more per chunk
                offset, length = 0, None
            else:
                offset, length = await self._range(name, byte_range)
            if length == 0:
                await self.client.stat_async(self.pool, name)
                return prototype.buffer.from_bytes(b"")
            data = await self.client.get_blob_async(self.pool, name, offset=offset, length=length)
        except NotFound:
            return None
        return _buffer(prototype, data)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        return list(
            await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges))
        )

    async def exists(self, key: str) -> bool:
        return await self.client.exists_async(self.pool, self._name(key))

    async def getsize(self, key: str) -> int:
        try:
            return (await self.client.stat_async(self.pool, self._name(key)))["size"]
        except NotFound as e:
            raise FileNotFoundError(key) from e

    def get_sync(
        self,
        key: str,
        *,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        if prototype is None:
            prototype = default_buffer_prototype()
        self._is_open = True
        name = self._name(key)
        try:
            if isinstance(byte_range, SuffixByteRequest):
                size = self.client.stat(self.pool, name)["size"]
                offset, length = max(0, size - byte_range.suffix), None
            elif isinstance(byte_range, RangeByteRequest):
                offset, length = byte_range.start, byte_range.end - byte_range.start
            elif isinstance(byte_range, OffsetByteRequest):
                offset, length = byte_range.offset, None
            else:
                offset, length = 0, None
            if length == 0:
                self.client.stat(self.pool, name)
                return prototype.buffer.from_bytes(b"")
            data = self.client.get(self.pool, name, offset=offset, length=length)
        except NotFound:
            return None
        return prototype.buffer.from_bytes(data)

    # -- writes -------------------------------------------------------------------------

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()
        if not self._is_open:
            await self._open()
        if not isinstance(value, Buffer):
            raise TypeError(
                f"SpindleStore.set(): `value` must be a Buffer instance, not {type(value)}"
            )
        await self.client.put_async(self.pool, self._name(key), value.to_bytes())

    def set_sync(self, key: str, value: Buffer) -> None:
        self._check_writable()
        self._is_open = True
        if not isinstance(value, Buffer):
            raise TypeError(
                f"SpindleStore.set_sync(): `value` must be a Buffer instance, not {type(value)}"
            )
        self.client.put(self.pool, self._name(key), value.to_bytes())

    async def delete(self, key: str) -> None:
        self._check_writable()
        await self.client.delete_async(self.pool, self._name(key), missing_ok=True)

    def delete_sync(self, key: str) -> None:
        self._check_writable()
        self._is_open = True
        self.client.delete(self.pool, self._name(key), missing_ok=True)

    # -- listing ------------------------------------------------------------------------

    async def _names(self, key_prefix: str) -> list[str]:
        object_prefix = self._name(key_prefix) if key_prefix else (
            self.prefix + "/" if self.prefix else ""
        )
        return [
            self._key(n) for n, _ in await self.client.list_async(self.pool, object_prefix)
        ]

    async def list(self) -> AsyncIterator[str]:
        for key in await self._names(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in await self._names(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        prefix = prefix.rstrip("/")
        below = f"{prefix}/" if prefix else ""
        seen = set()
        for key in await self._names(below):
            child = key[len(below) :].split("/")[0]
            if child and child not in seen:
                seen.add(child)
                yield child


# -- reductions next to the data ------------------------------------------------------

# NumPy dtype -> `enum spindle_dtype` (crates/spindle-prog/include/spindle_prog.h).
_DTYPES = {
    "float32": 1,
    "float64": 2,
    "int8": 3,
    "int16": 4,
    "int32": 5,
    "int64": 6,
    "uint8": 7,
    "uint16": 8,
    "uint32": 9,
    "uint64": 10,
    "bool": 7,
}
_DIMS_MAX = 8
# Program runs in flight at once for one reduction (a 64 KiB-chunk reduction ran 1.4x
# faster with 256 than with 64 on the 3-daemon bench cluster, 2026-11-28).
_IN_FLIGHT = 256
# Largest chunk (decoded) whose reductions share runs with others of its placement group:
# up to 16 x 256 KiB = 4 MiB per run.
_GROUP_CHUNK_BYTES_MAX = 256 << 10


class Reduction(dict):
    """The result of :func:`reduce`: ``count``, ``sum``, ``min``, ``max`` and ``mean``,
    with how it was computed: ``pushed_down`` chunks reduced by the daemons,
    ``read`` chunks read and reduced here, ``missing`` chunks never written (their fill
    value counts), and ``bytes_received`` from the daemons."""


# Codecs the reduction program decodes on the daemons (`zarr_reduce.c`).
_CODEC_RAW = 0
_CODEC_ZSTD = 1
_CODEC_BLOSC = 2
# Blosc's inner codecs the daemons decode (`spindle-prog`'s `blosc.rs`); blosclz and
# snappy chunks are reduced here.
_BLOSC_INNER = frozenset({"lz4", "lz4hc", "zlib", "zstd"})


def _pushdown_codec(array) -> Optional[int]:
    """How the daemons decode the array's chunks: raw, zarr's zstd codec (its default for
    numbers), or its blosc codec with an lz4, lz4hc, zlib or zstd inner codec (any
    shuffle); None when they cannot (other compressors, filters)."""
    if array.filters:
        return None
    compressors = tuple(array.compressors)
    if not compressors:
        return _CODEC_RAW
    if len(compressors) != 1:
        return None
    codec = compressors[0]
    kind = type(codec).__name__
    if kind == "ZstdCodec":
        return _CODEC_ZSTD
    if kind == "BloscCodec":
        cname = getattr(codec.cname, "value", codec.cname)
        return _CODEC_BLOSC if cname in _BLOSC_INNER else None
    return None


def _pushdown_dtype(array) -> Optional[int]:
    """The dtype code when the daemons can reduce the array's chunks as stored: a regular
    chunk grid, no sharding, no filter, no compressor but zstd or blosc (see
    `_pushdown_codec`), little-endian bytes."""
    import numpy as np

    if array.metadata.zarr_format != 3 or array.shards is not None:
        return None
    if _pushdown_codec(array) is None:
        return None
    endian = getattr(array.serializer, "endian", None)
    dt = np.dtype(array.dtype)
    if dt.itemsize > 1 and (endian is None or endian.value != "little" or dt.byteorder == ">"):
        return None
    if array.ndim == 0 or array.ndim > _DIMS_MAX:
        return None
    return _DTYPES.get(dt.name)


def _boxes(shape, chunks, selection):
    """(chunk coords, chunk-local start, stop) of every chunk the selection touches."""
    import itertools

    sel = selection if selection is not None else tuple(slice(None) for _ in shape)
    if not isinstance(sel, tuple):
        sel = (sel,)
    if len(sel) != len(shape):
        raise ValueError(f"a selection of {len(shape)} slices is needed, got {selection!r}")
    lo, hi = [], []
    for s, n in zip(sel, shape):
        if not isinstance(s, slice):
            raise TypeError(f"selections are slices with step 1, got {s!r}")
        a, b, step = s.indices(n)
        if step != 1:
            raise ValueError(f"selections are slices with step 1, got {s!r}")
        lo.append(a)
        hi.append(max(a, b))
    ranges = [range(l // c, (h + c - 1) // c) if h > l else range(0) for l, h, c in zip(lo, hi, chunks)]
    for coords in itertools.product(*ranges):
        start = [max(l - i * c, 0) for l, i, c in zip(lo, coords, chunks)]
        stop = [min(h - i * c, c) for h, i, c in zip(hi, coords, chunks)]
        yield coords, start, stop


def _request(dtype_code: int, chunks, start, stop, codec: int = _CODEC_RAW, itemsize: int = 0) -> bytes:
    """A `struct spindle_reduce`, followed for a compressed chunk by `struct zarr_codec`
    (the codec and the decoded chunk's length)."""
    import math
    import struct

    words = [0, 0, dtype_code, len(chunks)]
    for part in (chunks, start, stop):
        words += list(part) + [0] * (_DIMS_MAX - len(part))
    words += [0, 0, 0, 0]
    if codec != _CODEC_RAW:
        words += [codec, math.prod(chunks) * itemsize]
    return struct.pack(f"<{len(words)}Q", *words)


def _decode(dt, r: tuple[int, int, int, int]):
    """(count, sum, min, max) from the program's bits."""
    import struct

    count, s, lo, hi = r
    if dt.kind == "f":
        f = lambda b: struct.unpack("<d", struct.pack("<Q", b))[0]
        return count, f(s), f(lo), f(hi)
    if dt.kind == "i":
        i = lambda b: struct.unpack("<q", struct.pack("<Q", b))[0]
        return count, i(s), i(lo), i(hi)
    return count, s, lo, hi


async def reduce_async(array, selection=None, *, jit: bool = True) -> Reduction:
    """Count, sum, min, max and mean of ``array`` (a zarr v3 array in a
    :class:`SpindleStore`) or of ``selection`` (a tuple of slices with step 1), computed
    next to the data: each chunk, raw, zstd- or blosc-compressed (lz4, lz4hc, zlib or zstd
    inside), is decoded and reduced by a
    program on the daemon that holds it, which answers 32 bytes. Chunks never written count
    with the fill value; arrays the daemons cannot reduce as stored (other compressors,
    filters, sharded, big-endian, other dtypes) are read and reduced here. Floats sum in double precision (NaN
    propagates); integers sum with wraparound in 64 bits, as NumPy's int64 sum does."""
    import numpy as np

    from . import NotFound
    from . import _native

    store = array.store_path.store
    if not isinstance(store, SpindleStore):
        raise TypeError(f"reduce needs an array in a SpindleStore, not in {type(store).__name__}")
    dt = np.dtype(array.dtype)
    code = _pushdown_dtype(array)
    codec = _pushdown_codec(array)
    chunks = tuple(array.chunks)
    boxes = list(_boxes(array.shape, chunks, selection))
    result = Reduction(pushed_down=0, read=0, missing=0, bytes_received=0)
    parts = []
    fill = array.fill_value

    def fill_part(start, stop):
        n = int(np.prod([b - a for a, b in zip(start, stop)]))
        v = dt.type(fill).item()
        if dt.kind == "b":
            v = int(v)
        return (n, v * n if dt.kind == "f" else int(v) * n, v, v) if n else (0, 0, 0, 0)

    if code is None:
        # Not reducible where it is stored: read the selection here.
        sel = selection if selection is not None else tuple(slice(None) for _ in array.shape)
        data = await array._async_array.getitem(sel)
        data = np.asarray(data)
        result["read"] = len(boxes)
        if data.size:
            acc = data.astype(np.float64) if dt.kind == "f" else data.astype(np.int64 if dt.kind in "ib" else np.uint64)
            parts.append((int(data.size), acc.sum(), acc.min(), acc.max()))
    else:
        import struct

        client = store.client
        base = array.path
        items = []
        for coords, start, stop in boxes:
            key = array.metadata.encode_chunk_key(coords)
            items.append((
                store._name(f"{base}/{key}" if base else key),
                _request(code, chunks, start, stop, codec, dt.itemsize),
            ))
        # One batch: the client's runtime keeps _IN_FLIGHT runs going and calls back once.
        # Small chunks of one placement group with the same request share a run (the
        # program answers 32 bytes per chunk): up to 16 messages and program starts become
        # one. Large chunks do not: a run's chunks are reduced one after another on one
        # thread of one daemon, and one run per chunk spreads them over every daemon.
        decoded_bytes = math.prod(chunks) * dt.itemsize
        runs = await client.exec_batch_async(
            store.pool, items, _native.REDUCE_PROGRAM, jit=jit, in_flight=_IN_FLIGHT,
            group_output_bytes=32 if decoded_bytes <= _GROUP_CHUNK_BYTES_MAX else None,
        ) if items else []
        parts = []
        for (coords, start, stop), run in zip(boxes, runs):
            if run is None:
                result["missing"] += 1
                parts.append(fill_part(start, stop))
                continue
            result["pushed_down"] += 1
            result["bytes_received"] += len(run[1])
            parts.append(_decode(dt, struct.unpack("<4Q", run[1])))
    count = sum(p[0] for p in parts)
    live = [p for p in parts if p[0]]
    if dt.kind == "f":
        total = float(sum(p[1] for p in live))
        lo = min((p[2] for p in live), default=float("nan"))
        hi = max((p[3] for p in live), default=float("nan"))
        if any(np.isnan(p[2]) for p in live):
            lo = hi = float("nan")
    else:
        total = sum(int(p[1]) for p in live)
        if dt.kind in "ib":
            total = (total + (1 << 63)) % (1 << 64) - (1 << 63)
        else:
            total %= 1 << 64
        lo = min((int(p[2]) for p in live), default=None)
        hi = max((int(p[3]) for p in live), default=None)
    result.update(
        count=count,
        sum=total,
        min=lo,
        max=hi,
        mean=(float(total) / count) if count else float("nan"),
    )
    return result


def reduce(array, selection=None, *, jit: bool = True) -> Reduction:
    """:func:`reduce_async`, blocking (zarr's own event loop runs it)."""
    from zarr.core.sync import sync

    return sync(reduce_async(array, selection, jit=jit))
