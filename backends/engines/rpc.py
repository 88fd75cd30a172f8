"""llama.cpp's RPC backend: worker machines that hold part of the main model's layers.

A worker runs llama.cpp's RPC server (``specdeck worker``, :func:`serve_worker`); the engine
connects to it and places layers there as on a local GPU. llama.cpp's client has no
timeouts and aborts the process when a worker is unreachable or dies, so SpecDeck keeps it
on a short leash:

- every worker is probed from Python first (:func:`probe_worker`: connect, llama.cpp's HELLO,
  the device count and memory, each wait with a timeout), so an unreachable one is a
  one-line error naming it, never an abort;
- once a model is loaded, its connections (:class:`WorkerConnections`) get TCP keepalive
  and a reply timeout sized to the batch, and are checked before every forward pass: a
  worker that went away between answers is an error, not an abort; one that dies during a
  pass ends the engine process (the window's crash path, which names the worker);
- the RPC devices are never registered with ggml, so a model loaded without workers (the
  draft) stays on this machine.

The wire format used by the probe is llama.cpp's (ggml-rpc.cpp): a command byte, a 64-bit
little-endian size and the payload; the reply is a size and a payload.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backends.errors import SettingsError, SpecDeckError

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger(__name__)

DEFAULT_WORKER_PORT = 50052
DEFAULT_WORKER_HOST = "127.0.0.1"
PROBE_TIMEOUT_SECONDS = 3.0
# The RPC protocol of the pinned llama.cpp (ggml-rpc.h): a worker must speak 7.0.x.
# tests/test_llama_build.py checks it against the built ggml-rpc.h and a worker.
PROTOCOL_MAJOR = 7
PROTOCOL_MINOR = 0
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

# enum rpc_cmd and the hello's sizes of ggml-rpc.cpp (a worker of the built library answers
# them in tests/test_llama_build.py)
_CMD_GET_DEVICE_MEMORY = 11
_CMD_HELLO = 14
_CMD_DEVICE_COUNT = 15
_CONNECTION_CAPS_SIZE = 24
_HELLO_REPLY = struct.Struct("<BBBB24s")
_SIZE = struct.Struct("<Q")

# The warning llama.cpp's rpc-server prints for any bind address but 127.0.0.1.
OPEN_NETWORK_WARNING = (
    "WARNING: Host ('{host}') is != '127.0.0.1'\n"
    "         Never expose the RPC server to an open network!\n"
    "         This is an experimental feature and is not secure!"
)


class WorkerError(SpecDeckError):
    """A worker that cannot be used: unreachable, busy, another protocol, gone."""


@dataclass(frozen=True, order=True)
class WorkerAddress:
    """Where a worker listens: an IPv4 address or host name, and a port."""

    host: str
    port: int = DEFAULT_WORKER_PORT

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    def resolve(self) -> str:
        """The IPv4 address llama.cpp connects to (it resolves names to IPv4 only); once."""
        return _resolve(self.host, str(self))

    @property
    def endpoint(self) -> str:
        """The "ip:port" llama.cpp's RPC client is given."""
        return f"{self.resolve()}:{self.port}"


