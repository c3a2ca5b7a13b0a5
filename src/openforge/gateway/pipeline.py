"""One model call, from its body to its recorded row (`CallResponse`).

decode + parse + render (under the session's lock; in a render thread unless the body is
small, see `INLINE_BODY_BYTES`) -> `engine.generate`
(cancelled when the client disconnects) -> parse the completion -> JSON or SSE (keep-alive
comments while the engine is busy) -> only after the last byte was handed to the server:
`SessionTokens.commit` and recording (`CallRecorder`: one transaction per loop turn).

What each outcome leaves behind:

- A request the gateway cannot serve (malformed, beyond the context window, ids outside
  the vocabulary, an image it may not read) is refused with a 4xx that names the problem
  and is not recorded: nothing was generated.
- An engine failure answers 429 (busy, with Retry-After), 502 or 503 in the dialect's
  error format, or the engine's own 4xx for a request it rejects, and is recorded as a
  failed call: a harness's retry is recorded once, as its own call.
- A client that disconnects aborts the generation; nothing is recorded.
- A recorded call always gets the session's next index; if its full row cannot be written
  (it should always be), a failed row with the reason takes that index instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from typing import Any

from starlette.types import Receive, Scope, Send

from openforge.gateway.branches import RenderedPrompt
from openforge.gateway.conversation import ChatRequest, Completion, ImageRef, Message
from openforge.gateway.dialects import DIALECTS, KEEPALIVE_FRAME, DialectError
from openforge.gateway.dialects.base import dumps_bytes, load_json
from openforge.gateway.dialects.memo import HistoryMemo
from openforge.gateway.engines.base import (
    EngineBusy,
    EngineError,
    GenerateRequest,
    GenerateResult,
)
from openforge.gateway.http import JSON_HEADERS
from openforge.gateway.images import (
    ImageError,
    image_blobs,
    resolve_images,
    without_inline_images,
)
from openforge.gateway.memory import release_memory
from openforge.gateway.model import ModelBundle
from openforge.gateway.render import ContextLengthError, PromptError
from openforge.gateway.sessions import LiveSession
from openforge.gateway.state import GatewayState
from openforge.store import NewCall, ids_to_blob
from openforge.types import Call, SamplingParams

log = logging.getLogger("openforge.gateway")

_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no")]
INLINE_BODY_BYTES = 32 * 1024
"""Bodies up to this size are decoded, parsed and rendered on the event loop: at most ~8k
tokens of new text, a few milliseconds at worst and ~0.2 ms for a typical turn, where
handing them to a thread would cost about as much as the work. Larger ones go to a
render thread, so no request's size stalls the other sessions for longer than that."""
MEMO_MAX_BODY_BYTES = 4 << 20
"""Bodies larger than this bypass the session's history memo (see `_prepare`)."""
# Completions longer than this are parsed in a render thread, not on the event loop.
_PARSE_INLINE_IDS = 2048
# After a request body this large, freed memory is handed back to the operating system.
_RELEASE_AFTER_BYTES = 1 << 20


def json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    # With a length the server sends the body as is, not in chunked framing.
    return [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]


def merge_sampling(defaults: SamplingParams, requested: SamplingParams) -> SamplingParams:
    """The session's sampling defaults, overridden by what the request set explicitly.

    The session's `max_tokens` is a ceiling, not only a default: harnesses ask for what
    suits a frontier model (Claude Code: 32000 per call), and the run's token budget must
    still hold. A request may ask for fewer.
    """
    explicit = requested.model_fields_set
    if not explicit:
        return defaults
    update = {k: getattr(requested, k) for k in explicit}
    if "max_tokens" in update:
        update["max_tokens"] = min(update["max_tokens"], defaults.max_tokens)
    return defaults.model_copy(update=update)


class _Disconnected(Exception):
    """The client went away before the response was complete."""


