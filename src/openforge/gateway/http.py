"""HTTP plumbing the gateway's routes share: bodies, JSON answers, the client's credentials.

Bodies are read with a size limit (refused from the declared length before reading, else
while reading) and a time limit: a client that declares a body and sends part of it gets
408 once `gateway.body_timeout_s` has passed, instead of holding a connection open.

Credentials: a session token may come in the URL path (`/s/TOKEN/v1`) and as an API key
(`Authorization: Bearer KEY` or `x-api-key: KEY`). Every credential a request carries must
name the same token: a request whose credentials disagree is refused with a message that
says which ones, before any token is looked up (the answer says nothing about sessions).
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from openforge.gateway.dialects import DIALECTS
from openforge.gateway.dialects.base import dumps_bytes

JSON_HEADERS = [(b"content-type", b"application/json")]


class BodyError(Exception):
    """The body could not be read: too large (413), too slow (408), or the client left."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    @property
    def error_type(self) -> str:
        return "request_too_large" if self.status == 413 else "invalid_request_error"


def header(request: Request, name: bytes) -> str | None:
    """The value of the request's first `name` header (`name` in lower case, as ASGI
    servers pass header names), as `request.headers.get(name)` gives it.

    Without Starlette's `Headers`, whose `get` raises and catches a KeyError for every
    header the request lacks: a model call looks up four headers, two usually absent.
    """
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body (`BodyError` when over `limit` bytes, slower than `timeout_s`, or
    abandoned by the client).

    Read from the ASGI messages themselves, as `request.stream()` reads them, without its
    async generator: for a body that arrived in one message (nearly every call) that
    wrapper cost more than the read. The request's stream counts as unread afterwards:
    nothing reads it again.
    """
    declared = header(request, b"content-length") or ""
    if declared.isdigit() and int(declared) > limit:
        raise BodyError(413, too_large(limit))
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.request":
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise BodyError(413, too_large(limit))
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
                elif message["type"] == "http.disconnect":
                    raise ClientDisconnect
    except TimeoutError:
        raise BodyError(408, f"the request body did not arrive within {timeout_s:g} s "
                             "(gateway.body_timeout_s); send the whole body at once") from None
    except ClientDisconnect:
        raise BodyError(400, "the client disconnected before sending the whole body") from None
    return b"".join(chunks)


def too_large(limit: int) -> str:
    return f"request body exceeds the gateway's limit of {limit} bytes (gateway.max_body_bytes)"


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps_bytes(payload), status, headers=headers, media_type="application/json")


def plain_error(status: int, message: str, error_type: str = "invalid_request_error",
                headers: dict[str, str] | None = None) -> Response:
    """An OpenAI-shaped error for routes that have no dialect (admin, models)."""
    return json_response(status, {"error": {"message": message, "type": error_type}}, headers)


def dialect_error(dialect_name: str, status: int, message: str, error_type: str = "",
                  headers: dict[str, str] | None = None) -> Response:
    return json_response(status, DIALECTS[dialect_name].error(status, message, error_type),
                         headers)


class CredentialError(Exception):
    """The request's credentials contradict each other (a 401 that says how)."""


def api_key(request: Request) -> str | None:
    """The key a client sent as `Authorization: Bearer KEY` and/or `x-api-key: KEY`.

    `CredentialError` when both headers carry keys and they differ.
    """
    auth = header(request, b"authorization")
    bearer = None
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        bearer = value.strip() if scheme.lower() == "bearer" and value.strip() else (
            auth.strip() or None)
    key = header(request, b"x-api-key")
    key = key.strip() if key and key.strip() else None
    if bearer is not None and key is not None and not _same(bearer, key):
        raise CredentialError("the Authorization and x-api-key headers carry different keys; "
                              "send the session token in one of them (or the same in both)")
    return bearer if bearer is not None else key


def session_token(request: Request) -> str | None:
    """The session token the request presents (path and/or API key), or None.

    `CredentialError` when the path token and the API key disagree.
    """
    path_token = request.path_params.get("token")
    key = api_key(request)
    if path_token is not None and key is not None and not _same(path_token, key):
        raise CredentialError("the API key is not the session token of the URL path "
                              "(/s/TOKEN/v1); send that token as the API key, or no API key")
    return path_token if path_token is not None else key


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
