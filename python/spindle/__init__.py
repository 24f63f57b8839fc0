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
import atexit
import os
import weakref
from typing import Any, Optional, Sequence

from . import _native
from .errors import (
    ALL as _ALL_ERRORS,
    AlreadyExists,
    ClientClosed,
    Conflict,
    ConnectionFailed,
    Corrupt,
    Fenced,
    InvalidArgument,
    NoSpace,
    NotFound,
    Locked,
    PermissionDenied,
    ProgramFailed,
    ReadOnly,
    SpindleError,
    Timeout,
)

_native._register_errors(dict(_ALL_ERRORS))
# Runtime threads must not enter Python while the interpreter finalizes.
atexit.register(_native._at_exit)

OBJECT_BYTES_MAX: int = _native.OBJECT_BYTES_MAX
Blob = _native.Blob

__all__ = [
    "Blob",
    "Client",
    "Image",
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
    "AlreadyExists",
    "Locked",
    "ReadOnly",
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


def _check_uint(what: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must not be negative, not {value}")
    return value


class _Port:
    """Where the operations started from one event loop end: the native side queues each
    end without taking the GIL and wakes the loop through one descriptor; the loop takes
    every end queued so far at once and settles their futures."""

    __slots__ = ("_queue", "_futures", "_next", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._queue = _native.CompletionQueue()
        self._futures: dict[int, asyncio.Future] = {}
        self._next = 0
        loop.add_reader(self._queue.fileno(), self._settle)

    def start(self, loop: asyncio.AbstractEventLoop, call: Any, *args: Any) -> asyncio.Future:
        """``call(*args, target)``, a native ``*_cb`` method; a future of its end."""
        fut = loop.create_future()
        self._next += 1
        token = self._next
        self._futures[token] = fut
        try:
            call(*args, self._queue.target(token))
        except BaseException:
            del self._futures[token]
            raise
        return fut

    def release(self) -> None:
        """Lets the queue go, for a loop that was closed: its socket pair closes once no
        operation still running holds it."""
        self._queue = None
        self._futures.clear()

    def _settle(self) -> None:
        if self._queue is None:
            return
        for token, err, value in self._queue.take():
            fut = self._futures.pop(token, None)
            if fut is None or fut.done():
                continue  # cancelled meanwhile
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(value)


_ports: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Port]" = weakref.WeakKeyDictionary()


def _start_on_loop(call: Any, *args: Any) -> asyncio.Future:
    """Starts a native ``*_cb`` call; a future of its end on the running loop."""
    loop = asyncio.get_running_loop()
    port = _ports.get(loop)
    if port is None:
        # A closed loop lives on in reference cycles until the cyclic garbage collector
        # runs, and its port (held by `_ports`) with it: the ports of loops closed since
        # the last new one are let go now, so the descriptors of a process that makes loop
        # after loop (`asyncio.run` in a loop) stay flat.
        for old in [lp for lp in list(_ports.keys()) if lp.is_closed()]:
            stale = _ports.pop(old, None)
            if stale is not None:
                stale.release()
        port = _ports[loop] = _Port(loop)
    return port.start(loop, call, *args)


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
        shards: bool = False,
    ) -> dict:
        """Runs the eBPF object file ``program`` next to ``objects``:
        ``{"ret": int, "output": bytes, "parts": list}``.

        With ``shards=True`` on an erasure-coded pool the program runs once per data shard,
        on the daemon holding it, over that shard's stripe units of each object
        (``in->part``, ``in->parts``, ``in->stripe_unit``): ``parts`` is ``(ret, output)``
        per shard in shard order, ``ret`` their sum and ``output`` theirs back to back. On
        a replicated pool, and without ``shards``, the run sees whole objects and
        ``parts`` is empty."""
        return self._c.exec(
            _check_str("pool", pool), list(objects), _as_bytes(program), _as_bytes(args), jit,
            cache, shards,
        )

    # -- images -----------------------------------------------------------------------

    def image_create(
        self, pool: str, name: str, size: int, *, object_size: Optional[int] = None
    ) -> dict:
        """Creates image ``name`` of ``size`` bytes (a multiple of 512) in ``pool``: thin
        (no data is written), in objects of ``object_size`` bytes (default: the pool's).
        Returns its description; :class:`AlreadyExists` if the name is taken."""
        return self._c.image_create(
            _check_str("pool", pool),
            _check_str("name", name),
            _check_uint("size", size),
            None if object_size is None else _check_uint("object_size", object_size),
        )

    def image_open(
        self,
        pool: str,
        name: str,
        *,
        read_only: bool = False,
        snapshot: Optional[str] = None,
        take_over: bool = False,
    ) -> "Image":
        """Opens image ``name``. For writing (the default) it takes the image's exclusive
        lock, as ``spindle nbd`` does: :class:`Locked` while another live client holds it,
        unless ``take_over`` (which fences the other writer). ``read_only`` or a
        ``snapshot`` name opens it without the lock; writes then raise :class:`ReadOnly`."""
        if snapshot is not None:
            _check_str("snapshot", snapshot)
        return Image(
            self._c.image_open(
                _check_str("pool", pool),
                _check_str("name", name),
                bool(read_only),
                snapshot,
                bool(take_over),
            )
        )

    def image_list(self, pool: str) -> list[dict]:
        """The images of ``pool``, sorted by name, as dicts (``name``, ``size``, ...)."""
        return self._c.image_list(_check_str("pool", pool))

    def image_remove(self, pool: str, name: str) -> None:
        """Removes image ``name`` and its data; refused (:class:`Locked`) while someone
        serves it, and while it has snapshots."""
        self._c.image_remove(_check_str("pool", pool), _check_str("name", name))

    async def image_open_async(
        self,
        pool: str,
        name: str,
        *,
        read_only: bool = False,
        snapshot: Optional[str] = None,
        take_over: bool = False,
    ) -> "Image":
        if snapshot is not None:
            _check_str("snapshot", snapshot)
        native = await self._start(
            "image_open_cb",
            _check_str("pool", pool),
            _check_str("name", name),
            bool(read_only),
            snapshot,
            bool(take_over),
        )
        return Image(native)

    # -- asyncio ----------------------------------------------------------------------

    def _start(self, method: str, *args: Any) -> asyncio.Future:
        return _start_on_loop(getattr(self._c, method), *args)

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
            "get_cb", _check_str("pool", pool), _check_str("name", name), offset, length, False
        )

    async def get_blob_async(
        self, pool: str, name: str, *, offset: int = 0, length: Optional[int] = None
    ) -> Blob:
        """:meth:`get_async` without copying the bytes into a ``bytes`` object: a
        :class:`Blob` that ``numpy.asarray`` views in place (read-only) and ``bytes()``
        copies. For large reads whose bytes go on to NumPy (a Zarr store's chunks)."""
        return await self._start(
            "get_cb", _check_str("pool", pool), _check_str("name", name), offset, length, True
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

    async def exec_batch_async(
        self,
        pool: str,
        items: Sequence[tuple[str, bytes]],
        program: bytes,
        *,
        jit: bool = True,
        cache: bool = False,
        in_flight: int = 256,
        group_output_bytes: Optional[int] = None,
    ) -> list[Optional[tuple[int, bytes]]]:
        """Runs ``program`` once per ``(object, args)`` item, up to ``in_flight`` runs at
        a time, all scheduled by the client's runtime (one Python callback for the whole
        batch). Returns, in the items' order, ``(ret, output)`` per run, or ``None`` where
        the object does not exist; any other failure raises.

        With ``group_output_bytes``, items of one placement group with the same arguments
        share a run (up to 16 objects: fewer messages and program starts); the program
        must then emit exactly that many bytes per object it sees, in the run's order
        (``in->objects``), and each item gets its share with the run's return value."""
        batch = [(_check_str("object", n), _as_bytes(a)) for n, a in items]
        if group_output_bytes is not None:
            group_output_bytes = _check_uint("group_output_bytes", group_output_bytes)
        return await self._start(
            "exec_batch_cb",
            _check_str("pool", pool),
            batch,
            _as_bytes(program),
            jit,
            cache,
            _check_uint("in_flight", in_flight),
            group_output_bytes,
        )

    async def exec_async(
        self,
        pool: str,
        objects: Sequence[str],
        program: bytes,
        args: bytes = b"",
        *,
        jit: bool = True,
        cache: bool = False,
        shards: bool = False,
    ) -> dict:
        """:meth:`exec` from a coroutine."""
        return await self._start(
            "exec_cb",
            _check_str("pool", pool),
            list(objects),
            _as_bytes(program),
            _as_bytes(args),
            jit,
            cache,
            shards,
        )


def _start_native(obj: Any, method: str, *args: Any) -> asyncio.Future:
    return _start_on_loop(getattr(obj, method), *args)


class Image:
    """A block image of the cluster, from :meth:`Client.image_open`.

    Offsets and lengths are in bytes; reads of never-written ranges give zeros; a write
    returns once it is durable on every up replica. Open for writing, the image holds its
    exclusive lock until :meth:`close` (or the end of a ``with`` block); if another client
    takes the lock over, writes raise :class:`Fenced`.

    >>> with c.image_open("default", "disk") as img:
    ...     img.write(4096, b"x" * 4096)
    ...     img.read(4096, 4)
    b'xxxx'
    """

    def __init__(self, native: Any) -> None:
        self._i = native

    def __repr__(self) -> str:
        if self.closed:
            return "<spindle.Image (closed)>"
        i = self.info()
        mode = "read-only" if self.read_only else "read-write"
        return f"<spindle.Image {i['pool']}/{i['name']} {i['size']} bytes {mode}>"

    @property
    def closed(self) -> bool:
        return self._i.closed

    @property
    def size(self) -> int:
        """The image's size in bytes."""
        return self._i.size

    @property
    def read_only(self) -> bool:
        return self._i.read_only

    def info(self) -> dict:
        """``name``, ``pool``, ``size``, ``object_size``, ``object_count``, ``parent``..."""
        return self._i.info()

    def read(self, offset: int, length: int) -> bytes:
        return self._i.read(_check_uint("offset", offset), _check_uint("length", length))

    def write(self, offset: int, data: bytes) -> None:
        self._i.write(_check_uint("offset", offset), _as_bytes(data))

    def discard(self, offset: int, length: int) -> None:
        """Makes the range read as zeros and frees its space."""
        self._i.discard(_check_uint("offset", offset), _check_uint("length", length))

    def flush(self) -> None:
        """Waits for every write started before it."""
        self._i.flush()

    def resize(self, size: int) -> None:
        self._i.resize(_check_uint("size", size))

    def close(self) -> None:
        """Flushes and gives the lock back. Later calls raise :class:`ClientClosed`."""
        self._i.close()

    def __enter__(self) -> "Image":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def read_async(self, offset: int, length: int) -> bytes:
        return await _start_native(
            self._i, "read_cb", _check_uint("offset", offset), _check_uint("length", length)
        )

    async def write_async(self, offset: int, data: bytes) -> None:
        await _start_native(self._i, "write_cb", _check_uint("offset", offset), _as_bytes(data))

    async def flush_async(self) -> None:
        await _start_native(self._i, "flush_cb")

    async def close_async(self) -> None:
        await _start_native(self._i, "close_cb")

    async def __aenter__(self) -> "Image":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close_async()
