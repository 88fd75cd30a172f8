"""``specdeck worker``: this machine holds part of another SpecDeck's main model.

    specdeck worker                                  # 127.0.0.1:50052, every physical core
    specdeck worker --host 0.0.0.0 --port 50052 --threads 8

Runs llama.cpp's RPC server (from the same llama.cpp build SpecDeck runs, so the protocol
and the exact-batch kernels match) until Ctrl+C. It serves this machine's GPUs, else its
CPU. The RPC protocol has no authentication and no encryption: listen on another address
than 127.0.0.1 on trusted networks only (llama.cpp's warning says so). Another SpecDeck
then names it in its Workers field, or ``specdeck-bench --rpc HOST:PORT``.
"""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import sys

from backends.engines.hardware import physical_cores
from backends.engines.worker_probe import (
    DEFAULT_WORKER_HOST,
    DEFAULT_WORKER_PORT,
    OPEN_NETWORK_WARNING,
)
from backends.errors import SpecDeckError

PROG = "specdeck worker"
EXIT_BAD_SETTINGS = 2
EXIT_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``specdeck worker``."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Serve part of another SpecDeck's main model from this machine (llama.cpp's "
            "RPC server). Trusted networks only: the protocol has no authentication."
        ),
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_WORKER_HOST,
        help=f"IPv4 address to listen on (default {DEFAULT_WORKER_HOST}: this machine only; "
        "0.0.0.0: every network)",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_WORKER_PORT, help="port (default %(default)s)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: the physical cores)"
    )
    parser.add_argument(
        "--device",
        action="append",
        default=[],
        help="a llama.cpp device to serve (e.g. CUDA0; repeatable; default: every GPU, "
        "else the CPU)",
    )
    return parser


def check_listen_address(host: str, port: int) -> str | None:
    """Why the worker cannot listen on ``host:port`` (one line), or None when it can."""
    try:
        socket.inet_aton(host)
        if host.count(".") != 3:
            raise OSError
    except OSError:
        return f"--host {host!r}: give a numeric IPv4 address (127.0.0.1, 0.0.0.0, 192.168.1.20)"
    if not 0 < port < 65536:
        return f"--port {port}: give a port from 1 to 65535"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use (another worker?); choose --port"
            return f"cannot listen on {host}:{port}: {error.strerror or error}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the worker until it is stopped; the exit code."""
    args = build_parser().parse_args(argv)
    threads = args.threads if args.threads is not None else physical_cores()
    problem = check_listen_address(args.host, args.port)
    if problem is None and threads < 1:
        problem = f"--threads {threads}: give at least 1"
    if problem is not None:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    if args.host != DEFAULT_WORKER_HOST:
        print("\n" + OPEN_NETWORK_WARNING.format(host=args.host) + "\n", file=sys.stderr)
    print(
        f"{PROG}: llama.cpp RPC server on {args.host}:{args.port}, {threads} threads; "
        "Ctrl+C stops it",
        file=sys.stderr,
        flush=True,
    )
    # Native code runs from here on: let Ctrl+C end the process at once.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from backends.engines.rpc_worker import serve_worker  # loads llama.cpp

    try:
        serve_worker(args.host, args.port, threads, args.device)
    except SpecDeckError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
