"""The durable trace store: sessions, recorded calls and rollout results in SQLite.

One small interface (`Store`) so that a networked database can take its place later.

Storage choices:

- WAL journal mode, so readers (exports, reports, the admin API) never block the gateway's
  writes, and `synchronous=NORMAL`: in WAL mode a committed transaction survives a crash or
  `kill -9` of the process; only an OS crash or power loss may roll back the last few
  commits (the database itself stays consistent).
- WAL checkpoints normally run inside the commit that fills the WAL; a writer that must
  not stall (the gateway's event loop) calls `checkpoint_in_background()` to have a
  daemon thread run them instead.
- One SQLite connection per thread (SQLite connections must not be shared between threads
  mid-transaction) and a `busy_timeout`, so several threads and several processes can write
  to the same file; writes take the write lock up front (`BEGIN IMMEDIATE`) so two writers
  never deadlock upgrading a read lock.
- Token ids are little-endian int32 blobs, logprobs little-endian float32 blobs (4 bytes per
  token each instead of ~6 as JSON text). Raw requests/responses are JSON text, zstd-compressed
  when larger than `COMPRESS_OVER` bytes (a column holds TEXT or a compressed BLOB; the type
  tells which). Stores written before 2026-12-03 hold zlib BLOBs; both read back (a zstd
  frame starts with its magic number, a zlib stream never does).
- A call's prompt usually starts with the prompt + completion of an earlier call of its
  session (the gateway extends a branch turn by turn). Such a call is stored as a delta: its
  `prompt_base` names that earlier call and its `prompt_ids` blob holds only the ids after
  it, so a session's prompts take space, and the gateway's write time, in proportion to
  what each call adds rather than to the whole context (schema 4). `Store` rebuilds the
  whole prompt on every read (`_Chains`); a base that is not an `ok` call of the same
  session is never referenced (the call is stored whole instead).
- A call's request body is likewise the body of the call its prompt extends with a few
  messages added, and is stored as a delta against it (`request_base`, `text_delta`: the
  lengths of the two ends they share, and the bytes between; schema 5) while the store
  holds that body's text in memory (the latest `_REQUEST_TEXTS_BYTES` of them), and whole
  every `_REQUEST_CHAIN_MAX` calls of a chain, so a read never follows more.
- Session tokens and scoring credentials are stored as their SHA-256 only (`token_hash`,
  `scoring_hash`); the gateway looks sessions up by hash. A store that an agent manages to
  read (sandbox none) leaks no credential. Schema 1 stores (tokens in clear) are migrated in
  place when opened.
- Images (screenshots a harness sent) are stored once each, keyed by the sha256 of their
  exact bytes, in the `images` table; a call's `images` column lists the hashes its prompt
  holds, in order. A call's new images are inserted in the call's own transaction, so a
  recorded call never references an image that is not stored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import struct
import sys
import threading
import time
import zlib
from array import array
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import zstandard

from openforge import text_delta
from openforge.errors import OpenforgeError
from openforge.types import Call, RolloutResult, SamplingParams, Session

SCHEMA_VERSION = 5
COMPRESS_OVER = 4096  # bytes of JSON text above which request/response are zstd-compressed
# zstd level 1: the gateway compresses every (growing) request body it records, and zstd
# does it several times faster than zlib's fastest level, into fewer bytes.
ZSTD_LEVEL = 1
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BUSY_TIMEOUT_MS = 30_000
CHECKPOINT_INTERVAL_S = 1.0  # between background WAL checkpoints (checkpoint_in_background)
_ITER_BATCH = 256  # rows fetched at a time by iter_calls
_OK_CALLS_KEPT = 4096  # ok calls a store remembers having committed (prompt bases)
_BASES_KEPT = 16  # whole prompt + completion ids (and request texts) a reader keeps (_Chains)
# Request texts of its latest ok calls a store keeps as bases for the next calls' deltas.
_REQUEST_TEXTS_BYTES = 32 << 20
# A request stored against at most this many earlier ones in a row; the next is whole.
_REQUEST_CHAIN_MAX = 32

_SWAP = sys.byteorder != "little"  # blobs are little-endian whatever the host is


class StoreError(OpenforgeError):
    """The store file cannot be used (newer schema, not a database, unknown session)."""


class NewCall(NamedTuple):
    """A call to record (`Store.add_calls`), with what spares the store re-encoding it.

    `request_json` / `response_json`, when given, are JSON text of `call.request` /
    `call.response` (the bodies as they went over the wire): stored instead of encoding
    the values again, they read back as the same values. `prompt_blob`, when given, is
    `ids_to_blob(call.prompt_ids)`, computed by the caller from ids it holds as an array.
    `images` maps sha256 -> (media type, bytes) for the images `call.images` references;
    those not stored yet are stored in the same transaction.

    `prompt_base`, when given, is the id of an earlier call of the same session whose
    prompt + completion ids are the first ids of `call.prompt_ids`, and `prompt_blob` is
    then required and holds only the ids after them. It is kept only while that call is
    an `ok` call of the session (already stored, or earlier in the same `add_calls`);
    otherwise the prompt is stored whole.
    """

    call: Call
    request_json: bytes | None = None
    response_json: bytes | None = None
    prompt_blob: bytes | None = None
    images: Mapping[str, tuple[str, bytes]] | None = None
    prompt_base: str | None = None


class DuplicateCallError(StoreError):
    """A call with this id is already recorded."""


def _duplicate(calls: Sequence[NewCall]) -> DuplicateCallError:
    if len(calls) == 1:
        return DuplicateCallError(f"call {calls[0].call.id!r} is already recorded")
    ids = ", ".join(repr(c.call.id) for c in calls)
    return DuplicateCallError(f"one of the calls {ids} is already recorded")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    run_id TEXT NOT NULL DEFAULT '',
    rollout_id TEXT NOT NULL DEFAULT '',
    task_id TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '',
    sampling TEXT NOT NULL DEFAULT '{}',
    weight_version TEXT,
    status TEXT NOT NULL DEFAULT 'open',
    reward REAL,
    reward_details TEXT,
    created_at REAL NOT NULL,
    closed_at REAL,
    metadata TEXT NOT NULL DEFAULT '{}',
    scoring_hash TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS sessions_run ON sessions (run_id, created_at);
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    branch INTEGER NOT NULL DEFAULT 0,
    branch_reason TEXT,
    dialect TEXT NOT NULL,
    request BLOB,
    response BLOB,
    prompt_ids BLOB NOT NULL,
    completion_ids BLOB NOT NULL,
    logprobs BLOB NOT NULL,
    finish_reason TEXT,
    sampling TEXT NOT NULL DEFAULT '{}',
    weight_version TEXT,
    exact_tokens INTEGER NOT NULL DEFAULT 1,
    status TEXT NOT NULL DEFAULT 'ok',
    error TEXT,
    body_digest TEXT NOT NULL DEFAULT '',
    retry_count INTEGER NOT NULL DEFAULT 0,
    images TEXT NOT NULL DEFAULT '[]',
    started_at REAL NOT NULL DEFAULT 0,
    finished_at REAL NOT NULL DEFAULT 0,
    http_status INTEGER,
    prompt_base TEXT,
    request_base TEXT
);
CREATE INDEX IF NOT EXISTS calls_session ON calls (session_id, idx);
CREATE TABLE IF NOT EXISTS images (
    sha256 TEXT PRIMARY KEY,
    media_type TEXT NOT NULL,
    data BLOB NOT NULL,
    size INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    session_id TEXT PRIMARY KEY,
    data TEXT NOT NULL,
    updated_at REAL NOT NULL
);
"""

