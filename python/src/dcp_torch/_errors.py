"""dcp's errors as Python exceptions.

Every failure of the C engine raises a :class:`CheckpointError` (or a
subclass) carrying dcp's code (``.code``, a negative int), its name
(``.name``, e.g. ``"ENOENT"``) and dcp's message, which names the file, key,
rank or byte offset. Subclasses also derive from the matching built-in
exception where one exists (``NotFoundError`` is a ``FileNotFoundError``,
``ExistsError`` a ``FileExistsError``, ...), so ordinary ``except`` clauses
work too.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "InvalidArgumentError",
    "OutOfMemoryError",
    "StorageIOError",
    "NotFoundError",
    "FormatError",
    "UnsafeError",
    "CorruptError",
    "KeyMismatchError",
    "ShapeMismatchError",
    "LimitError",
    "PeerError",
    "NotSupportedError",
    "NoSpaceError",
    "ExistsError",
    "TimeoutError_",
    "BusyError",
    "PlanError",
]


try:  # torch's: what its save and load raise on any failure
    from torch.distributed.checkpoint.api import CheckpointException as _TorchCheckpointException
except Exception:  # pragma: no cover - torch without distributed
    class _TorchCheckpointException(BaseException):  # type: ignore[no-redef]
        pass


class CheckpointError(Exception, _TorchCheckpointException):
    """A dcp failure: ``code`` (dcp's negative error code), ``name`` (its
    symbolic name, e.g. ``"ECORRUPT"``) and ``message`` (dcp's message).
    An ``Exception``, and also torch's ``CheckpointException`` (what
    torch.distributed.checkpoint's save and load raise on any failure), so
    that ``except CheckpointException`` written for torch catches dcp's
    errors too; ``failures`` is empty (dcp's message names the rank)."""

    code: int = 0
    name: str = ""

    def __init__(self, message: str = "", code: int | None = None,
                 name: str | None = None) -> None:
        Exception.__init__(self, message)
        self._failures = {}
        self.message = message
        if code is not None:
            self.code = code
        if name is not None:
            self.name = name

    def __str__(self) -> str:
        return f"{self.message} [{self.name}]" if self.name else self.message

    def __reduce__(self):
        return (_make, (self.code, self.name, self.message))


def _sub(name: str, code: int, *bases: type, doc: str) -> type:
    cls = type(name, (CheckpointError, *bases), {"code": code, "name": "", "__doc__": doc})
    cls.name = "DCP_" + {
        -1: "EINVAL", -2: "ENOMEM", -3: "EIO", -4: "ENOENT", -5: "EFORMAT",
        -6: "EUNSAFE", -7: "ECORRUPT", -8: "EKEY", -9: "EMISMATCH",
        -10: "ELIMIT", -11: "EPEER", -12: "ENOTSUP", -13: "ENOSPC",
        -14: "EEXIST", -15: "ETIMEOUT", -16: "EBUSY", -17: "EPLAN",
    }[code]
    return cls


InvalidArgumentError = _sub("InvalidArgumentError", -1, ValueError, doc="DCP_EINVAL: invalid argument.")
OutOfMemoryError = _sub("OutOfMemoryError", -2, MemoryError, doc="DCP_ENOMEM: out of memory.")
StorageIOError = _sub("StorageIOError", -3, OSError, doc="DCP_EIO: the storage failed.")
NotFoundError = _sub("NotFoundError", -4, FileNotFoundError, doc="DCP_ENOENT: no such checkpoint or file.")
FormatError = _sub("FormatError", -5, doc="DCP_EFORMAT: a malformed checkpoint.")
UnsafeError = _sub("UnsafeError", -6, doc="DCP_EUNSAFE: refused unsafe input (a pickle naming a global outside the allow-list, ...).")
CorruptError = _sub("CorruptError", -7, doc="DCP_ECORRUPT: a checksum mismatch or truncated data.")
KeyMismatchError = _sub("KeyMismatchError", -8, KeyError, doc="DCP_EKEY: a missing or unexpected key.")
ShapeMismatchError = _sub("ShapeMismatchError", -9, ValueError, doc="DCP_EMISMATCH: a shape or dtype mismatch.")
LimitError = _sub("LimitError", -10, doc="DCP_ELIMIT: input exceeds a configured limit.")
PeerError = _sub("PeerError", -11, doc="DCP_EPEER: another rank failed.")
NotSupportedError = _sub("NotSupportedError", -12, NotImplementedError, doc="DCP_ENOTSUP: not supported.")
NoSpaceError = _sub("NoSpaceError", -13, OSError, doc="DCP_ENOSPC: no space left on the device.")
ExistsError = _sub("ExistsError", -14, FileExistsError, doc="DCP_EEXIST: already exists.")
TimeoutError_ = _sub("TimeoutError", -15, TimeoutError, doc="DCP_ETIMEOUT: timed out.")
BusyError = _sub("BusyError", -16, doc="DCP_EBUSY: another writer holds the checkpoint's lock.")
PlanError = _sub("PlanError", -17, doc="DCP_EPLAN: an invalid save plan.")

_BY_CODE = {c.code: c for c in (
    InvalidArgumentError, OutOfMemoryError, StorageIOError, NotFoundError,
    FormatError, UnsafeError, CorruptError, KeyMismatchError,
    ShapeMismatchError, LimitError, PeerError, NotSupportedError,
    NoSpaceError, ExistsError, TimeoutError_, BusyError, PlanError)}


def _make(code: int, name: str, message: str) -> CheckpointError:
    """The exception for dcp's code (the C extension's factory)."""
    cls = _BY_CODE.get(code, CheckpointError)
    err = cls(message, code=code, name=name)
    return err
