"""The model calls of the built-in agent programs (mini, the GUI agent): OpenAI chat
completions over HTTP with the standard library.

The official SDK took 1.2 s of CPU per rollout to import (its typed models): more than the
rest of a demo rollout's agent together, and every rollout starts a new one. These programs
use one route, so they speak it directly, the way the SDK does on the wire: the same JSON
body, `Authorization: Bearer <key>`, and two retries of a connection that failed or of a
408, 409, 429 or 5xx answer (after the answer's `Retry-After` when it gives one of at most
60 s, else 0.5 s, then 1 s), each retry numbered in `x-stainless-retry-count`, which the
gateway records (`retry_count`).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any

RETRIED_STATUSES = frozenset({408, 409, 429})
_FIRST_BACKOFF_S = 0.5
_MAX_RETRY_AFTER_S = 60.0


class EndpointDown(Exception):
    """The endpoint could not answer: no connection, or 408/409/429/5xx, after the retries."""


class EndpointError(Exception):
    """The endpoint refused the request (another 4xx); the message is its status and body."""


class ChatEndpoint:
    """`POST {base_url}/chat/completions` with a bearer key."""

    def __init__(self, base_url: str, api_key: str, retries: int = 2,
                 timeout_s: float = 600.0) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.retries = retries
        self.timeout_s = timeout_s

    def create(self, **body: Any) -> dict[str, Any]:
        """One chat completion: the response object, parsed."""
        data = json.dumps(body).encode()
        attempt = 0
        while True:
            headers = {"Content-Type": "application/json", "Accept": "application/json",
                       "Authorization": f"Bearer {self.api_key}"}
            if attempt:
                headers["x-stainless-retry-count"] = str(attempt)
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    answer = json.loads(response.read())
            except urllib.error.HTTPError as exc:
                text = exc.read().decode(errors="replace")
                message = f"Error code: {exc.code} - {text}"
                if exc.code not in RETRIED_STATUSES and exc.code < 500:
                    raise EndpointError(message) from None
                wait = _retry_after(exc.headers.get("retry-after"))
                failure: Exception = EndpointDown(message)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                # refused, reset, timed out, cut short, not JSON
                wait, failure = None, EndpointDown(f"Connection error: {exc}")
            else:
                if not isinstance(answer, dict):
                    raise EndpointError(f"not a chat completion: {str(answer)[:200]}")
                return answer
            if attempt == self.retries:
                raise failure
            time.sleep(wait if wait is not None else _FIRST_BACKOFF_S * 2 ** attempt)
            attempt += 1


def reply_message(response: dict[str, Any]) -> dict[str, Any]:
    """The first choice's message of a chat completion, its `content` a string ("" when
    absent); an `EndpointError` when `response` is not one."""
    try:
        message = response["choices"][0]["message"]
        content = message.get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise EndpointError(f"not a chat completion: {json.dumps(response)[:200]}") from None
    return {**message, "content": content if isinstance(content, str) else str(content)}


def _retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header, when it gives a usable number of them."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds <= _MAX_RETRY_AFTER_S else None


def function_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The message's tool calls of type function, each with a `function` holding a string
    `name` and `arguments` (other tool-call kinds are not the agent's to run)."""
    calls = message.get("tool_calls") or []
    found = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            found.append({"id": str(call.get("id") or ""), "type": "function",
                          "function": {"name": function["name"],
                                       "arguments": str(function.get("arguments") or "")}})
    return found