_CALL_COLUMNS = (
    "id, session_id, idx, branch, branch_reason, dialect, request, response, prompt_ids, "
    "completion_ids, logprobs, finish_reason, sampling, weight_version, exact_tokens, status, "
    "error, body_digest, retry_count, images, started_at, finished_at, http_status, prompt_base, "
    "request_base"
)
_INSERT_CALL = f"INSERT INTO calls ({_CALL_COLUMNS}) VALUES ({', '.join('?' * 25)})"


def _chain_query(base_column: str, *columns: str) -> str:
    """A call and the calls it is stored against by `base_column` (`prompt_base`,
    `request_base`), in no set order: rows of (id, base, *columns). UNION, not UNION ALL: a
    cycle (which only a damaged file could hold) ends when its rows repeat."""
    return f"""
WITH RECURSIVE chain(id, base, {', '.join(columns)}) AS (
    SELECT id, {base_column}, {', '.join(columns)} FROM calls WHERE id = ?
    UNION
    SELECT c.id, c.{base_column}, {', '.join(f'c.{c}' for c in columns)}
    FROM calls AS c JOIN chain ON c.id = chain.base
)
SELECT * FROM chain"""


_CHAIN = _chain_query("prompt_base", "prompt_ids", "completion_ids")
_REQUEST_CHAIN = _chain_query("request_base", "request")

_SESSION_COLUMNS = (
    "id, token_hash, run_id, rollout_id, task_id, model, sampling, weight_version, status, "
    "reward, created_at, closed_at, metadata, scoring_hash"
)


def secret_hash(secret: str) -> str:
    """What the store keeps of a session token or scoring credential (SHA-256, hex).

    The secrets are 32 random bytes: a fast hash is enough, no salt or stretching needed.
    """
    return hashlib.sha256(secret.encode()).hexdigest()


def ids_to_blob(ids: Sequence[int]) -> bytes:
    """Token ids (a list, or an int32 `array`) as a little-endian int32 blob."""
    if isinstance(ids, array) and ids.typecode == "i" and ids.itemsize == 4:
        arr = ids
    else:
        try:
            # struct converts a list in one C loop, twice as fast as building an array.
            return struct.pack(f"<{len(ids)}i", *ids)
        except struct.error:
            arr = array("i", ids)  # raises what it always raised (an id beyond int32)
    if _SWAP:
        arr = array("i", arr)
        arr.byteswap()
    return arr.tobytes()


def blob_to_ids(blob: bytes) -> list[int]:
    """The inverse of `ids_to_blob`."""
    return blob_to_array(blob).tolist()


def blob_to_array(blob: bytes) -> array:
    """`ids_to_blob`'s blob as an int32 `array` (in the host's byte order)."""
    arr = array("i")
    arr.frombytes(blob)
    if _SWAP:
        arr.byteswap()
    return arr