@functools.cache
def _resolve(host: str, worker: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as error:
        raise WorkerError(f"worker {worker}: cannot resolve {host!r} ({error})") from None


def parse_worker(text: str) -> WorkerAddress:
    """``host:port`` (or ``host``, port 50052) as a WorkerAddress; SettingsError if malformed."""
    item = text.strip()
    host, colon, port_text = item.rpartition(":")
    if not colon:
        host, port_text = item, str(DEFAULT_WORKER_PORT)
    host = host.strip()
    if not host or any(c.isspace() for c in host) or "[" in host:
        raise SettingsError(f"worker {item!r}: give it as host:port, e.g. 192.168.1.20:50052")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise SettingsError(f"worker {item!r}: the port must be a number from 1 to 65535")
    return WorkerAddress(host, int(port_text))


def parse_workers(text: str | Sequence[str]) -> tuple[WorkerAddress, ...]:
    """Workers from "a:1,b:2" (commas or spaces) or a list of such items; no duplicates."""
    items = text.replace(",", " ").split() if isinstance(text, str) else list(text)
    workers = tuple(parse_worker(item) for item in items if item.strip())
    seen: set[WorkerAddress] = set()
    for worker in workers:
        if worker in seen:
            raise SettingsError(f"worker {worker} is listed twice")
        seen.add(worker)
    return workers


def parse_split(text: str | Sequence[float], n_workers: int) -> tuple[float, ...]:
    """A layer split: one share per worker and the last for this computer ("3,1,0").

    Empty means by free memory (returned as ``()``).
    """
    if isinstance(text, str):
        parts = [part for part in text.replace(",", " ").split() if part]
        try:
            shares = tuple(float(part) for part in parts)
        except ValueError:
            raise SettingsError(
                f"layer split {text!r}: give one number per worker and one for this computer"
            ) from None
    else:
        shares = tuple(float(share) for share in text)
    if not shares:
        return ()
    if n_workers == 0:
        raise SettingsError("a layer split needs workers to split across")
    if len(shares) != n_workers + 1:
        raise SettingsError(
            f"layer split has {len(shares)} shares; give {n_workers + 1}: one per worker "
            "and the last for this computer"
        )
    if any(share < 0 for share in shares) or sum(shares) <= 0:
        raise SettingsError("layer split: shares must be >= 0 and not all 0")
    return shares


# -- probing a worker from Python (every wait with a timeout) ---------------------------------


@dataclass(frozen=True)
class WorkerDevice:
    """One device a worker serves, with its memory as the worker reports it."""

    index: int
    memory_free: int
    memory_total: int


@dataclass(frozen=True)
class WorkerStatus:
    """What a probe found: reachable or why not, the protocol version, devices and memory."""

    address: WorkerAddress
    reachable: bool
    problem: str = ""  # one line when not reachable
    version: str = ""
    devices: tuple[WorkerDevice, ...] = field(default=())

    @property
    def memory_free(self) -> int:
        """Free bytes over the worker's devices."""
        return sum(device.memory_free for device in self.devices)

    @property
    def memory_total(self) -> int:
        """Total bytes over the worker's devices."""
        return sum(device.memory_total for device in self.devices)

    def summary(self) -> str:
        """E.g. "127.0.0.1:50052: reachable, 3.1 GB of 24.0 GB free"."""
        if not self.reachable:
            return f"{self.address}: {self.problem}"
        return (
            f"{self.address}: reachable, {self.memory_free / 1e9:.1f} GB of "
            f"{self.memory_total / 1e9:.1f} GB free"
        )


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        data += chunk
    return data


def _command(connection: socket.socket, command: int, payload: bytes, reply_size: int) -> bytes:
    connection.sendall(bytes([command]) + _SIZE.pack(len(payload)) + payload)
    (size,) = _SIZE.unpack(_receive_exactly(connection, _SIZE.size))
    if size != reply_size:
        raise ConnectionError(f"unexpected reply ({size} bytes, expected {reply_size})")
    return _receive_exactly(connection, size)


def probe_worker(address: WorkerAddress, timeout: float = PROBE_TIMEOUT_SECONDS) -> WorkerStatus:
    """Ask a worker for its protocol version, devices and memory; never raises, never hangs.

    A worker serves one client at a time: one that accepts the connection but does not
    answer within ``timeout`` is busy with another (or hung).
    """
    try:
        ip = address.resolve()
    except WorkerError as error:
        return WorkerStatus(address, False, str(error).removeprefix(f"worker {address}: "))
    try:
        with socket.create_connection((ip, address.port), timeout=timeout) as connection:
            hello = _command(
                connection, _CMD_HELLO, bytes(_CONNECTION_CAPS_SIZE), _HELLO_REPLY.size
            )
            major, minor, patch, _pad, _caps = _HELLO_REPLY.unpack(hello)
            version = f"{major}.{minor}.{patch}"
            if major != PROTOCOL_MAJOR or minor > PROTOCOL_MINOR:
                return WorkerStatus(
                    address,
                    False,
                    f"speaks RPC protocol {version}; this SpecDeck needs "
                    f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}.x (run the same SpecDeck version there)",
                    version,
                )
            (count,) = struct.unpack("<I", _command(connection, _CMD_DEVICE_COUNT, b"", 4))
            devices = []
            for index in range(count):
                reply = _command(connection, _CMD_GET_DEVICE_MEMORY, struct.pack("<I", index), 16)
                free, total = struct.unpack("<QQ", reply)
                devices.append(WorkerDevice(index, free, total))
    except TimeoutError:
        return WorkerStatus(
            address, False, f"did not answer within {timeout:g} s (busy with another client?)"
        )
    except ConnectionRefusedError:
        return WorkerStatus(address, False, "connection refused (is `specdeck worker` running?)")
    except (OSError, ConnectionError) as error:
        return WorkerStatus(address, False, _os_problem(error))
    if not devices:
        return WorkerStatus(address, False, "serves no device", version)
    return WorkerStatus(address, True, "", version, tuple(devices))


