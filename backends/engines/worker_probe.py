"""A worker's address, parsed and resolved, and the probe that asks it over llama.cpp's RPC.

A worker runs llama.cpp's RPC server (``specdeck worker``). llama.cpp's client aborts the
process when a worker is unreachable, so every worker is probed from Python first
(:func:`probe_worker`: connect, llama.cpp's HELLO, the device count and memory, each wait
with a timeout): an unreachable one is a one-line error naming it, never an abort. The
window and the service use this module alone (no llama.cpp) to parse the Workers field and
to ask which worker went away.

The wire format used by the probe is llama.cpp's (ggml-rpc.cpp): a command byte, a 64-bit
little-endian size and the payload; the reply is a size and a payload.
"""

from __future__ import annotations

import functools
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backends.errors import SettingsError, SpecDeckError

if TYPE_CHECKING:
    from collections.abc import Sequence

DEFAULT_WORKER_PORT = 50052
DEFAULT_WORKER_HOST = "127.0.0.1"
PROBE_TIMEOUT_SECONDS = 3.0
# The RPC protocol of the pinned llama.cpp (ggml-rpc.h): a worker must speak 7.0.x.
# tests/test_llama_build.py checks it against the built ggml-rpc.h and a worker.
PROTOCOL_MAJOR = 7
PROTOCOL_MINOR = 0

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


__all__ = [
    "DEFAULT_WORKER_HOST",
    "DEFAULT_WORKER_PORT",
    "OPEN_NETWORK_WARNING",
    "PROBE_TIMEOUT_SECONDS",
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "WorkerAddress",
    "WorkerDevice",
    "WorkerError",
    "WorkerStatus",
    "check_workers",
    "parse_worker",
    "parse_workers",
    "probe_worker",
    "wait_for_worker",
]
