"""llama.cpp's RPC client in this process: the workers' devices, and a watch on their links.

llama.cpp's client has no timeouts and aborts the process when a worker is unreachable or
dies, so SpecDeck keeps it on a short leash. The workers are probed first
(:mod:`backends.engines.worker_probe`); then:

- their devices are made in llama.cpp's client through ctypes (:func:`connect_devices`) and
  never registered with ggml, so a model loaded without workers (the draft) stays on this
  machine; :class:`HeldLinks` keeps each worker's connection open from the probe to the
  end of the load;
- once a model is loaded, its connections (:class:`WorkerConnections`) get TCP keepalive
  and a reply timeout sized to the batch, and are checked before every forward pass: a
  worker that went away between answers is an error, not an abort; one that dies during a
  pass ends the engine process (the window's crash path, which names the worker).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.engines.worker_probe import WorkerError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.worker_probe import WorkerAddress

log = logging.getLogger(__name__)

# Reply timeout of a forward pass on workers: this many times the slowest seconds per
# token seen so far, and never below the floor (``$SPECDECK_RPC_TIMEOUT`` sets the floor).
REPLY_TIMEOUT_FACTOR = 20.0
REPLY_TIMEOUT_FLOOR_SECONDS = 30.0
REPLY_TIMEOUT_ENV = "SPECDECK_RPC_TIMEOUT"
# A dead host (no reset) is noticed within idle + interval x count seconds.
KEEPALIVE_IDLE_SECONDS = 5
KEEPALIVE_INTERVAL_SECONDS = 2
KEEPALIVE_COUNT = 3
# Sent data unacknowledged this long: the connection is dead (TCP_USER_TIMEOUT, ms).
UNACKED_TIMEOUT_MS = 15_000


# -- the native client ------------------------------------------------------------------------


def _libggml() -> ctypes.CDLL:
    from backends.engines.hardware import ggml_device_library

    lib = ggml_device_library()
    if lib is None:
        raise WorkerError("llama.cpp's ggml library cannot be loaded")
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_backend_dev_init.restype = ctypes.c_void_p
    lib.ggml_backend_dev_init.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_free.restype = None
    lib.ggml_backend_free.argtypes = [ctypes.c_void_p]
    return lib


def device_memory(device: int) -> tuple[int, int]:
    """(free, total) bytes of a ggml device; for a worker's, asked over its connection."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _libggml().ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
    return int(free.value), int(total.value)


class HeldLinks:
    """One backend per worker device, so that llama.cpp keeps each worker's connection open.

    llama.cpp's client shares a connection between everything that uses a worker and
    closes it when the last user goes; holding one from the probe to the end of the load
    keeps the connection the model will use, so its options (timeouts) apply to the load.
    """

    def __init__(self, devices: Sequence[RemoteDevice]) -> None:
        lib = _libggml()
        self._backends = [lib.ggml_backend_dev_init(device.pointer, None) for device in devices]

    def release(self) -> None:
        lib = _libggml()
        for backend in self._backends:
            if backend:
                lib.ggml_backend_free(backend)
        self._backends = []


def _rpc_function(name: str) -> int | None:
    from backends.engines.hardware import load_ggml_backends

    load_ggml_backends()
    lib = _libggml()
    registry = lib.ggml_backend_reg_by_name(b"RPC")
    if not registry:
        return None
    address: int | None = lib.ggml_backend_reg_get_proc_address(registry, name.encode())
    return address or None


def require_rpc_function(name: str) -> int:
    """The address of one of the RPC backend's functions; WorkerError when it is not built."""
    address = _rpc_function(name)
    if address is None:
        raise WorkerError(
            "this llama.cpp build has no RPC backend; reinstall with scripts/setup "
            "(it builds llama-cpp-python with GGML_RPC=ON)"
        )
    return address


@dataclass(frozen=True)
class RemoteDevice:
    """A worker's device as llama.cpp's client knows it."""

    address: WorkerAddress
    name: str  # "RPC0", "RPC1", ... (numbered across the process)
    pointer: int  # ggml_backend_dev_t


def connect_devices(addresses: Sequence[WorkerAddress]) -> tuple[RemoteDevice, ...]:
    """Each worker's devices in llama.cpp's RPC client (not registered with ggml).

    Only for workers just probed, or held: llama.cpp aborts on an unreachable one.
    """
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
        require_rpc_function("ggml_backend_rpc_add_server")
    )
    lib = _libggml()
    devices = []
    for address in addresses:
        registry = add_server(address.endpoint.encode())
        if not registry:
            raise WorkerError(f"worker {address}: llama.cpp found no device there")
        for index in range(lib.ggml_backend_reg_dev_count(registry)):
            pointer = lib.ggml_backend_reg_dev_get(registry, index)
            name = (lib.ggml_backend_dev_name(pointer) or b"RPC").decode(errors="replace")
            devices.append(RemoteDevice(address, name, int(pointer)))
    return tuple(devices)


# -- the connection watch ---------------------------------------------------------------------


# Live connections this process holds to workers (one per worker: llama.cpp shares it
# between models); a probe cannot reach a worker while we hold it, nor does it need to.
_held: dict[WorkerAddress, socket.socket] = {}
# Workers whose link a model left to the process's end (its worker lost) still uses.
_pinned: set[WorkerAddress] = set()
# Workers this process lost while a model held them: llama.cpp keeps their dead link.
_abandoned: set[WorkerAddress] = set()


