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

Sessions stay cached until they are closed (through the admin API or `Gateway`); a
session closed directly in the store by another process is only noticed on a cache miss.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

from openforge.gateway.dialects.memo import HistoryMemo
from openforge.gateway.render import ModelBundle, SessionTokens
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

    def take_index(self) -> int:
        """The index of the next recorded call (indices follow recording order)."""
        index = self.next_index
        self.next_index += 1
        return index


class SessionRegistry:
    """Open sessions by token and by id, backed by the store."""

    def __init__(self, store: Store, bundle: ModelBundle, *, model_name: str = "",
                 weight_version: str | None = None) -> None:
        self.store = store
        self.bundle = bundle
        self.model_name = model_name
        self.weight_version = weight_version
        self._by_token: dict[str, LiveSession] = {}
        self._by_id: dict[str, LiveSession] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def open(self, *, run_id: str = "", rollout_id: str = "", task_id: str = "",
             sampling: SamplingParams | None = None, metadata: dict[str, Any] | None = None,
             weight_version: str | None = None) -> Session:
        """Create a session in the store (committed) and cache it."""
        session = Session(
            id=uuid.uuid4().hex,
            # 32 random bytes: the token is the only credential a sandbox holds.
            token=secrets.token_urlsafe(32),
            # The trusted side's credential for reading this session's calls.
            scoring_token=secrets.token_urlsafe(32),
            run_id=run_id, rollout_id=rollout_id, task_id=task_id,
            model=self.model_name,
            sampling=sampling or SamplingParams(),
            weight_version=weight_version or self.weight_version,
            metadata=metadata or {},
        )
        stored = self.store.create_session(session)
        self._cache(LiveSession(stored, SessionTokens(self.bundle)))
        return stored

    def by_token(self, token: str) -> LiveSession | None:
        """The open session that `token` belongs to, or None (unknown or closed)."""
        if not token:
            return None
        token_hash = secret_hash(token)
        live = self._by_token.get(token_hash)
        if live is not None:
            return live
        session = self.store.get_session_by_token_hash(token_hash)
        if session is None or session.status != "open":
            return None
        return self._load(session)

    def by_id(self, session_id: str) -> LiveSession | None:
        """The open session with this id, or None (unknown or closed)."""
        live = self._by_id.get(session_id)
        if live is not None:
            return live
        session = self.store.get_session(session_id)
        if session is None or session.status != "open":
            return None
        return self._load(session)

    def close(self, session_id: str) -> Session | None:
        """Close the session in the store and drop its token cache; None when unknown."""
        if self.store.get_session(session_id) is None:
            return None
        self.store.close_session(session_id)
        live = self._by_id.pop(session_id, None)
        if live is not None:
            self._by_token.pop(live.session.token_hash, None)
        return self.store.get_session(session_id)

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

    def _load(self, session: Session) -> LiveSession:
        tokens = SessionTokens(self.bundle)
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
        from openforge.gateway.dialects import DIALECTS, DialectError
        from openforge.gateway.images import attach_stored_images

        replayed = 0
        for call in sorted(calls, key=lambda c: c.index):
            try:
                request = DIALECTS[call.dialect].parse(call.request, memo=live.memo)
                if call.images:
                    attach_stored_images(request, call.images, self.store)
                rendered = live.tokens.render(request)
                if call.status != "ok":
                    continue
                rendered.prompt_ids = list(call.prompt_ids)
                assistant, _ = live.tokens.parse(request, call.prompt_ids, call.completion_ids)
                live.tokens.commit(request, rendered, list(call.completion_ids), assistant)
                replayed += 1
            except (DialectError, KeyError, ValueError, IndexError) as exc:
                log.warning("session %s: stored call %s not replayed (%s); a later request "
                            "may open a new branch", live.session.id, call.id, exc)
        log.info("session %s: rebuilt branch state from %d stored calls", live.session.id, replayed)
