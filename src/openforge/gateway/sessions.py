"""The gateway's live sessions: token lookup, per-session token caches, call numbering.

Sessions are found by the SHA-256 of their token (`store.secret_hash`): the store keeps
only hashes, and this cache is keyed the same way.

The store is the source of truth; this registry only caches what the hot path needs per
call (the `Session`, its `SessionTokens` and the next call index) so that a call costs
no store read. A session the cache does not know (a gateway restarted on an existing
store, or one opened by another process) is loaded from the store on first use.

Restart recovery: when a loaded session already has recorded calls, its branch state is
rebuilt from the store: each stored request is re-parsed by its dialect and rendered again
in recording order (failed calls included, so branches open in the same order as the
first time), and each successful call is committed with its stored prompt and completion
ids. A harness that keeps talking after a gateway restart therefore continues on its
branch with exactly the ids the engine saw. A stored call that cannot be replayed is
skipped with a warning; at worst the next request opens a new branch, never a wrong one.

Sessions stay cached until they are closed (the admin API's close, the scoring API's seal,
or `Gateway.close_session`; with several workers the closing one tells the serving one to
`forget` it); a session closed directly in the store by another process is only noticed
on a cache miss.

Workers: with `gateway.workers = N` each of N processes serves the sessions whose id hashes
to its index (`worker_of`), so a session's calls, branch state and call indices live in one
process; a request for another worker's session is refused (421), never served twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

from openforge.gateway.branches import RenderPolicy, SessionTokens, ids_array
from openforge.gateway.dialects.memo import HistoryMemo
from openforge.gateway.model import ModelBundle
from openforge.gateway.render import PromptError
from openforge.store import Store, secret_hash
from openforge.types import Call, SamplingParams, Session

log = logging.getLogger("openforge.gateway")


@dataclass
class LiveSession:
    """One open session as the gateway holds it between calls."""

    session: Session
    tokens: SessionTokens
    next_index: int = 0
    # The last request's parsed history: the next request reuses its unchanged prefix.
    memo: HistoryMemo = field(default_factory=HistoryMemo)
    # Held while a call parses and renders (in a worker thread) and while it commits: the
    # memo and the token cache see one call of the session at a time.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def take_index(self) -> int:
        """The index of the next recorded call (indices follow recording order)."""
        index = self.next_index
        self.next_index += 1
        return index


def worker_of(session_id: str, workers: int) -> int:
    """The index of the gateway worker that serves `session_id` (of `workers`)."""
    if workers <= 1:
        return 0
    digest = hashlib.sha256(session_id.encode()).digest()
    return int.from_bytes(digest[:8], "little") % workers


def serving_url(urls: list[str], session_id: str) -> str:
    """Of the gateway workers' base URLs (by worker index), the one serving `session_id`."""
    return urls[worker_of(session_id, len(urls))]


def session_url(root: str, session: Session) -> str:
    """The OpenAI-style base URL (ending in /v1) for `session`, served at `root`."""
    return f"{root.rstrip('/')}/s/{session.token}/v1"


def new_session_id(worker: int = 0, workers: int = 1) -> str:
    """A random session id that `worker_of` maps to `worker`."""
    while True:
        session_id = uuid.uuid4().hex
        if worker_of(session_id, workers) == worker:
            return session_id


def least_loaded_worker(store: Store, workers: int) -> int:
    """The worker serving the fewest open sessions (the store knows them all)."""
    if workers <= 1:
        return 0
    counts = [0] * workers
    for session_id in store.open_session_ids():
        counts[worker_of(session_id, workers)] += 1
    return counts.index(min(counts))


def create_session(store: Store, *, workers: int = 1, model: str = "",
                   run_id: str = "", rollout_id: str = "", task_id: str = "",
                   sampling: SamplingParams | None = None,
                   metadata: dict[str, Any] | None = None,
                   weight_version: str | None = None) -> Session:
    """A new open session in the store (committed), served by the least loaded of `workers`
    gateway workers (the one `worker_of` maps its id to)."""
    session = Session(
        id=new_session_id(least_loaded_worker(store, workers), workers),
        # 32 random bytes: the token is the only credential a sandbox holds.
        token=secrets.token_urlsafe(32),
        # The trusted side's credential for reading this session's calls and sealing it.
        scoring_token=secrets.token_urlsafe(32),
        run_id=run_id, rollout_id=rollout_id, task_id=task_id, model=model,
        sampling=sampling or SamplingParams(), weight_version=weight_version,
        metadata=metadata or {},
    )
    # The store's copy carries the hashes (what the registry's cache is keyed by) and, in
    # this returned object only, the credentials in clear.
    return store.create_session(session)


def close_in_store(store: Store, session_id: str) -> Session | None:
    """Close a session in the store (the worker serving it must still drop it from its
    memory: `SessionRegistry.forget`); the closed session, or None when there is none."""
    if store.get_session(session_id) is None:
        return None
    store.close_session(session_id)
    return store.get_session(session_id)