def floats_to_blob(values: list[float]) -> bytes:
    """Logprobs as a little-endian float32 blob."""
    arr = array("f", values)
    if _SWAP:
        arr.byteswap()
    return arr.tobytes()


def blob_to_floats(blob: bytes) -> list[float]:
    """The inverse of `floats_to_blob` (values come back rounded to float32)."""
    arr = array("f")
    arr.frombytes(blob)
    if _SWAP:
        arr.byteswap()
    return arr.tolist()


_zstd = threading.local()  # zstd contexts, one pair per thread (a context is not thread-safe)


def _compress(data: bytes) -> bytes:
    """A zstd frame of `data` (its size in the frame header, so any zstd reader takes it)."""
    # A kept context: making one per call would double the gateway's compression time.
    if not hasattr(_zstd, "compressor"):
        _zstd.compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return _zstd.compressor.compress(data)  # type: ignore[no-any-return]


def _decompress(blob: bytes) -> bytes:
    if blob[:4] != _ZSTD_MAGIC:
        return zlib.decompress(blob)  # a store written before zstd
    if not hasattr(_zstd, "decompressor"):
        _zstd.decompressor = zstandard.ZstdDecompressor()
    return _zstd.decompressor.decompress(blob)  # type: ignore[no-any-return]


def _json_text(raw: bytes | None, value: Any) -> bytes | None:
    """The JSON text a column keeps of `value` (None for None): `raw`, JSON text that decodes
    to `value` (a body as it went over the wire), when given and plain UTF-8, so it need not
    be encoded again; else `value` encoded.

    `raw` in another encoding, or with a byte-order mark, is encoded again: `_unpack_json`
    could not read it back.
    """
    # json.loads took `raw` as bytes and guessed its encoding; only UTF-8 reads back here.
    if raw is not None and json.detect_encoding(raw) == "utf-8":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return raw
    if value is None:
        return None
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _pack_text(text: bytes | None) -> str | bytes | None:
    """JSON text as a column holds it: TEXT, or a zstd BLOB above `COMPRESS_OVER` bytes."""
    if text is None:
        return None
    return _compress(text) if len(text) > COMPRESS_OVER else text.decode("utf-8")


def _unpack_json(value: str | bytes | None) -> Any:
    return None if value is None else json.loads(_unpack_text(value))


def _unpack_text(value: str | bytes) -> bytes:
    """The JSON text of a column as `_pack_text` was given it."""
    return _decompress(value) if isinstance(value, bytes) else value.encode("utf-8")


