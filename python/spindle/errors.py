"""Spindle's errors as Python exceptions.

Every failure of the client raises a subclass of :class:`SpindleError`; most also
subclass the built-in exception a Python programmer would catch for that case
(``NotFound`` is a ``KeyError``, ``Timeout`` a ``TimeoutError``, ...).
"""


class SpindleError(Exception):
    """Any failure reported by the Spindle client."""


class NotFound(SpindleError, KeyError):
    """No such object (or pool)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message plain
        return str(self.args[0]) if self.args else ""


class InvalidArgument(SpindleError, ValueError):
    """The request was refused as malformed (a bad name, a size over the limit, ...)."""


class Timeout(SpindleError, TimeoutError):
    """The operation did not finish within the client's timeout (is the cluster up?)."""


class ConnectionFailed(SpindleError, ConnectionError):
    """The monitors could not be reached, or no cluster was found where it was looked for."""


class PermissionDenied(SpindleError, PermissionError):
    """The cluster refused this client's credentials or capabilities."""


class NoSpace(SpindleError, OSError):
    """The cluster is full."""


class Corrupt(SpindleError):
    """The data failed its checksum on every reachable copy."""


class ProgramFailed(SpindleError):
    """A pushdown program was refused by the verifier or stopped by a limit."""


class Conflict(SpindleError):
    """The object changed under a read-modify-write; retry."""


class Fenced(SpindleError):
    """Another client took over a lock this client held; its writes are refused."""


class ClientClosed(SpindleError):
    """The client (or the image) was closed."""


class AlreadyExists(SpindleError, FileExistsError):
    """An image of that name exists already."""


class Locked(Conflict):
    """Another client holds the image's exclusive lock (it serves the image)."""


class ReadOnly(SpindleError, PermissionError):
    """A write to an image opened read-only or at a snapshot."""


ALL = {
    c.__name__: c
    for c in (
        SpindleError,
        NotFound,
        InvalidArgument,
        Timeout,
        ConnectionFailed,
        PermissionDenied,
        NoSpace,
        Corrupt,
        ProgramFailed,
        Conflict,
        Fenced,
        ClientClosed,
        AlreadyExists,
        Locked,
        ReadOnly,
    )
}