class _Refused(Exception):
    """A request refused before generation: answered with `body`, not recorded."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body


class CallResponse:
    """The ASGI response of one model call: prepare, generate, deliver, then record.

    For a streamed call the status line is held back until the first keep-alive is due,
    so an engine that fails quickly still gets a proper 502/503; later failures end the
    stream with the dialect's error frame.
    """

    def __init__(self, state: GatewayState, live: LiveSession, dialect_name: str, body: bytes,
                 *, retry_count: int) -> None:
        self.state = state
        self.live = live
        self.dialect_name = dialect_name
        self.dialect = DIALECTS[dialect_name]
        self.body = body  # stored as the call's request (verbatim JSON)
        self.body_digest = ""  # sha256 of the body, computed in `_prepare` once it rendered
        self.retry_count = retry_count
        self.call_id = os.urandom(16).hex()  # a uuid4's worth of randomness, cheaper
        self.started_at = time.time()
        self.headers_sent = False
        self.delivered = False  # the whole response was handed to the server
        self.payload: Any = None  # the decoded body
        self.chat: ChatRequest | None = None
        self.images: list[ImageRef] = []  # resolved, in prompt order
        self.recorded: asyncio.Future[None] | None = None  # done once its row is committed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await self._run(send, watcher)
        except (_Disconnected, OSError):
            if self.recorded is None:
                self.state.stats.disconnected += 1
            log.debug("call %s: client disconnected; nothing recorded", self.call_id)
        finally:
            watcher.cancel()
            if len(self.body) >= _RELEASE_AFTER_BYTES:
                self.body = b""
                self.payload = self.chat = None
                await self.state.off_loop(release_memory)
        if self.recorded is not None:
            # Its row is committed before the handler ends (see gateway/recorder.py); the
            # flush is shared by the calls of one loop turn: cancelling this handler must
            # not cancel it.
            await asyncio.shield(self.recorded)

    # -- prepare: decode, parse, render (off the event loop) --------------------------------

    def _prepare(self) -> tuple[ChatRequest, RenderedPrompt]:
        """Runs in a render thread (or, for a small body, on the loop), under the session's
        lock. `_Refused` for a request the model cannot take."""
        state, live, dialect = self.state, self.live, self.dialect
        memo: HistoryMemo | None = live.memo
        if len(self.body) > MEMO_MAX_BODY_BYTES:
            # Fingerprinting megabytes holds the GIL as long as parsing them does, and
            # reuse would save little: such a request is parsed from scratch.
            live.memo.clear()
            memo = None
        try:
            self.payload = load_json(self.body)
            chat = dialect.parse(self.payload, memo=memo)
            if state.bundle.multimodal:
                self.images = resolve_images(chat, state.image_policy)
            rendered = live.tokens.render(chat, len(self.body))
        except (DialectError, ImageError, PromptError) as exc:
            status, refusal = self._refusal(exc)
        else:
            # Only a call that will be recorded needs its digest: a refused 10 MB body is
            # not hashed.
            self.body_digest = hashlib.sha256(self.body).hexdigest()
            return chat, rendered
        # Raised outside the handler: the refused exception and its frames form no cycle
        # that would keep the request's text alive until the next garbage collection.
        raise _Refused(status, refusal)

    def _refusal(self, exc: Exception) -> tuple[int, dict[str, Any]]:
        dialect = self.dialect
        if isinstance(exc, DialectError):
            return exc.status, dialect.error(exc.status, exc.message, exc.error_type)
        if isinstance(exc, ImageError):
            return exc.status, dialect.error(exc.status, exc.message, "invalid_request_error")
        self.live.memo.clear()  # do not keep a history the model cannot take
        if isinstance(exc, ContextLengthError):
            return 400, dialect.context_error(str(exc), exc.prompt_tokens, exc.limit)
        # The conversation cannot become a prompt for this model (an image for a text-only
        # model, a shape the template cannot express): the client's request.
        return 400, dialect.error(400, str(exc), "invalid_request_error")

    def _sampling(self, chat: ChatRequest, rendered: RenderedPrompt) -> SamplingParams:
        sampling = merge_sampling(self.live.session.sampling, chat.sampling)
        limit = self.state.bundle.context_length
        if limit:
            # Ask for no more than the context has room for (the prompt fits: render checked).
            room = limit - len(rendered.prompt)
            if sampling.max_tokens > room:
                sampling = sampling.model_copy(update={"max_tokens": room})
        return sampling

    # -- the call ----------------------------------------------------------------------

    async def _run(self, send: Send, watcher: asyncio.Future[None]) -> None:
        state, live = self.state, self.live
        try:
            async with live.lock:
                if len(self.body) <= INLINE_BODY_BYTES:
                    chat, rendered = self._prepare()
                else:
                    chat, rendered = await state.off_loop(self._prepare)
        except _Refused as refused:
            state.stats.refused[refused.status] += 1
            await self._send_json(send, refused.status, refused.body)
            return
        self.chat = chat
        sampling = self._sampling(chat, rendered)
        # model_construct: every field is set here from typed values; validating the
        # prompt's thousands of ids again would cost more than the rest of the request.
        request = GenerateRequest.model_construct(
            prompt_ids=rendered.prompt, prompt_json=rendered.prompt_json(), sampling=sampling,
            stop_token_ids=state.stop_token_ids, session_id=live.session.id,
            request_id=self.call_id, chat=chat)
        generation = asyncio.ensure_future(state.engine.generate(request))
        try:
            result = await self._await_generation(send, generation, watcher)
            _check_result(state.bundle, result)
        except EngineBusy as exc:
            await self._fail(send, rendered, sampling, 429, str(exc),
                             retry_after_s=exc.retry_after_s)
            return
        except EngineError as exc:
            status = exc.status_code
            if not (400 <= status < 600) or status in (401, 403, 404, 429) or status >= 500:
                # Auth or routing trouble between gateway and engine is the gateway's
                # problem, not the client's: report it as an upstream failure.
                status = status if status in (502, 503, 504) else 502
            await self._fail(send, rendered, sampling, status, f"engine error: {exc}")
            return
        except (_Disconnected, OSError):
            raise
        except Exception as exc:  # an engine plugin's bug is still an upstream failure
            log.exception("call %s: engine raised", self.call_id)
            await self._fail(send, rendered, sampling, 502,
                             f"engine failed: {type(exc).__name__}: {exc}")
            return
        finally:
            if not generation.done():
                generation.cancel()
        try:
            await self._deliver(send, watcher, chat, rendered, sampling, result)
        except (_Disconnected, OSError):
            raise
        except Exception as exc:  # a gateway bug: still record what the engine produced
            log.exception("call %s: delivering the response failed", self.call_id)
            if self.delivered:
                return  # answered; `_record` writes a failed row itself if it must
            await self._fail(send, rendered, sampling, 500,
                             f"the gateway failed to answer ({type(exc).__name__}); see its "
                             "log", completion_ids=result.completion_ids,
                             logprobs=result.logprobs)

    async def _await_generation(self, send: Send, generation: asyncio.Future[GenerateResult],
                                watcher: asyncio.Future[None]) -> GenerateResult:
        assert self.chat is not None
        if not self.chat.stream:
            # Nothing to send while waiting: a disconnect cancels the generation directly.
            def on_disconnect(_: asyncio.Future[None]) -> None:
                generation.cancel()

            watcher.add_done_callback(on_disconnect)
            try:
                return await generation
            except asyncio.CancelledError:
                if watcher.done() and not watcher.cancelled():
                    raise _Disconnected from None
                raise
            finally:
                watcher.remove_done_callback(on_disconnect)
        keepalive_s = self.state.config.keepalive_s
        waiters: set[asyncio.Future[Any]] = {generation, watcher}
        while True:
            done, _ = await asyncio.wait(waiters, timeout=keepalive_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                raise _Disconnected
            if generation in done:
                return generation.result()
            # Still generating on a stream: show the client (and idle proxies) we are alive.
            await self._start_stream(send)
            await send({"type": "http.response.body", "body": KEEPALIVE_FRAME, "more_body": True})

    async def _start_stream(self, send: Send) -> None:
        if not self.headers_sent:
            self.headers_sent = True
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})

    async def _send_json(self, send: Send, status: int, payload: dict[str, Any],
                         headers: list[tuple[bytes, bytes]] | None = None) -> None:
        body = dumps_bytes(payload)
        self.headers_sent = True
        await send({"type": "http.response.start", "status": status,
                    "headers": json_headers(body) + (headers or [])})
        await send({"type": "http.response.body", "body": body})

    async def _deliver(self, send: Send, watcher: asyncio.Future[None], chat: ChatRequest,
                       rendered: RenderedPrompt, sampling: SamplingParams,
                       result: GenerateResult) -> None:
        state, live = self.state, self.live
        exact = state.engine.exact_tokens and result.completion is None
        if result.completion is not None:
            assistant = result.completion.message
            finish = result.completion.finish_reason
            completion_ids = list(result.completion_ids) or _tokenize_text(state.bundle, assistant)
            logprobs = list(result.logprobs) if result.completion_ids else [0.0] * len(completion_ids)
        else:
            completion_ids, logprobs = result.completion_ids, result.logprobs
            if len(completion_ids) > _PARSE_INLINE_IDS:
                assistant, finish = await state.off_loop(
                    live.tokens.parse, chat, rendered.prompt, completion_ids)
            else:
                assistant, finish = live.tokens.parse(chat, rendered.prompt, completion_ids)
            if result.finish_reason == "length":
                finish = "length"
        completion = Completion.model_construct(
            message=assistant, finish_reason=finish, prompt_tokens=len(rendered.prompt),
            completion_tokens=len(completion_ids), reasoning_tokens=0, cached_tokens=0)
        model = chat.model or state.config.served_model_name
        created = int(self.started_at)
        response_id = self.dialect.id_prefix + self.call_id
        response_body = self.dialect.response(completion, response_id=response_id, model=model,
                                              created=created, request=chat)
        body: bytes | None = None  # the response as sent, when sent as one JSON body
        if chat.stream:
            await self._start_stream(send)
            # The completion is whole already: its frames go out in one write (the same
            # bytes; SSE clients split events on blank lines, not on network reads).
            frames = b"".join(self.dialect.stream(completion, response_id=response_id,
                                                  model=model, created=created, request=chat))
            # The frames end the response in the same message: one write to the socket
            # for the events and the end of the chunked body, not two.
            self._check_connected(watcher)
            await send({"type": "http.response.body", "body": frames})
            self.delivered = True
        else:
            body = dumps_bytes(response_body)
            self._check_connected(watcher)
            self.headers_sent = True
            await send({"type": "http.response.start", "status": 200,
                        "headers": json_headers(body)})
            await send({"type": "http.response.body", "body": body})
            self.delivered = True
        # Delivered: only now does the call become training data. Commit first: it may move
        # the call to a new branch when a concurrent call of the session extended it first.
        async with live.lock:
            branch = live.tokens.commit(chat, rendered, completion_ids,
                                        self.dialect.history_message(completion), self.call_id)
        reason = branch.reason if branch.index != rendered.branch else rendered.branch_reason
        base, added = rendered.stored_as(branch.prompt)
        self._record(rendered, sampling, status="ok", branch=branch.index, branch_reason=reason,
                     completion_ids=completion_ids, prompt_blob=ids_to_blob(added), prompt_base=base,
                     logprobs=logprobs, finish_reason=completion.finish_reason,
                     response=response_body, response_json=body,
                     weight_version=result.weight_version, exact_tokens=exact)

    async def _fail(self, send: Send, rendered: RenderedPrompt, sampling: SamplingParams,
                    status: int, message: str, retry_after_s: int | None = None,
                    completion_ids: list[int] | None = None,
                    logprobs: list[float] | None = None) -> None:
        error_type = {503: "overloaded_error", 429: "rate_limit_error"}.get(
            status, "api_error" if status >= 500 else "invalid_request_error")
        try:
            if self.headers_sent:
                frame = self.dialect.error_stream_frame(status, message, error_type)
                await send({"type": "http.response.body", "body": frame, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            else:
                headers = (None if retry_after_s is None
                           else [(b"retry-after", str(retry_after_s).encode())])
                await self._send_json(send, status,
                                      self.dialect.error(status, message, error_type), headers)
        finally:
            # Recorded whether or not the client still listens: the engine was asked.
            self._record(rendered, sampling, status="failed", error=message,
                         branch=rendered.branch, branch_reason=rendered.branch_reason,
                         completion_ids=completion_ids, logprobs=logprobs, http_status=status)

    @staticmethod
    def _check_connected(watcher: asyncio.Future[None]) -> None:
        if watcher.done():
            raise _Disconnected

    def _record(self, rendered: RenderedPrompt, sampling: SamplingParams, *,
                status: str, branch: int, branch_reason: str | None,
                completion_ids: list[int] | None = None,
                logprobs: list[float] | None = None, finish_reason: str | None = None,
                response: dict[str, Any] | None = None, response_json: bytes | None = None,
                prompt_blob: bytes | None = None, prompt_base: str | None = None,
                weight_version: str | None = None, exact_tokens: bool = True,
                error: str | None = None, http_status: int = 200) -> None:
        live = self.live
        request: Any = self.payload
        request_json: bytes | None = self.body
        if self.images:  # the image bytes are kept once, in the store's images table
            request, request_json = without_inline_images(self.payload, self.images), None
        index = live.take_index()
        stats = self.state.stats
        if status == "ok":
            stats.ok += 1
        else:
            stats.failed += 1
        stats.prompt_tokens += len(rendered.prompt)
        stats.completion_tokens += len(completion_ids or ())
        # model_construct: every field is built here from typed values; validating
        # thousands of token ids again per call would be the gateway's largest CPU cost.
        # The prompt stays the int32 array the session keeps: the store reads it as one.
        call = Call.model_construct(
            id=self.call_id, session_id=live.session.id, branch=branch,
            branch_reason=branch_reason, index=index,
            dialect=self.dialect_name, request=request, response=response,
            prompt_ids=rendered.prompt, completion_ids=completion_ids or [],
            logprobs=logprobs or [], finish_reason=finish_reason,
            sampling=sampling.model_dump(),
            weight_version=weight_version or self.state.engine.weight_version
            or live.session.weight_version,
            exact_tokens=exact_tokens, status=status, error=error,
            body_digest=self.body_digest, retry_count=self.retry_count,
            images=[image.sha256 for image in self.images],
            started_at=self.started_at, finished_at=time.time(), http_status=http_status)

        def record_failure(exc: Exception) -> None:
            # Keep the index and the fact of the call: a failed row saying why.
            if status == "ok":
                stats.ok -= 1
                stats.failed += 1
            log.error("call %s: recording failed; recording it as failed", self.call_id,
                      exc_info=exc)
            bare = call.model_copy(update={
                "request": {}, "response": None, "prompt_ids": [], "completion_ids": [],
                "logprobs": [], "finish_reason": None, "status": "failed", "images": [],
                "error": f"recording failed: {type(exc).__name__}: {exc}; "
                         f"the call itself: {error or status}",
                "finished_at": time.time()})
            self.state.store.add_call(bare)

        self.recorded = self.state.recorder.record(
            NewCall(call, request_json, response_json, prompt_blob, image_blobs(self.images),
                    prompt_base),
            record_failure)


def _check_result(bundle: ModelBundle, result: GenerateResult) -> None:
    """An engine's ids must be the model's tokens, one logprob each (else EngineError)."""
    ids = result.completion_ids
    limit = bundle.vocab_size
    if result.completion is None and len(result.logprobs) != len(ids):
        raise EngineError(f"the engine returned {len(ids)} token ids but "
                          f"{len(result.logprobs)} logprobs", 502)
    bad = next((t for t in ids if not 0 <= t < limit), None) if limit else None
    if bad is not None:
        raise EngineError(f"the engine returned token id {bad}, outside the model's "
                          f"vocabulary of {limit}", 502)


async def _wait_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the request body has been read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _tokenize_text(bundle: ModelBundle, message: Message) -> list[int]:
    """Ids for a text-only engine's answer: a retokenization, flagged exact_tokens=False."""
    return bundle.encode(message.content) if message.content else []
