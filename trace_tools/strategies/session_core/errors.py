"""The HTTP answers of miles' session server that replay reproduces as exceptions (nothing is stored)."""

from __future__ import annotations


class SessionHTTPError(Exception):
    """A request the live session server answers with a non-200 status (nothing is stored).

    `reason`: how the failure is counted, where the message alone does not say it well."""

    status = 0

    def __init__(self, message: str = "", reason: str | None = None):
        super().__init__(message)
        self.reason = reason


class RequestRejected(SessionHTTPError):
    """HTTP 400: the request is refused before the engine is called. Counted as `rejected_requests`."""

    status = 400


class TruncatedExtension(RequestRejected):
    """HTTP 409 (v2): the request extends a generation that stopped on `length`."""

    status = 409


class ServerError(SessionHTTPError):
    """HTTP 500 (or an uncaught ValueError upstream). Counted as `server_errors`."""

    status = 500


class AssemblyError(Exception):
    """HTTP 422 from `POST /sessions/{id}/samples`: the whole samples op fails."""

    status = 422
