"""A request the API refuses: an HTTP status and OpenAI's error fields."""

from __future__ import annotations

from typing import Any

from aiohttp import web


class ApiError(Exception):
    """A request the API refuses: an HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The error as OpenAI shapes it: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        """The error as an HTTP response."""
        return web.json_response(self.body(), status=self.status)