class _Chains:
    """Whole prompts and request bodies from delta-stored rows (`NewCall.prompt_base`,
    `request_base`), for one reader.

    Keeps the prompt + completion ids and the request text of the latest `ok` calls read
    (`_BASES_KEPT`, of one session), as bases for the calls after them: reading a session
    in order decodes everything once, in memory bounded whatever the session's length. A
    base the reader does not hold (a single call read, a filtered listing, a branch left
    long ago) is read with its own chain of bases in one query.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.session = ""
        self.sequences: dict[str, array] = {}  # call id -> its prompt + completion ids
        self.texts: dict[str, bytes] = {}  # call id -> its request's JSON text

    def _enter(self, session_id: str) -> None:
        if session_id != self.session:
            self.session, self.sequences, self.texts = session_id, {}, {}

    def prompt(self, call_id: str, session_id: str, base: str | None, blob: bytes,
               completion: array, status: str) -> list[int]:
        self._enter(session_id)
        ids = blob_to_array(blob)
        if base is not None:
            ids = self._sequence(base, call_id) + ids
        if status == "ok":  # only ok calls are ever bases
            _keep(self.sequences, call_id, ids + completion)
        return ids.tolist()

    def request(self, call_id: str, session_id: str, base: str | None,
                value: str | bytes | None, status: str) -> Any:
        self._enter(session_id)
        if value is None:
            return None
        if base is None:
            text = _unpack_text(value)
        else:
            text = self._patched(self._text(base, call_id), value, call_id)
        if status == "ok":
            _keep(self.texts, call_id, text)
        return json.loads(text)

    def _sequence(self, base: str, of: str) -> array:
        known = self.sequences.get(base)
        if known is not None:
            _keep(self.sequences, base, known)
            return known
        ids = array("i")
        for _, _, prompt, completion in _chain(self.conn, _CHAIN, base, of, "prompt"):
            ids.extend(blob_to_array(prompt))
            ids.extend(blob_to_array(completion))
        _keep(self.sequences, base, ids)
        return ids

    def _text(self, base: str, of: str) -> bytes:
        known = self.texts.get(base)
        if known is not None:
            _keep(self.texts, base, known)
            return known
        text = b""
        for call_id, stored_against, value in _chain(self.conn, _REQUEST_CHAIN, base, of,
                                                     "request"):
            if stored_against is not None:
                text = self._patched(text, value, call_id)
            elif value is not None:
                text = _unpack_text(value)
            else:
                raise StoreError(f"call {of!r}: its request is stored against call "
                                 f"{call_id!r}, which has none (the store file was edited "
                                 "or damaged)")
        _keep(self.texts, base, text)
        return text

    @staticmethod
    def _patched(base_text: bytes, value: str | bytes | None, call_id: str) -> bytes:
        try:
            if not isinstance(value, bytes):
                raise ValueError("the delta is not a blob")
            return text_delta.apply(base_text, _decompress(value))
        except (ValueError, zstandard.ZstdError) as exc:
            raise StoreError(f"call {call_id!r}: its request cannot be rebuilt from the call "
                             f"it is stored against ({exc}; the store file was edited or "
                             "damaged)") from None


def _keep(kept: dict[str, Any], call_id: str, value: Any) -> None:
    kept.pop(call_id, None)
    kept[call_id] = value  # the latest last (dicts keep insertion order)
    if len(kept) > _BASES_KEPT:
        del kept[next(iter(kept))]


def _chain(conn: sqlite3.Connection, query: str, base: str, of: str,
           what: str) -> list[tuple[Any, ...]]:
    """The rows of `base` and the calls it is stored against (`query`), the chain's first
    call first; StoreError if the chain is broken or circular."""
    rows = {row[0]: row for row in conn.execute(query, (base,))}
    chain: list[tuple[Any, ...]] = []  # base, its base, ...
    at: str | None = base
    while at is not None:
        row = rows.get(at)
        if row is None or len(chain) > len(rows):
            problem = "which this store does not hold" if row is None else "in a cycle"
            raise StoreError(f"call {of!r}: its {what} is stored against call {at!r}, "
                             f"{problem} (the store file was edited or damaged)")
        chain.append(row)
        at = row[1]
    return chain[::-1]


def _row_to_call(row: sqlite3.Row | tuple[Any, ...], chains: _Chains) -> Call:
    (cid, session_id, idx, branch, branch_reason, dialect, request, response, prompt_ids,
     completion_ids, logprobs, finish_reason, sampling, weight_version, exact_tokens, status,
     error, body_digest, retry_count, images, started_at, finished_at, http_status,
     prompt_base, request_base) = row
    completion = blob_to_array(completion_ids)
    # model_construct: the row was validated when it was written; re-validating every token
    # list on read would dominate export time.
    return Call.model_construct(
        id=cid, session_id=session_id, index=idx, branch=branch, branch_reason=branch_reason,
        dialect=dialect,
        request=chains.request(cid, session_id, request_base, request, status) or {},
        response=_unpack_json(response),
        prompt_ids=chains.prompt(cid, session_id, prompt_base, prompt_ids, completion, status),
        completion_ids=completion.tolist(),
        logprobs=blob_to_floats(logprobs), finish_reason=finish_reason,
        sampling=json.loads(sampling), weight_version=weight_version,
        exact_tokens=bool(exact_tokens), status=status, error=error, body_digest=body_digest,
        retry_count=retry_count, images=json.loads(images), started_at=started_at,
        finished_at=finished_at, http_status=http_status,
    )


def _row_to_session(row: sqlite3.Row | tuple[Any, ...]) -> Session:
    (sid, token_hash, run_id, rollout_id, task_id, model, sampling, weight_version, status,
     reward, created_at, closed_at, metadata, scoring_hash) = row
    return Session(
        id=sid, token_hash=token_hash, scoring_hash=scoring_hash, run_id=run_id,
        rollout_id=rollout_id, task_id=task_id, model=model,
        sampling=SamplingParams.model_validate_json(sampling), weight_version=weight_version,
        status=status, reward=reward, created_at=created_at, closed_at=closed_at,
        metadata=json.loads(metadata),
    )


class StoredImage(NamedTuple):
    """One image as stored: its exact bytes and the media type they are."""

    sha256: str
    media_type: str
    data: bytes


def _switch_to_wal(conn: sqlite3.Connection) -> None:
    """`PRAGMA journal_mode = WAL`, retried while the database is locked: SQLite can answer
    it "database is locked" at once, without waiting out the busy timeout, while another
    process creates the same new store or its last connection closes it (seen in CI with
    three processes racing to create one store: tests/test_store.py)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class Store:
    """Sessions, calls and results in one SQLite file; safe across threads and processes.

    Every write method commits before it returns.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a directory; give the path of a .sqlite file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._closed = False
        # Hashes of images known to be committed: a session's screenshots are referenced by
        # every later call, and need not be sent to SQLite again each time.
        self._stored_images: set[str] = set()
        # The latest ok calls this store committed (id -> session), the bases of the next
        # prompts: rows are never changed or deleted, so these need no query to check.
        self._ok_calls: dict[str, str] = {}
        # The request texts of the latest ok calls it committed (id -> text, and how many
        # deltas in a row the text's row is the end of), the bases of the next requests.
        self._request_texts: dict[str, tuple[bytes, int]] = {}
        self._request_text_bytes = 0
        # Set by checkpoint_in_background: the thread's stop event and the thread.
        self._checkpointer: tuple[threading.Event, threading.Thread] | None = None
        self._init_schema()

    # -- connections -------------------------------------------------------------------

    def _open_connection(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN IMMEDIATE / COMMIT ourselves.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            _switch_to_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            if self._checkpointer is not None:
                conn.execute("PRAGMA wal_autocheckpoint = 0")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"{self.path} is not an openforge store ({exc})") from None
        with self._connections_lock:
            self._connections.append(conn)
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._open_connection()
            self._local.conn = conn
        return conn

    def _write(self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> sqlite3.Cursor:
        with self._transaction() as conn:
            return conn.execute(sql, params)

    @contextlib.contextmanager
    def _transaction(self, calls: Sequence[NewCall] = ()) -> Iterator[sqlite3.Connection]:
        """`BEGIN IMMEDIATE` ... `COMMIT`, rolled back on any error; a key already taken
        while writing `calls` is raised as `DuplicateCallError`."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK")
            if calls:
                raise _duplicate(calls) from None
            raise
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _init_schema(self) -> None:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not an openforge store ({exc})") from None
        try:
            found = conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name='schema_version'"
            ).fetchone()
            version = None
            if found:
                row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
                version = row[0] if row else None
            if version is not None and version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} was written by a newer openforge (store schema {version}, this "
                    f"version reads up to {SCHEMA_VERSION}); upgrade openforge to read it")
            if version == 1:
                self._migrate_from_1(conn)
            if version is not None and version < 3:
                self._migrate_to_3(conn)
            if version is not None and version < 4:
                self._migrate_to_4(conn)
            if version is not None and version < 5:
                self._migrate_to_5(conn)
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            if version is None:
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif version < SCHEMA_VERSION:
                conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        except sqlite3.DatabaseError as exc:
            conn.execute("ROLLBACK")
            raise StoreError(f"{self.path} is not an openforge store ({exc})") from None
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @staticmethod
    def _migrate_from_1(conn: sqlite3.Connection) -> None:
        """Schema 1 kept session tokens in clear: keep their hashes instead."""
        conn.execute("ALTER TABLE sessions RENAME COLUMN token TO token_hash")
        conn.execute("ALTER TABLE sessions ADD COLUMN scoring_hash TEXT NOT NULL DEFAULT ''")
        rows = conn.execute("SELECT id, token_hash FROM sessions").fetchall()
        for sid, token in rows:
            conn.execute("UPDATE sessions SET token_hash = ? WHERE id = ?",
                         (secret_hash(token), sid))

    @staticmethod
    def _migrate_to_3(conn: sqlite3.Connection) -> None:
        """Schema 3 keeps the HTTP status the gateway answered each call with (NULL for the
        calls recorded before)."""
        columns = {row[1] for row in conn.execute("PRAGMA table_info(calls)")}
        if columns and "http_status" not in columns:
            conn.execute("ALTER TABLE calls ADD COLUMN http_status INTEGER")

    @staticmethod
    def _migrate_to_4(conn: sqlite3.Connection) -> None:
        """Schema 4 may store a call's prompt against an earlier call (`prompt_base`); the
        calls recorded before hold their whole prompt (NULL)."""
        columns = {row[1] for row in conn.execute("PRAGMA table_info(calls)")}
        if columns and "prompt_base" not in columns:
            conn.execute("ALTER TABLE calls ADD COLUMN prompt_base TEXT")

    @staticmethod
    def _migrate_to_5(conn: sqlite3.Connection) -> None:
        """Schema 5 may store a call's request against an earlier call's (`request_base`);
        the calls recorded before hold their whole request (NULL)."""
        columns = {row[1] for row in conn.execute("PRAGMA table_info(calls)")}
        if columns and "request_base" not in columns:
            conn.execute("ALTER TABLE calls ADD COLUMN request_base TEXT")

    @property
    def schema_version(self) -> int:
        row = self._conn().execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0])

    def checkpoint_in_background(self, interval_s: float = CHECKPOINT_INTERVAL_S) -> None:
        """Move WAL checkpoints off the writers' path (the gateway's event loop).

        By default SQLite checkpoints inside the commit that fills the WAL past 1000 pages:
        that commit copies the WAL into the database and syncs it, stalling its caller for
        milliseconds. From now on this store's connections (this thread's, and any opened
        later) never do that; a daemon thread runs a passive checkpoint every `interval_s`
        instead (SQLite releases the GIL while it copies and syncs). Durability is the same:
        a committed call is in the WAL either way. `close()` stops the thread. Idempotent.
        """
        if self._checkpointer is not None or self._closed:
            return
        stop = threading.Event()
        thread = threading.Thread(target=self._checkpoint_loop, args=(stop, interval_s),
                                  name="openforge-store-checkpoint", daemon=True)
        self._checkpointer = (stop, thread)
        self._conn().execute("PRAGMA wal_autocheckpoint = 0")
        thread.start()

    def _checkpoint_loop(self, stop: threading.Event, interval_s: float) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            while not stop.wait(interval_s):
                try:
                    # PASSIVE: copies what no reader still needs; never waits for anyone.
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    continue  # e.g. the file is busy being swapped: next round
        finally:
            conn.close()

    def close(self) -> None:
        """Close every connection this store opened (in any thread). Idempotent."""
        self._closed = True
        if self._checkpointer is not None:
            stop, thread = self._checkpointer
            stop.set()
            thread.join(timeout=30)
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sessions ----------------------------------------------------------------------

    def create_session(self, session: Session) -> Session:
        """Record a new session; its id and token must be unique. Only the hashes of its
        token and scoring credential are written (computed here when not set)."""
        token_hash = session.token_hash or secret_hash(session.token)
        scoring_hash = session.scoring_hash or (
            secret_hash(session.scoring_token) if session.scoring_token else "")
        try:
            self._write(
                f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session.id, token_hash, session.run_id, session.rollout_id, session.task_id,
                 session.model, session.sampling.model_dump_json(), session.weight_version,
                 session.status, session.reward, session.created_at, session.closed_at,
                 json.dumps(session.metadata), scoring_hash),
            )
        except sqlite3.IntegrityError:
            raise StoreError(f"session {session.id!r} (or its token) already exists") from None
        return session.model_copy(update={"token_hash": token_hash, "scoring_hash": scoring_hash})

    def get_session(self, session_id: str) -> Session | None:
        row = self._conn().execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return _row_to_session(row) if row else None

    def get_session_by_token(self, token: str) -> Session | None:
        """The session `token` belongs to (looked up by its hash)."""
        return self.get_session_by_token_hash(secret_hash(token))

    def get_session_by_token_hash(self, token_hash: str) -> Session | None:
        row = self._conn().execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE token_hash = ?", (token_hash,)
        ).fetchone()
        return _row_to_session(row) if row else None

    def open_session_ids(self) -> list[str]:
        """The ids of every open session."""
        rows = self._conn().execute("SELECT id FROM sessions WHERE status = 'open'").fetchall()
        return [r[0] for r in rows]

    def list_sessions(self, run_id: str | None = None) -> list[Session]:
        """Sessions in creation order, all or those of one run."""
        if run_id is None:
            rows = self._conn().execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY created_at, id").fetchall()
        else:
            rows = self._conn().execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE run_id = ? ORDER BY created_at, id",
                (run_id,)).fetchall()
        return [_row_to_session(r) for r in rows]

    def close_session(self, session_id: str, closed_at: float | None = None) -> None:
        """Mark a session closed (idempotent: the first close time is kept)."""
        cur = self._write(
            "UPDATE sessions SET status = 'closed', closed_at = COALESCE(closed_at, ?) WHERE id = ?",
            (closed_at if closed_at is not None else time.time(), session_id))
        if cur.rowcount == 0:
            raise StoreError(f"no session {session_id!r}")

    def set_reward(self, session_id: str, reward: float | None,
                   details: dict[str, Any] | None = None) -> None:
        """Set (or replace) a session's reward and the reward's details; None: no reward
        (an attempt that was not scored), replacing whatever was there."""
        cur = self._write(
            "UPDATE sessions SET reward = ?, reward_details = ? WHERE id = ?",
            (None if reward is None else float(reward),
             json.dumps(details) if details is not None else None, session_id))
        if cur.rowcount == 0:
            raise StoreError(f"no session {session_id!r}")

    def get_reward_details(self, session_id: str) -> dict[str, Any] | None:
        row = self._conn().execute(
            "SELECT reward_details FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def update_session_metadata(self, session_id: str, metadata: dict[str, Any]) -> None:
        """Merge keys into a session's metadata (read-modify-write under the write lock)."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT metadata FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise StoreError(f"no session {session_id!r}")
            merged = {**json.loads(row[0]), **metadata}
            conn.execute("UPDATE sessions SET metadata = ? WHERE id = ?",
                         (json.dumps(merged), session_id))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # -- calls -------------------------------------------------------------------------

    @staticmethod
    def _call_params(call: Call, request: str | bytes | None = None,
                     response_json: bytes | None = None,
                     prompt_blob: bytes | None = None,
                     prompt_base: str | None = None,
                     request_base: str | None = None) -> tuple[Any, ...]:
        return (
            call.id, call.session_id, call.index, call.branch, call.branch_reason, call.dialect,
            request, _pack_text(_json_text(response_json, call.response)),
            ids_to_blob(call.prompt_ids) if prompt_blob is None else prompt_blob,
            ids_to_blob(call.completion_ids), floats_to_blob(call.logprobs), call.finish_reason,
            json.dumps(call.sampling), call.weight_version, int(call.exact_tokens), call.status,
            call.error, call.body_digest, call.retry_count, json.dumps(call.images),
            call.started_at, call.finished_at, call.http_status, prompt_base, request_base,
        )

    def add_call(self, call: Call, assign_index: bool = False, *,
                 request_json: bytes | None = None, response_json: bytes | None = None,
                 prompt_blob: bytes | None = None,
                 images: Mapping[str, tuple[str, bytes]] | None = None) -> Call:
        """Record one call in its own transaction, committed when this returns.

        With `assign_index`, the call's index is set to the session's next index inside the
        same transaction (no race between concurrent calls of one session); the call as
        stored is returned. A duplicate call id raises `DuplicateCallError`. The other
        arguments are `NewCall`'s.
        """
        new = [NewCall(call, request_json, response_json, prompt_blob, images)]
        if not assign_index:
            self.add_calls(new)
            return call
        new_images = self._new_images(new)
        with self._transaction(new) as conn:
            self._insert_images(conn, new_images)
            row = conn.execute("SELECT COALESCE(MAX(idx) + 1, 0) FROM calls WHERE session_id = ?",
                               (call.session_id,)).fetchone()
            call = call.model_copy(update={"index": int(row[0])})
            request = _pack_text(_json_text(request_json, call.request))
            conn.execute(_INSERT_CALL, self._call_params(call, request, response_json,
                                                         prompt_blob))
        self._stored_images.update(new_images)
        return call

    def add_calls(self, calls: Sequence[NewCall]) -> None:
        """Record calls in one transaction, committed when this returns: all of them, or
        none and the error (`DuplicateCallError` when a call id is already recorded).

        One transaction for several calls is the gateway's group commit: each SQLite
        commit costs a fixed ~20 system calls (WAL frames, file locks), and with several
        worker processes each commit also makes the others re-read the pages it changed.
        """
        rows = []
        texts: dict[str, tuple[bytes, int]] = {}  # the request texts of ok calls in `calls`
        bases = self._prompt_bases(calls)
        for c, base in zip(calls, bases, strict=True):
            # A base refused: the prompt is stored whole, from the call's own ids.
            blob = c.prompt_blob if base == c.prompt_base else None
            text = _json_text(c.request_json, c.call.request)
            request, request_base, depth = self._pack_request(text, base, texts)
            if text is not None and c.call.status == "ok":
                texts[c.call.id] = (text, depth)
            rows.append(self._call_params(c.call, request, c.response_json, blob, base,
                                          request_base))
        new_images = self._new_images(calls)
        if len(rows) == 1 and not new_images:
            # One statement is its own transaction (autocommit): as durable, and two
            # round trips to SQLite fewer.
            try:
                self._conn().execute(_INSERT_CALL, rows[0])
            except sqlite3.IntegrityError:
                raise _duplicate(calls) from None
        else:
            with self._transaction(calls) as conn:
                self._insert_images(conn, new_images)
                conn.executemany(_INSERT_CALL, rows)
            self._stored_images.update(new_images)
        ok = self._ok_calls
        ok.update((c.call.id, c.call.session_id) for c in calls if c.call.status == "ok")
        if len(ok) > 2 * _OK_CALLS_KEPT:  # keep the latest (dicts keep insertion order)
            self._ok_calls = dict(list(ok.items())[-_OK_CALLS_KEPT:])
        self._keep_request_texts(texts, superseded=[b for b in bases if b is not None])

    def _pack_request(self, text: bytes | None, base: str | None,
                      batch: Mapping[str, tuple[bytes, int]]
                      ) -> tuple[str | bytes | None, str | None, int]:
        """A request's column value, the call it is stored against (None: whole), and how
        many deltas in a row that makes.

        Against `base` (an accepted prompt base: an ok call of the same session, committed or
        earlier in `batch`) when `text` is large enough to be compressed, this store holds
        the base's request text, the chain is shorter than `_REQUEST_CHAIN_MAX` and the two
        share at least half of `text`. A request small enough to be stored as plain text
        still is: readable as it is, and a delta would cost more CPU than it saves.
        """
        if text is None:
            return None, None, 0
        if base is not None and len(text) > COMPRESS_OVER:
            known = batch.get(base) or self._request_texts.get(base)
            if known is not None and known[1] < _REQUEST_CHAIN_MAX:
                delta = text_delta.delta(known[0], text)
                if len(delta) <= len(text) // 2:
                    return _compress(delta), base, known[1] + 1
        return _pack_text(text), None, 0

    def _keep_request_texts(self, texts: Mapping[str, tuple[bytes, int]],
                            superseded: Sequence[str]) -> None:
        """Remember committed request texts as bases: the latest `_OK_CALLS_KEPT`, at most
        `_REQUEST_TEXTS_BYTES` of text. The texts of the calls that others were just stored
        against are dropped: their branch has moved on to those calls, so the store holds
        about one text per branch being extended (a call that forks from an older one is
        stored whole)."""
        kept = self._request_texts
        for call_id, entry in texts.items():
            kept[call_id] = entry
            self._request_text_bytes += len(entry[0])
        for call_id in superseded:
            if call_id in kept:
                self._request_text_bytes -= len(kept.pop(call_id)[0])
        while kept and (self._request_text_bytes > _REQUEST_TEXTS_BYTES
                        or len(kept) > _OK_CALLS_KEPT):
            oldest = next(iter(kept))
            self._request_text_bytes -= len(kept.pop(oldest)[0])

    def _prompt_bases(self, calls: Sequence[NewCall]) -> list[str | None]:
        """Each call's `prompt_base` where it names an `ok` call of the call's own session,
        stored already or earlier in `calls`; None where the prompt must be stored whole.

        A delta against anything else could not be read back whole: the base call's row
        may never have been written (recording it failed and left a bare failed row).
        """
        bases: list[str | None] = []
        earlier: dict[str, str] = {}  # ok call id -> its session, for the calls before
        for new in calls:
            base = new.prompt_base
            if base is not None:
                session = earlier.get(base) or self._ok_calls.get(base)
                if session is None:
                    row = self._conn().execute(
                        "SELECT session_id FROM calls WHERE id = ? AND status = 'ok'",
                        (base,)).fetchone()
                    session = row[0] if row else None
                if session != new.call.session_id:
                    base = None
            bases.append(base)
            if new.call.status == "ok":
                earlier[new.call.id] = new.call.session_id
        return bases

    def _new_images(self, calls: Sequence[NewCall]) -> dict[str, tuple[str, bytes]]:
        """The images of `calls` not known to be stored yet, by sha256."""
        return {sha: image for c in calls for sha, image in (c.images or {}).items()
                if sha not in self._stored_images}

    @staticmethod
    def _insert_images(conn: sqlite3.Connection,
                       images: Mapping[str, tuple[str, bytes]]) -> None:
        if images:
            now = time.time()
            conn.executemany(
                "INSERT OR IGNORE INTO images (sha256, media_type, data, size, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                [(sha, media, data, len(data), now) for sha, (media, data) in images.items()])

    # -- images ------------------------------------------------------------------------

    def get_image(self, sha256: str) -> StoredImage | None:
        """The stored image with this hash, or None."""
        row = self._conn().execute(
            "SELECT sha256, media_type, data FROM images WHERE sha256 = ?", (sha256,)).fetchone()
        return StoredImage(row[0], row[1], bytes(row[2])) if row else None

    def count_images(self) -> int:
        row = self._conn().execute("SELECT COUNT(*) FROM images").fetchone()
        return int(row[0])

    def get_call(self, call_id: str) -> Call | None:
        row = self._conn().execute(
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE id = ?", (call_id,)).fetchone()
        return _row_to_call(row, _Chains(self._conn())) if row else None

    def first_call(self, session_id: str, status: str | None = "ok") -> Call | None:
        """The session's lowest-index call (with this status; any status when None)."""
        where = " AND status = ?" if status is not None else ""
        params: tuple[Any, ...] = (session_id, status) if status is not None else (session_id,)
        row = self._conn().execute(
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE session_id = ?{where} "
            "ORDER BY idx, started_at, id LIMIT 1", params).fetchone()
        return _row_to_call(row, _Chains(self._conn())) if row else None

    def list_calls(self, session_id: str) -> list[Call]:
        """A session's calls ordered by index."""
        rows = self._conn().execute(
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE session_id = ? ORDER BY idx, started_at, id",
            (session_id,)).fetchall()
        chains = _Chains(self._conn())
        return [_row_to_call(r, chains) for r in rows]

    @staticmethod
    def _call_filter(run_id: str | None, session_id: str | None,
                     status: str | None) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if run_id is not None:
            clauses.append("session_id IN (SELECT id FROM sessions WHERE run_id = ?)")
            params.append(run_id)
        if session_id is not None:
            clauses.append("session_id = ?")
            params.append(session_id)
        if status is not None:
            clauses.append("status = ?")
            params.append(status)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    def iter_calls(self, run_id: str | None = None, session_id: str | None = None,
                   status: str | None = None) -> Iterator[Call]:
        """Stream calls ordered by (session id, index), a batch of rows at a time.

        Calls of one session are contiguous, so a consumer can group them by session in
        bounded memory. Uses its own connection: a long export does not hold this thread's
        connection, and WAL lets writers continue meanwhile (the export sees a snapshot).
        """
        where, params = self._call_filter(run_id, session_id, status)
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            cur = conn.execute(
                f"SELECT {_CALL_COLUMNS} FROM calls{where} ORDER BY session_id, idx, started_at, id",
                params)
            chains = _Chains(conn)
            while True:
                rows = cur.fetchmany(_ITER_BATCH)
                if not rows:
                    break
                for row in rows:
                    yield _row_to_call(row, chains)
        finally:
            conn.close()

    def count_calls(self, run_id: str | None = None, session_id: str | None = None,
                    status: str | None = None) -> int:
        where, params = self._call_filter(run_id, session_id, status)
        row = self._conn().execute(f"SELECT COUNT(*) FROM calls{where}", params).fetchone()
        return int(row[0])

    def next_call_index(self, session_id: str) -> int:
        """One past the highest recorded index of the session (0 when it has none)."""
        row = self._conn().execute(
            "SELECT COALESCE(MAX(idx) + 1, 0) FROM calls WHERE session_id = ?",
            (session_id,)).fetchone()
        return int(row[0])

    # -- results -----------------------------------------------------------------------

    def save_result(self, session_id: str, result: RolloutResult) -> None:
        """Store (or replace) the result of a session's rollout."""
        self._write(
            "INSERT INTO results (session_id, data, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT(session_id) DO UPDATE SET data = excluded.data, "
            "updated_at = excluded.updated_at",
            (session_id, result.model_dump_json(), time.time()))

    def get_result(self, session_id: str) -> RolloutResult | None:
        row = self._conn().execute(
            "SELECT data FROM results WHERE session_id = ?", (session_id,)).fetchone()
        return RolloutResult.model_validate_json(row[0]) if row else None

    def list_results(self, run_id: str | None = None) -> list[tuple[Session, RolloutResult]]:
        """(session, result) pairs in session creation order, all or those of one run."""
        cols = ", ".join(f"s.{c.strip()}" for c in _SESSION_COLUMNS.split(","))
        sql = f"SELECT {cols}, r.data FROM sessions s JOIN results r ON r.session_id = s.id"
        params: tuple[Any, ...] = ()
        if run_id is not None:
            sql += " WHERE s.run_id = ?"
            params = (run_id,)
        rows = self._conn().execute(sql + " ORDER BY s.created_at, s.id", params).fetchall()
        return [(_row_to_session(r[:-1]), RolloutResult.model_validate_json(r[-1])) for r in rows]
