"""Spindle's Python client.

>>> import spindle
>>> c = spindle.Client(dir="./spindle-data")        # or mon="127.0.0.1:6789"
>>> c.put("default", "greeting", b"hello")
>>> c.get("default", "greeting", offset=1, length=3)
b'ell'
>>> await c.get_async("default", "greeting")          # in a coroutine: no thread per call

Blocking calls release the GIL; ``*_async`` calls run on the client's own runtime and
complete an ``asyncio`` future, so many can be in flight at once. Errors are
:mod:`spindle.errors` exceptions.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Optional, Sequence

from . import _native
from .errors import (
    ALL as _ALL_ERRORS,
    ClientClosed,
    Conflict,
    ConnectionFailed,
    Corrupt,
    Fenced,
    InvalidArgument,
    NoSpace,
    NotFound,
    PermissionDenied,
    ProgramFailed,
    SpindleError,
    Timeout,
)

_native._register_errors(dict(_ALL_ERRORS))

OBJECT_BYTES_MAX: int = _native.OBJECT_BYTES_MAX

__all__ = [
    "Client",
    "OBJECT_BYTES_MAX",
    "SpindleError",
    "NotFound",
    "InvalidArgument",
    "Timeout",
    "ConnectionFailed",
    "PermissionDenied",
    "NoSpace",
    "Corrupt",
    "ProgramFailed",
    "Conflict",
    "Fenced",
    "ClientClosed",
]


def _check_str(what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return value


def _as_bytes(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"data must be bytes-like, not {type(data).__name__}")


def _future_callback(loop: asyncio.AbstractEventLoop, fut: asyncio.Future):
    """A callback(error, value) for the native client that settles `fut` on `loop`."""

    def settle(err: Optional[BaseException], value: Any) -> None:
        if fut.done():
            return
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(value)

    def callback(err: Optional[BaseException], value: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle, err, value)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    return callback


class Client:
    """A connection to a Spindle cluster.

    The cluster is found as the ``spindle`` command finds it: the monitors at ``mon``
    (``"host:port,..."``), else those of the embedded cluster in ``dir`` (default
    ``$SPINDLE_DIR``, else ``./spindle-data``), authenticating with ``keyring`` (default
    ``DIR/keyring`` when it exists) as ``name`` (default ``client.admin``). Every
    operation gives up after ``timeout`` seconds with :class:`Timeout`.
    """

    def __init__(
        self,
        dir: Optional[str | os.PathLike] = None,
        *,
        mon: Optional[str] = None,
        keyring: Optional[str | os.PathLike] = None,
        name: Optional[str] = None,
        timeout: float = 30.0,
    ) -> None:
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if mon is not None:
            _check_str("mon", mon)
        if name is not None:
            _check_str("name", name)
        self._settings = dict(
            dir=None if dir is None else os.fspath(dir),
            mon=mon,
            keyring=None if keyring is None else os.fspath(keyring),
            name=name,
            timeout=float(timeout),
        )
        self._c = _native.Client.connect(
            dir=self._settings["dir"],
            mon=mon,
            keyring=self._settings["keyring"],
            name=name,
            timeout_ms=max(1, int(timeout * 1000)),
        )

    @property
    def settings(self) -> dict:
        """The connection settings (enough to connect again, e.g. in another process)."""
        return dict(self._settings)

    @property
    def closed(self) -> bool:
        return self._c.closed

    def close(self) -> None:
        self._c.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- blocking ---------------------------------------------------------------------

    def put(self, pool: str, name: str, data: bytes, *, offset: Optional[int] = None) -> None:
        """Writes ``data`` as the whole object, or at ``offset`` in it."""
        self._c.put(_check_str("pool", pool), _check_str("name", name), _as_bytes(data), offset)

    def get(self, pool: str, name: str, *, offset: int = 0, length: Optional[int] = None) -> bytes:
        """``length`` bytes at ``offset`` (default: the rest of the object); short at its end."""
        return self._c.get(_check_str("pool", pool), _check_str("name", name), offset, length)

    def delete(self, pool: str, name: str, *, missing_ok: bool = False) -> None:
        self._c.delete(_check_str("pool", pool), _check_str("name", name), missing_ok)

    def stat(self, pool: str, name: str) -> dict:
        """``{"size": bytes, "version": str}``."""
        return self._c.stat(_check_str("pool", pool), _check_str("name", name))

    def exists(self, pool: str, name: str) -> bool:
        try:
            self.stat(pool, name)
            return True
        except NotFound:
            return False

    def list(self, pool: str, prefix: str = "") -> list[tuple[str, int]]:
        """``[(name, size)]`` of the objects whose names start with ``prefix``, sorted."""
        return self._c.list(_check_str("pool", pool), _check_str("prefix", prefix))

    def exec(
        self,
        pool: str,
        objects: Sequence[str],
        program: bytes,
        args: bytes = b"",
        *,
        jit: bool = True,
        cache: bool = False,
    ) -> dict:
        """Runs the eBPF object file ``program`` next to ``objects``:
        ``{"ret": int, "output": bytes}``."""
        return self._c.exec(
            _check_str("pool", pool), list(objects), _as_bytes(program), _as_bytes(args), jit, cache
        )

    # -- asyncio ----------------------------------------------------------------------

    def _start(self, method: str, *args: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        getattr(self._c, method)(*args, _future_callback(loop, fut))
        return fut

    async def put_async(
        self, pool: str, name: str, data: bytes, *, offset: Optional[int] = None
    ) -> None:
        await self._start(
            "put_cb", _check_str("pool", pool), _check_str("name", name), _as_bytes(data), offset
        )

    async def get_async(
        self, pool: str, name: str, *, offset: int = 0, length: Optional[int] = None
    ) -> bytes:
        return await self._start(
            "get_cb", _check_str("pool", pool), _check_str("name", name), offset, length
        )

    async def delete_async(self, pool: str, name: str, *, missing_ok: bool = False) -> None:
        await self._start(
            "delete_cb", _check_str("pool", pool), _check_str("name", name), missing_ok
        )

    async def stat_async(self, pool: str, name: str) -> dict:
        return await self._start("stat_cb", _check_str("pool", pool), _check_str("name", name))

    async def exists_async(self, pool: str, name: str) -> bool:
        try:
            await self.stat_async(pool, name)
            return True
        except NotFound:
            return False

    async def list_async(self, pool: str, prefix: str = "") -> list[tuple[str, int]]:
        return await self._start("list_cb", _check_str("pool", pool), _check_str("prefix", prefix))

    async def exec_async(
        self,
        pool: str,
        objects: Sequence[str],
        program: bytes,
        args: bytes = b"",
        *,
        jit: bool = True,
        cache: bool = False,
    ) -> dict:
        return await self._start(
            "exec_cb",
            _check_str("pool", pool),
            list(objects),
            _as_bytes(program),
            _as_bytes(args),
            jit,
            cache,
        )
