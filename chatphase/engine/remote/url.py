"""The address of a remote OpenAI-compatible server, checked before any network use."""

from __future__ import annotations

import httpx

from chatphase.errors import UsageError


class ServerURL:
    """A server address split into the API base (``…/v1``), the server root and a printable form.

    Accepts ``host:port``, ``http://host:port`` or ``http://host:port/v1`` (a missing scheme means http).
    Credentials in the URL (``user:password@``) are refused: the URL is kept in settings and sessions.

    Raises:
        UsageError: for a scheme other than http/https, a URL without a host, or one with credentials.
    """

    def __init__(self, text: str):
        raw = text.strip()
        if "://" not in raw:
            raw = f"http://{raw}"
        try:
            url = httpx.URL(raw)
        except (httpx.InvalidURL, ValueError) as exc:
            raise UsageError(f"--server: not a URL: {text!r} ({exc})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise UsageError(f"--server must be an http(s) URL with a host, e.g. http://127.0.0.1:8080 (got {text!r})")
        if url.userinfo:  # settings and sessions keep the URL: a secret must not ride in it
            raise UsageError(
                "--server: credentials in the URL are not accepted; put the API key in an "
                "environment variable and name it with --api-key-env"
            )
        path = url.path.rstrip("/")
        root_path = path[: -len("/v1")] if path.endswith("/v1") else path
        self.api = url.copy_with(path=f"{root_path}/v1", query=None, fragment=None)
        self.root = url.copy_with(path=root_path or "/", query=None, fragment=None)
        self.display = str(self.root).rstrip("/")

    def __repr__(self) -> str:
        return f"ServerURL({self.display!r})"
