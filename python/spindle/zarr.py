"""A Zarr v3 store on a Spindle pool: ``zarr.open_array(store=SpindleStore(...))``.

Each key of the store is one object, named ``PREFIX/KEY`` (``KEY`` without a prefix), in
the pool. Reads, writes and deletes run on the Spindle client's own runtime and complete
``asyncio`` futures, so zarr's concurrent chunk I/O keeps many requests in flight through
one client, with no thread per request. A store pickles to its connection settings, so a
Dask worker process that unpickles it connects on its own.
"""

from __future__ import annotations

import asyncio
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
            offset, length = await self._range(name, byte_range)
            if length == 0:
                await self.client.stat_async(self.pool, name)
                return prototype.buffer.from_bytes(b"")
            data = await self.client.get_async(self.pool, name, offset=offset, length=length)
        except NotFound:
            return None
        return prototype.buffer.from_bytes(data)

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