def refuse_abandoned(addresses: Sequence[WorkerAddress]) -> None:
    """WorkerError for a worker this process lost: llama.cpp would reuse its dead link."""
    for address in addresses:
        if address in _abandoned:
            raise WorkerError(
                f"worker {address} was lost by this engine process; restart it to use "
                "that worker again (Reload models does)"
            )


def holds_connection(address: WorkerAddress) -> bool:
    """Whether this process already has a live connection to the worker."""
    held = _held.get(address)
    return held is not None and not _closed(held)


class WorkerConnections:
    """The engine's live TCP connections to its workers: kept alive, timed, checked.

    Found by their remote address among this process's sockets once a model holds them;
    each is duplicated (the same socket) so that options can be set and its state read.
    """

    def __init__(self, addresses: Sequence[WorkerAddress]) -> None:
        self.addresses = tuple(addresses)
        self._sockets: dict[WorkerAddress, socket.socket] = {}
        self._reply_timeout = -1.0
        self._slowest_token_seconds = 0.0
        wanted = {(address.resolve(), address.port): address for address in self.addresses}
        import psutil

        for connection in psutil.Process().net_connections(kind="tcp"):
            if not connection.raddr or connection.fd < 0:
                continue
            address = wanted.get((connection.raddr.ip, connection.raddr.port))
            if address is None or address in self._sockets:
                continue
            duplicate = socket.socket(fileno=os.dup(connection.fd))
            self._sockets[address] = duplicate
            _keep_alive(duplicate)
            previous = _held.get(address)
            if previous is not None:
                previous.close()
            _held[address] = duplicate
        missing = [str(a) for a in self.addresses if a not in self._sockets]
        if missing:
            log.warning("no connection found to worker(s) %s", ", ".join(missing))
        self.set_reply_timeout(self.reply_timeout_floor())

    @staticmethod
    def reply_timeout_floor() -> float:
        """The shortest reply timeout (``$SPECDECK_RPC_TIMEOUT`` seconds, default 30)."""
        try:
            return max(0.5, float(os.environ.get(REPLY_TIMEOUT_ENV, "")))
        except ValueError:
            return REPLY_TIMEOUT_FLOOR_SECONDS

    def set_reply_timeout(self, seconds: float) -> None:
        """Bound every wait for a worker's reply (SO_RCVTIMEO and SO_SNDTIMEO)."""
        if abs(seconds - self._reply_timeout) < 0.5:
            return
        self._reply_timeout = seconds
        whole = int(seconds)
        value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
        for connection in self._sockets.values():
            try:
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
            except OSError as error:
                log.debug("cannot set the reply timeout: %s", error)

    def before_pass(self, n_tokens: int) -> None:
        """Before a forward pass of ``n_tokens``: every worker still there, timeouts sized."""
        gone = self.lost()
        if gone:
            raise WorkerError(
                f"worker {gone[0]} is gone (its connection closed); "
                "Reload models to load again without it"
            )
        expected = n_tokens * self._slowest_token_seconds * REPLY_TIMEOUT_FACTOR
        self.set_reply_timeout(max(self.reply_timeout_floor(), expected))

    def after_pass(self, n_tokens: int, seconds: float) -> None:
        """A pass of ``n_tokens`` took ``seconds``: the slowest rate sizes later timeouts."""
        if n_tokens > 0:
            self._slowest_token_seconds = max(self._slowest_token_seconds, seconds / n_tokens)

    def lost(self) -> list[WorkerAddress]:
        """Workers whose connection the other side closed (or reset)."""
        return [address for address, sock in self._sockets.items() if _closed(sock)]

    def close(self, *, model_kept: bool = False) -> None:
        """Let go of the connections.

        ``model_kept``: the model stays in memory (a worker was lost), so the links still
        open stay known as held, and the lost workers are refused from now on.
        """
        for address, connection in self._sockets.items():
            registered = _held.get(address) is connection
            if model_kept and not _closed(connection):
                _pinned.add(address)
                continue
            if model_kept:
                _abandoned.add(address)
            if registered and address in _pinned:
                continue  # the model left in memory still uses this link
            if registered:
                del _held[address]
            connection.close()
        self._sockets.clear()


def _keep_alive(connection: socket.socket) -> None:
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), KEEPALIVE_IDLE_SECONDS),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL_SECONDS),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_COUNT),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), UNACKED_TIMEOUT_MS),
    ]
    for level, option, value in options:
        if option is None:
            continue
        try:
            connection.setsockopt(level, option, value)
        except OSError as error:
            log.debug("socket option %s: %s", option, error)


def _closed(connection: socket.socket) -> bool:
    """Whether the peer closed the connection: a peek finds end of file or an error."""
    try:
        data = connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError as error:
        # EBADF: not ours to judge (closed on our side), not a worker gone.
        return error.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR, errno.EBADF)
    return data == b""


__all__ = [
    "REPLY_TIMEOUT_ENV",
    "HeldLinks",
    "RemoteDevice",
    "WorkerConnections",
    "connect_devices",
    "device_memory",
    "holds_connection",
    "refuse_abandoned",
    "require_rpc_function",
]
