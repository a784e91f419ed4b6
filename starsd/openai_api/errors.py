"""Errors in the OpenAI API's shape: every refusal, and every bug, answers as OpenAI's own errors do, so an
existing client shows it as it would any API error."""

from __future__ import annotations

from typing import Any


class RequestError(Exception):
    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.headers = headers or {}  # sent with the error (429's Retry-After)

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        if self.status == 429:
            kind = "rate_limit_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def internal_error(exc: BaseException) -> RequestError:
    return RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500, code="internal_error")