def _os_problem(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno is not None and error.strerror:
        return error.strerror.lower()
    return str(error) or type(error).__name__


def check_workers(
    addresses: Sequence[WorkerAddress], timeout: float = PROBE_TIMEOUT_SECONDS
) -> tuple[WorkerStatus, ...]:
    """Probe every worker; WorkerError naming the first that cannot be used."""
    statuses = tuple(probe_worker(address, timeout) for address in addresses)
    for status in statuses:
        if not status.reachable:
            raise WorkerError(f"worker {status.address} is unreachable: {status.problem}")
    return statuses


def wait_for_worker(address: WorkerAddress, timeout: float) -> WorkerStatus:
    """Probe until the worker answers or ``timeout`` passes; the last status."""
    deadline = time.monotonic() + timeout
    while True:
        status = probe_worker(address, timeout=min(PROBE_TIMEOUT_SECONDS, timeout))
        if status.reachable or time.monotonic() >= deadline:
            return status
        time.sleep(0.1)


# -- the layer split --------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerSplit:
    """How llama.cpp is told to place the main model: devices, their shares, layers off-CPU."""

    n_gpu_layers: int  # llama_model_params.n_gpu_layers (999: all, the output layer too)
    device_shares: tuple[float, ...]  # tensor_split, one per device in the devices list


def split_layers(
    n_layers: int,
    worker_shares: Sequence[float],
    local_gpu_shares: Sequence[float],
    local_cpu_share: float,
) -> LayerSplit:
    """Where the layers go: workers first, then this computer's GPUs, the rest on its CPU.

    llama.cpp counts the output layer as one more layer after the ``n_layers`` repeating
    ones: ``n_gpu_layers`` = k puts the output layer and the last k - 1 repeating layers on
    the devices (spread by their shares) and the rest on the CPU. With local GPUs the CPU
    keeps none; without, it keeps its share of the repeating layers (rounded; workers keep
    at least one each when their share is not 0).
    """
    shares = (*worker_shares, *local_gpu_shares)
    if local_gpu_shares or local_cpu_share <= 0:
        return LayerSplit(999, shares)
    total = sum(shares) + local_cpu_share
    remote = round(n_layers * sum(shares) / total) if total > 0 else 0
    remote = max(remote, sum(1 for share in shares if share > 0))
    return LayerSplit(min(remote, n_layers) + 1, shares)


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
    "DEFAULT_WORKER_HOST",
    "DEFAULT_WORKER_PORT",
    "OPEN_NETWORK_WARNING",
    "LayerSplit",
    "RemoteDevice",
    "WorkerAddress",
    "WorkerConnections",
    "WorkerDevice",
    "WorkerError",
    "WorkerStatus",
    "HeldLinks",
    "check_workers",
    "connect_devices",
    "device_memory",
    "holds_connection",
    "parse_split",
    "parse_worker",
    "parse_workers",
    "probe_worker",
    "refuse_abandoned",
    "require_rpc_function",
    "split_layers",
    "wait_for_worker",
]
