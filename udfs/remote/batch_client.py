"""The wire of an OpenAI-style Batch API: upload a file (``POST /files``, purpose ``batch``), create a batch
(``POST /batches``), read one (``GET /batches/{id}``), list them (``GET /batches``), cancel one, read a file's content.

httpx2, as the per-row client (:mod:`lakescore.udfs.remote.client`), and for its reasons: the one key scrubber, the
same retry rule (its statuses, backoff and ``Retry-After``), and no ``openai`` package at run time (the official
client would bring its own retry loop and a dependency for six plain calls). The key is read where the client is made
(the driver polls, the executors upload and download) and sent only in the ``Authorization`` header.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

from lakescore.udfs.remote.answers import RETRY_STATUSES
from lakescore.udfs.remote.client import backoff, retry_after, scrub, server_message

__all__ = ["BatchApiError", "BatchClient"]


class BatchApiError(RuntimeError):
    """A Batch API call failed for good: ``status`` (``None``: no answer) and the provider's message, scrubbed."""

    def __init__(self, status: int | None, message: str, call: str) -> None:
        self.status, self.message, self.call = status, message, call
        super().__init__(f"{call}: HTTP {status}: {message}" if status is not None else f"{call}: {message}")


class BatchClient:
    """Calls to one provider's Files and Batches API at ``url`` (the base URL, e.g. ``https://api.openai.com/v1``)
    with ``api_key`` (as a bearer token, or in the headers ``auth`` makes of it), each retried ``max_retries`` times on
    a retryable status or a lost connection. :meth:`post_json`, :meth:`get_json` and :meth:`text` are the plain calls
    another provider's batches take (:mod:`~lakescore.udfs.remote.batch_kinds`)."""

    def __init__(
        self,
        url: str,
        api_key: str | None,
        *,
        timeout_s: float = 120.0,
        max_retries: int = 6,
        sleep: Callable[[float], None] = time.sleep,
        auth: Callable[[str | None], dict[str, str]] | None = None,
    ) -> None:
        import httpx2

        self.url, self._key, self.max_retries, self.sleep = url.rstrip("/"), api_key, max_retries, sleep
        # the key as a bearer token (OpenAI's), or in the headers ``auth`` makes of it (Anthropic's x-api-key)
        headers = auth(api_key) if auth is not None else {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx2.Client(headers=headers, timeout=httpx2.Timeout(timeout_s, connect=min(10.0, timeout_s)))
        self._transport_errors = (httpx2.TransportError,)

    def close(self) -> None:
        self.http.close()

    def scrub(self, text: str) -> str:
        return scrub(text, (self._key,) if self._key else ())

    def _call(self, method: str, path: str, call: str, **kwargs: Any) -> Any:
        """One call, retried as the module says; the response (2xx), else :class:`BatchApiError`."""
        url = path if path.startswith(("http://", "https://")) else self.url + path
        for attempt in range(self.max_retries + 1):
            try:
                response = self.http.request(method, url, **kwargs)
            except self._transport_errors as exc:
                if attempt == self.max_retries:
                    raise BatchApiError(None, self.scrub(f"{type(exc).__name__}: {exc}"), call) from None
                self.sleep(backoff(attempt))
                continue
            if 200 <= response.status_code < 300:
                return response
            if response.status_code in RETRY_STATUSES and attempt < self.max_retries:
                wait = retry_after(response.headers)
                self.sleep(backoff(attempt) if wait is None else wait)
                continue
            raise BatchApiError(response.status_code, self.scrub(server_message(response)), call)
        raise AssertionError("unreachable")

    def upload(self, name: str, content: bytes | BinaryIO) -> str:
        """Upload ``content`` (bytes, or a binary file object at its start) as the batch input file ``name``; its id."""
        response = self._call(
            "POST",
            "/files",
            "upload a batch file",
            files={"file": (name, content, "application/jsonl")},
            data={"purpose": "batch"},
        )
        return str(response.json()["id"])

    def create(self, input_file_id: str, endpoint: str, completion_window: str, metadata: Mapping[str, str]) -> dict:
        """Create the batch of the uploaded file ``input_file_id`` against ``endpoint`` (``/v1/chat/completions``)."""
        body = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": completion_window,
            "metadata": dict(metadata),
        }
        return self._call(
            "POST", "/batches", "create a batch", content=json.dumps(body), headers={"Content-Type": "application/json"}
        ).json()

    def get(self, batch_id: str) -> dict:
        """The batch ``batch_id`` as the provider holds it now (its ``status``, ``request_counts``, file ids)."""
        return self._call("GET", f"/batches/{batch_id}", f"read batch {batch_id}").json()

    def batches(self, page: int = 100) -> Iterator[dict]:
        """Every batch the provider lists for this key, newest first (``GET /batches``, page by page)."""
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page, **({"after": after} if after else {})}
            listing = self._call("GET", "/batches", "list batches", params=params).json()
            data = listing.get("data") or []
            yield from data
            if not listing.get("has_more") or not data:
                return
            after = data[-1]["id"]

    def cancel(self, batch_id: str) -> dict:
        """Ask the provider to cancel ``batch_id`` (its lines done so far stay in its output file)."""
        return self._call("POST", f"/batches/{batch_id}/cancel", f"cancel batch {batch_id}").json()

    def post_json(self, path: str, body: bytes, call: str) -> dict:
        """``POST`` the JSON text ``body`` to ``path`` under the base URL; the JSON answer."""
        return self._call("POST", path, call, content=body, headers={"Content-Type": "application/json"}).json()

    def get_json(self, path: str, call: str) -> dict:
        """``GET`` ``path`` under the base URL; the JSON answer."""
        return self._call("GET", path, call).json()

    def lines(self, url: str, call: str) -> Iterator[str]:
        """The lines of the text at ``url`` (a path under the base URL, or a whole URL the provider gave), read as they
        arrive: a result file of 50,000 long answers is never held whole. The call is retried as :meth:`_call`'s
        until its answer begins; a connection lost mid-file is :class:`BatchApiError` (the caller's task is retried)."""
        url = url if url.startswith(("http://", "https://")) else self.url + url
        started = False
        for attempt in range(self.max_retries + 1):
            try:
                with self.http.stream("GET", url) as response:
                    if 200 <= response.status_code < 300:
                        for line in response.iter_lines():
                            started = True
                            yield line
                        return
                    response.read()
                    if response.status_code in RETRY_STATUSES and attempt < self.max_retries:
                        wait = retry_after(response.headers)
                        self.sleep(backoff(attempt) if wait is None else wait)
                        continue
                    raise BatchApiError(response.status_code, self.scrub(server_message(response)), call)
            except self._transport_errors as exc:
                if started or attempt == self.max_retries:  # lines already read are not read twice
                    raise BatchApiError(None, self.scrub(f"{type(exc).__name__}: {exc}"), call) from None
                self.sleep(backoff(attempt))
        raise AssertionError("unreachable")

    def text(self, url: str, call: str) -> str:
        """The text at ``url`` (a path under the base URL, or a whole URL the provider gave, such as a results URL)."""
        return self._call("GET", url, call).text

    def content(self, file_id: str) -> str:
        """The text of the provider's file ``file_id`` (a batch's output or error file)."""
        return self._call("GET", f"/files/{file_id}/content", f"download file {file_id}").text

    def content_lines(self, file_id: str) -> Iterator[str]:
        """The lines of the provider's file ``file_id`` (a batch's output or error file), streamed (:meth:`lines`)."""
        return self.lines(f"/files/{file_id}/content", f"download file {file_id}")