class MisdirectedSession(Exception):
    """The token belongs to an open session that another gateway worker serves."""


class SessionRegistry:
    """Open sessions by token (model calls look them up so), backed by the store; also
    held by id, for closing.

    `worker` / `workers`: this process serves only the sessions `worker_of` maps to
    `worker` (a single gateway serves them all).
    """

    def __init__(self, store: Store, bundle: ModelBundle, *, model_name: str = "",
                 weight_version: str | None = None, policy: RenderPolicy = "exact",
                 worker: int = 0, workers: int = 1) -> None:
        self.store = store
        self.bundle = bundle
        self.model_name = model_name
        self.weight_version = weight_version
        self.policy = policy
        self.worker, self.workers = worker, workers
        self._by_token: dict[str, LiveSession] = {}
        self._by_id: dict[str, LiveSession] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def open(self, *, run_id: str = "", rollout_id: str = "", task_id: str = "",
             sampling: SamplingParams | None = None, metadata: dict[str, Any] | None = None,
             weight_version: str | None = None) -> Session:
        """Create a session in the store (committed), served by the least loaded worker;
        cached here when that is this process."""
        session = create_session(
            self.store, workers=self.workers, model=self.model_name,
            run_id=run_id, rollout_id=rollout_id, task_id=task_id, sampling=sampling,
            metadata=metadata, weight_version=weight_version or self.weight_version)
        if worker_of(session.id, self.workers) == self.worker:
            self._cache(LiveSession(session, SessionTokens(self.bundle, self.policy)))
        return session

    def by_token(self, token: str) -> LiveSession | None:
        """The open session that `token` belongs to, or None (unknown or closed).

        `MisdirectedSession` when another worker serves it.
        """
        if not token:
            return None
        token_hash = secret_hash(token)
        live = self._by_token.get(token_hash)
        if live is not None:
            return live
        session = self.store.get_session_by_token_hash(token_hash)
        if session is None or session.status != "open":
            return None
        if worker_of(session.id, self.workers) != self.worker:
            raise MisdirectedSession(session.id)
        return self._load(session)

    def close(self, session_id: str) -> Session | None:
        """Close the session in the store and drop its token cache; None when unknown."""
        session = close_in_store(self.store, session_id)
        self.forget(session_id)
        return session

    def cache_stats(self) -> dict[str, int]:
        """Open sessions cached, the token ids their caches hold, and the bytes they take."""
        lives = list(self._by_id.values())
        return {"open_sessions_cached": len(lives),
                "cached_tokens": sum(live.tokens.num_tokens() for live in lives),
                "cached_token_bytes": sum(live.tokens.nbytes() for live in lives)}

    def _cache(self, live: LiveSession) -> LiveSession:
        self._by_token[live.session.token_hash] = live
        self._by_id[live.session.id] = live
        return live

    def forget(self, session_id: str) -> None:
        """Drop a session closed elsewhere (the store already says closed)."""
        live = self._by_id.pop(session_id, None)
        if live is not None:
            self._by_token.pop(live.session.token_hash, None)

    def _load(self, session: Session) -> LiveSession:
        tokens = SessionTokens(self.bundle, self.policy)
        next_index = self.store.next_call_index(session.id)
        live = LiveSession(session, tokens, next_index=next_index)
        if next_index > 0:
            self._replay(live, self.store.list_calls(session.id))
        return self._cache(live)

    def _replay(self, live: LiveSession, calls: list[Call]) -> None:
        """Rebuild the branch state from the stored calls, oldest first.

        Each stored request is rendered again (so branches are opened and extended in the
        same order as the first time, failed calls included) and each successful call is
        committed with its stored ids, which stay the exact ids the engine saw.
        """
        from openforge.gateway.conversation import Completion
        from openforge.gateway.dialects import DIALECTS, DialectError
        from openforge.gateway.images import attach_stored_images

        replayed = 0
        for call in sorted(calls, key=lambda c: c.index):
            try:
                dialect = DIALECTS[call.dialect]
                request = dialect.parse(call.request, memo=live.memo)
                if call.images:
                    attach_stored_images(request, call.images, self.store)
                rendered = live.tokens.render(request)
                if call.status != "ok":
                    continue
                # The stored ids are the ones the engine saw: keep them, not the re-render.
                rendered.prompt, rendered.extends = ids_array(call.prompt_ids), None
                assistant, _ = live.tokens.parse(request, call.prompt_ids, call.completion_ids)
                history = dialect.history_message(Completion(message=assistant))
                live.tokens.commit(request, rendered, list(call.completion_ids), history,
                                   call.id)
                replayed += 1
            except (DialectError, PromptError, KeyError, ValueError, IndexError) as exc:
                log.warning("session %s: stored call %s not replayed (%s); a later request "
                            "may open a new branch", live.session.id, call.id, exc)
        log.info("session %s: rebuilt branch state from %d stored calls", live.session.id, replayed)
