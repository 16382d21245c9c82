"""One-line, secret-free messages for what can go wrong talking to a server (used by
:mod:`chatphase.engine.remote.engine`). Messages name the server by its printable URL (no user info) and never
include request headers, so an API key cannot leak into a notice, a log or a session file."""

from __future__ import annotations

import httpx
from httpx_sse import SSEError


def transport_message(
    exc: httpx.HTTPError, where: str, read_timeout_s: float | None = None, mid_stream: bool = False
) -> str:
    """One line for a transport failure (no headers, no key): refused, timed out, cut off."""
    if isinstance(exc, httpx.ConnectTimeout):
        return f"the server at {where} did not accept a connection in time"
    if isinstance(exc, httpx.ConnectError):
        reason = "connection refused" if "refused" in str(exc).lower() else (str(exc) or "no route to it")
        return f"cannot connect to the server at {where}: {reason}"
    if isinstance(exc, httpx.ReadTimeout):
        return f"the server at {where} sent nothing for {read_timeout_s:g} s (read timeout)"
    if isinstance(exc, httpx.TimeoutException):
        doing = "sending the request" if isinstance(exc, httpx.WriteTimeout) else "waiting for an answer"
        return f"the server at {where} timed out {doing}"
    if isinstance(exc, SSEError):
        return f"the server at {where} did not stream its reply ({exc})"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)) or mid_stream:
        return f"the connection to {where} was cut {'mid-reply' if mid_stream else 'before a reply'}"
    reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "no reason given"
    return f"the request to {where} failed ({reason})"


def http_error_message(response: httpx.Response, where: str) -> str:
    """One line for an HTTP error status, with the server's own error text when it sent one."""
    detail = ""
    try:
        data = response.json()
        if isinstance(data, dict):
            detail = error_text(data.get("error") or data.get("detail") or data.get("message") or "")
    except ValueError:
        detail = response.text.strip().splitlines()[0] if response.text.strip() else ""
    hint = " (check --api-key-env)" if response.status_code in (401, 403) else ""
    text = f"the server at {where} answered HTTP {response.status_code} {response.reason_phrase}{hint}"
    return f"{text}: {detail[:300]}" if detail else text


def error_text(error: object) -> str:
    """The message inside an OpenAI/FastAPI/Ollama style error value (dict, list or string)."""
    if isinstance(error, dict):
        return str(error.get("message") or error.get("msg") or error.get("type") or error)
    if isinstance(error, list):
        return "; ".join(error_text(e) for e in error[:3])
    return str(error)
