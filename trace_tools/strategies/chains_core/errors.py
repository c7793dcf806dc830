"""What the uni-agent gateway answers with an HTTP error, and a chains setup the codec cannot work with."""

from __future__ import annotations

from trace_tools.errors import ReplayError, TraceToolsError


class ChainsSetupError(TraceToolsError):
    """Invalid chains options or a chat template the chains codec cannot work with."""


class GatewayError(ReplayError):
    """What the live gateway would have answered with an HTTP error; the session is left unchanged.

    `reason`: how the failure is counted, where the message alone does not say it well."""

    status = 500

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason


class RequestRejected(GatewayError):
    """The OpenAI adapter refuses the request (HTTP 400 upstream)."""

    status = 400


class ServerError(GatewayError):
    """An exception inside prepare/commit (HTTP 500 upstream): codec, rollback or alignment failure."""
