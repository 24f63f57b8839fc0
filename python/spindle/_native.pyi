"""Types of the native module (`python/src/lib.rs`); use `spindle.Client` instead."""

from os import PathLike
from typing import Any, Callable, Optional

OBJECT_BYTES_MAX: int
REDUCE_PROGRAM: bytes

_Callback = Callable[[Optional[BaseException], Any], None]

def _register_errors(classes: dict[str, type[BaseException]]) -> None: ...

class Client:
    @staticmethod
    def connect(
        dir: Optional[str | PathLike[str]] = None,
        mon: Optional[str] = None,
        keyring: Optional[str | PathLike[str]] = None,
        name: Optional[str] = None,
        timeout_ms: int = 30000,
    ) -> Client: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def get(self, pool: str, name: str, offset: int = 0, length: Optional[int] = None) -> bytes: ...
    def get_cb(
        self, pool: str, name: str, offset: int, length: Optional[int], callback: _Callback
    ) -> None: ...
    def put(self, pool: str, name: str, data: bytes, offset: Optional[int] = None) -> None: ...
    def put_cb(
        self, pool: str, name: str, data: bytes, offset: Optional[int], callback: _Callback
    ) -> None: ...
    def delete(self, pool: str, name: str, missing_ok: bool = False) -> None: ...
    def delete_cb(self, pool: str, name: str, missing_ok: bool, callback: _Callback) -> None: ...
    def stat(self, pool: str, name: str) -> dict[str, Any]: ...
    def stat_cb(self, pool: str, name: str, callback: _Callback) -> None: ...
    def list(self, pool: str, prefix: str = "") -> list[tuple[str, int]]: ...
    def list_cb(self, pool: str, prefix: str, callback: _Callback) -> None: ...
    def exec(
        self,
        pool: str,
        objects: list[str],
        program: bytes,
        args: bytes = b"",
        jit: bool = True,
        cache: bool = False,
    ) -> dict[str, Any]: ...
    def exec_cb(
        self,
        pool: str,
        objects: list[str],
        program: bytes,
        args: bytes,
        jit: bool,
        cache: bool,
        callback: _Callback,
    ) -> None: ...
