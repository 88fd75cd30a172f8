"""The API listening from a thread and event loop of its own (for the engine process)."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from backends.service.api.app import ApiServer


class ApiHost:
    """An :class:`~backends.service.api.app.ApiServer` on a thread and event loop of its own.

    For a process whose main thread is busy generating (the engine process): ``start``
    returns once the port is open (or raises OSError saying why it is not), ``stop`` closes
    it and waits for the thread.
    """

    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Open the port; returns the API's base URL (``http://host:port/v1``)."""
        loop = asyncio.new_event_loop()
        opened = threading.Event()
        outcome: dict[str, Any] = {}
        settings = self.api.settings

        def serve() -> None:
            asyncio.set_event_loop(loop)
            runner = web.AppRunner(self.api.app, access_log=None, handle_signals=False)
            loop.run_until_complete(runner.setup())
            try:
                loop.run_until_complete(web.TCPSite(runner, settings.host, settings.port).start())
            except OSError as error:
                outcome["error"] = error
            else:
                host, port = runner.addresses[0][:2]
                outcome["url"] = f"http://{host}:{port}/v1"
            opened.set()
            if "url" in outcome:
                loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        thread = threading.Thread(target=serve, name="api", daemon=True)
        thread.start()
        opened.wait()
        if "error" in outcome:
            thread.join()
            error: OSError = outcome["error"]
            raise OSError(
                error.errno, f"cannot listen on {settings.host}:{settings.port}: {error.strerror}"
            )
        self._loop, self._thread, self.url = loop, thread, str(outcome["url"])
        return self.url

    def stop(self) -> None:
        """Close the port (requests in flight end) and wait for the thread."""
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop = self._thread = None
