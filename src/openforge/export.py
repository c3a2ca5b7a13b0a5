"""Recorded runs -> parquet training data: token-level samples, veRL RL rows, SFT chat rows.

`export_run(run_dir, fmt, out)` reads a run's `store.sqlite` (or a .sqlite file given
directly) and writes `out/data.parquet` plus `out/README.md` describing its columns. Rows
are produced one session at a time and written in record batches with
`pyarrow.parquet.ParquetWriter`, so memory is bounded by one batch and the largest
session, not by the size of the run. Every file loads with
`datasets.load_dataset("parquet", data_files=...)`.

Images (screenshots the harness sent) are referenced by the sha256 of their exact bytes:
the `samples` and `sft` formats list those hashes per row and write each image once as
`out/images/<sha256>.<ext>`; the `verl` format carries the prompt's images inline as an
`images` column of `{bytes, path}` structs, the layout veRL's multimodal `RLHFDataset`
reads, with one `<image>` marker per image in the prompt text.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, Field

from openforge.errors import OpenforgeError
from openforge.store import Store, StoreError
from openforge.trajectory import (
    HISTORY_REWRITTEN,
    RunMetrics,
    build_samples,
    iter_session_calls,
    session_reward,
)
from openforge.types import Call, RolloutResult, Sample, Session, Task

ExportFormat = Literal["verl", "sft", "samples"]
FORMATS: tuple[str, ...] = ("verl", "sft", "samples")
STORE_FILE = "store.sqlite"
DATA_FILE = "data.parquet"
IMAGES_DIR = "images"
IMAGE_MARKER = "<image>"  # where veRL's RLHFDataset splices each image into the prompt
AGENT_NAME = "openforge_agent"
# A batch is flushed at whichever limit comes first; 256k tokens is ~3 MB of arrow buffers.
BATCH_ROWS = 512
BATCH_TOKENS = 256 * 1024


class ExportError(OpenforgeError):
    """The run cannot be exported as asked (no store, bad output path, unknown format)."""


class ExportResult(BaseModel):
    """What an export wrote: the file, its rows, and how many sessions were left out, why."""

    path: Path
    rows: int
    left_out: dict[str, int] = Field(default_factory=dict)

    def note(self) -> str | None:
        """One line saying why nothing was written, when nothing was."""
        if self.rows:
            return None
        if not self.left_out:
            return "0 rows: the store holds no recorded session for this run"
        reasons = "; ".join(f"{why}: {n}" for why, n in sorted(self.left_out.items()))
        return f"0 rows: every session was left out ({reasons})"


# -- schemas -----------------------------------------------------------------------------

SAMPLES_SCHEMA = pa.schema([
    ("sample_id", pa.string()),
    ("session_id", pa.string()),
    ("rollout_id", pa.string()),
    ("task_id", pa.string()),
    ("branch", pa.int32()),
    ("branch_reason", pa.string()),
    ("call_ids", pa.list_(pa.string())),
    ("prompt_ids", pa.list_(pa.int32())),
    ("response_ids", pa.list_(pa.int32())),
    ("response_mask", pa.list_(pa.int8())),
    ("response_logprobs", pa.list_(pa.float32())),
    ("images", pa.list_(pa.string())),
    ("reward", pa.float64()),
    ("num_turns", pa.int32()),
    ("weight_versions", pa.list_(pa.string())),
    ("exact_tokens", pa.bool_()),
])

_PROMPT_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
VERL_SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(_PROMPT_MESSAGE)),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ("extra_info", pa.struct([
        ("index", pa.int64()),
        ("task_id", pa.string()),
        ("rollout_id", pa.string()),
        ("session_id", pa.string()),
        ("run_id", pa.string()),
        ("reward", pa.float64()),
        ("passed", pa.bool_()),
        ("status", pa.string()),
        ("split", pa.string()),
        ("task_json", pa.string()),
    ])),
    ("agent_name", pa.string()),
    ("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))),
])

_TOOL_CALL = pa.struct([
    ("id", pa.string()),
    ("type", pa.string()),
    ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
])
_SFT_MESSAGE = pa.struct([
    ("role", pa.string()),
    ("content", pa.string()),
    ("reasoning_content", pa.string()),
    ("tool_calls", pa.list_(_TOOL_CALL)),
    ("tool_call_id", pa.string()),
    ("name", pa.string()),
])
SFT_SCHEMA = pa.schema([
    ("messages", pa.list_(_SFT_MESSAGE)),
    ("tools", pa.string()),
    ("images", pa.list_(pa.string())),
    ("session_id", pa.string()),
    ("rollout_id", pa.string()),
    ("task_id", pa.string()),
    ("reward", pa.float64()),
    ("num_turns", pa.int32()),
])

SCHEMAS: dict[str, pa.Schema] = {"samples": SAMPLES_SCHEMA, "verl": VERL_SCHEMA, "sft": SFT_SCHEMA}

_README = {
    "samples": """# openforge token-level samples

One row per branch of a session's recorded calls (see `openforge.trajectory`).
`prompt_ids + response_ids` is the exact token sequence the policy saw and produced.

| column | type | meaning |
|---|---|---|
| sample_id | string | `<session_id>/<branch>` |
| session_id, rollout_id, task_id | string | where the sample came from; normalize per `rollout_id` |
| branch | int32 | branch number within the session (0 = first) |
| branch_reason | string? | why the branch was opened (`history_rewritten`, `side_call`, ...); null for branch 0 |
| call_ids | list<string> | the recorded calls merged into this sample, in order |
| prompt_ids | list<int32> | the first call's prompt |
| response_ids | list<int32> | everything after the prompt |
| response_mask | list<int8> | 1 on generated ids, 0 on observations between calls |
| response_logprobs | list<float32> | the engine's logprob on generated ids, 0.0 elsewhere |
| images | list<string> | sha256 of each image the sequence holds, in order (one per image placeholder run); the bytes are `images/<sha256>.<ext>` |
| reward | float64? | the session's reward |
| num_turns | int32 | number of calls merged |
| weight_versions | list<string> | policy weight version of each call |
| exact_tokens | bool | false when any call's ids were a retokenization (text-only engine) |
""",
    "verl": """# openforge veRL RL rows

One row per rollout (session) of the run, infrastructure failures and plugin errors left
out, in the layout
veRL's `RLHFDataset` reads. Dedupe by `extra_info.task_id` for a one-row-per-task dataset.

| column | type | meaning |
|---|---|---|
| data_source | string | session metadata `data_source`, else `environment`, else `openforge` |
| prompt | list<struct<role, content>> | the task prompt as one user message (session metadata `prompt`, else the first user message of the first call) |
| ability | string | session metadata `ability`, else `agent` |
| reward_model | struct<style, ground_truth> | style `rule`; ground_truth: the task's `data["ground_truth"]` (else session metadata `ground_truth`), JSON text when not a string, "" when none |
| extra_info | struct | index, task_id, rollout_id, session_id, run_id, reward, passed, status, split, task_json (the whole Task as JSON, as `openforge train --backend verl` writes it: the veRL agent loop runs the task from it) |
| agent_name | string | `openforge_agent`: the veRL agent loop that runs openforge |
| images | list<struct<bytes, path>> | the images of the prompt's user message (exact bytes; path null), one `<image>` marker each at the start of the prompt text |
""",
    "sft": """# openforge SFT chat rows

One row per passing rollout (its reward's `passed`, else a session reward >= 1.0): the
final conversation of its main branch (the last call's request plus its response).

| column | type | meaning |
|---|---|---|
| messages | list<struct> | OpenAI-style messages: role, content, reasoning_content, tool_calls[{id, type, function{name, arguments (JSON text)}}], tool_call_id, name |
| tools | string | JSON text of the OpenAI-style tool list offered to the model |
| images | list<string> | sha256 of each image in the conversation, in order; the bytes are `images/<sha256>.<ext>` |
| session_id, rollout_id, task_id | string | where the row came from |
| reward | float64? | the session's reward |
| num_turns | int32 | model calls in the branch |
""",
}


# -- writing -----------------------------------------------------------------------------


class _BatchWriter:
    """Buffers rows column-wise and writes a record batch when a limit is reached."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.schema = schema
        self._writer = pq.ParquetWriter(path, schema, compression="zstd")
        self._columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self._rows = 0
        self._tokens = 0
        self.rows_written = 0

    def add(self, row: dict[str, Any], tokens: int = 0) -> None:
        for name, column in self._columns.items():
            column.append(row.get(name))
        self._rows += 1
        self._tokens += tokens
        if self._rows >= BATCH_ROWS or self._tokens >= BATCH_TOKENS:
            self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        batch = pa.RecordBatch.from_pydict(self._columns, schema=self.schema)
        self._writer.write_batch(batch)
        self.rows_written += self._rows
        self._columns = {name: [] for name in self.schema.names}
        self._rows = self._tokens = 0

    def close(self) -> None:
        self.flush()
        self._writer.close()


def resolve_store(run_dir: Path) -> Path:
    """The store file of a run directory, or the .sqlite file itself."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        return run_dir
    if run_dir.is_dir():
        candidate = run_dir / STORE_FILE
        if candidate.is_file():
            return candidate
        raise ExportError(f"{run_dir} has no {STORE_FILE}: give a run directory or a .sqlite store file")
    raise ExportError(f"{run_dir} does not exist")


class _ImageFiles:
    """Writes each referenced image once as `out/images/<sha256>.<ext>`."""

    def __init__(self, store: Store, out: Path) -> None:
        self.store = store
        self.folder = out / IMAGES_DIR
        self.written: set[str] = set()

    def add(self, hashes: list[str]) -> None:
        from openforge.gateway.images import EXTENSIONS

        for sha in hashes:
            if sha in self.written:
                continue
            image = self.store.get_image(sha)
            if image is None:
                raise ExportError(f"image {sha} is referenced by a call but not in the store")
            self.folder.mkdir(parents=True, exist_ok=True)
            target = self.folder / f"{sha}.{EXTENSIONS.get(image.media_type, 'bin')}"
            if not target.exists():
                partial = target.with_name(f".{target.name}.partial")
                partial.write_bytes(image.data)
                os.replace(partial, target)
            self.written.add(sha)


# -- row builders ------------------------------------------------------------------------


def sample_row(sample: Sample) -> dict[str, Any]:
    """A Sample as a row of SAMPLES_SCHEMA."""
    return {
        "sample_id": sample.sample_id, "session_id": sample.session_id,
        "rollout_id": sample.rollout_id, "task_id": sample.task_id, "branch": sample.branch,
        "branch_reason": sample.branch_reason, "call_ids": sample.call_ids,
        "prompt_ids": sample.prompt_ids, "response_ids": sample.response_ids,
        "response_mask": sample.response_mask, "response_logprobs": sample.response_logprobs,
        "images": sample.images, "reward": sample.reward, "num_turns": sample.num_turns,
        "weight_versions": sample.weight_versions, "exact_tokens": sample.exact_tokens,
    }


def _parse_request(call: Call) -> Any:
    """The call's request as the canonical ChatRequest, or None when it cannot be read."""
    from openforge.gateway.dialects import DIALECTS, DialectError

    dialect = DIALECTS.get(call.dialect)
    if dialect is None or not call.request:
        return None
    try:
        return dialect.parse(call.request)
    except (DialectError, ValueError):
        return None


def first_user_message(call: Call) -> str | None:
    """The text of the first user message of a recorded call's request."""
    chat = _parse_request(call)
    if chat is None:
        return None
    if chat.raw_prompt is not None:
        return chat.raw_prompt
    for message in chat.messages:
        if message.role == "user":
            return message.content
    return None


def final_conversation(call: Call) -> Any:
    """The conversation after `call`: its request's history plus its response, canonical.

    Built by appending the recorded wire response to the wire request as the assistant's
    turn and parsing the result with the call's own dialect, so each dialect's quirks are
    handled in one place. Returns a ChatRequest, or None when it cannot be rebuilt.
    """
    from openforge.gateway.conversation import ChatRequest, Message

    request, response = dict(call.request), call.response or {}
    try:
        if call.dialect == "chat":
            message = response["choices"][0]["message"]
            request["messages"] = list(request.get("messages") or []) + [message]
        elif call.dialect == "messages":
            turn = {"role": "assistant", "content": response["content"]}
            request["messages"] = list(request.get("messages") or []) + [turn]
        elif call.dialect == "responses":
            history = request.get("input")
            if isinstance(history, str):
                history = [{"role": "user", "content": history}]
            request["input"] = list(history or []) + list(response["output"])
        elif call.dialect == "completions":
            chat = _parse_request(call)
            if chat is None or chat.raw_prompt is None:
                return None
            text = response["choices"][0]["text"]
            return ChatRequest(messages=[Message(role="user", content=chat.raw_prompt),
                                         Message(role="assistant", content=text)])
        else:
            return None
    except (KeyError, IndexError, TypeError):
        return None
    return _parse_request(call.model_copy(update={"request": request}))


def _message_row(message: Any) -> dict[str, Any]:
    return {
        "role": message.role,
        "content": message.content,
        "reasoning_content": message.reasoning,
        "tool_calls": [{"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}}
                       for c in message.tool_calls],
        "tool_call_id": message.tool_call_id,
        "name": message.name,
    }


def _passed(result: RolloutResult | None, reward: float | None) -> bool:
    if result is not None and result.reward is not None:
        return result.reward.passed
    return reward is not None and reward >= 1.0


def _main_branch(samples: list[Sample], by_id: dict[str, Call]) -> Sample | None:
    """The branch holding the conversation's final state: the latest-ending non-side branch."""
    main = [s for s in samples if s.branch_reason in (None, HISTORY_REWRITTEN)] or samples
    if not main:
        return None
    return max(main, key=lambda s: by_id[s.call_ids[-1]].index)


def ground_truth_text(value: Any) -> str:
    """veRL's `reward_model.ground_truth`: the text, or JSON text of anything else; "" for none."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def session_task(session: Session, prompt: str) -> Task:
    """The Task a session ran: from its metadata (the runner records it), else rebuilt from
    the session's task id and prompt."""
    recorded = session.metadata.get("task")
    if isinstance(recorded, dict):
        try:
            return Task.model_validate(recorded)
        except ValueError:
            pass
    return Task(id=session.task_id, prompt=prompt)


# -- the three exports -------------------------------------------------------------------


def left_out_because(result: RolloutResult | None) -> str | None:
    """Why a session is no training data, or None when it is: attempts the infrastructure
    broke and attempts a plugin broke were never scored; nothing is trained on them."""
    if result is None or result.is_scored:
        return None
    return "plugin errors" if result.is_plugin_failure else "infrastructure failures"


def _training_sessions(store: Store, run_id: str | None, left_out: Counter[str]
                       ) -> Iterator[tuple[Session | None, list[Call], RolloutResult | None]]:
    """(session, calls, result) of every session with calls that is training data, streamed."""
    for session_id, calls in iter_session_calls(store, run_id):
        result = store.get_result(session_id)
        why = left_out_because(result)
        if why is not None:
            left_out[why] += 1
            continue
        yield store.get_session(session_id), calls, result


def training_metrics(store: Store, run_id: str | None = None) -> tuple[RunMetrics, dict[str, int]]:
    """What the samples export writes, counted without writing it: the trajectory metrics of
    the sessions it keeps, and how many it leaves out, why (the report shows both)."""
    metrics, left_out = RunMetrics(), Counter[str]()
    for session, calls, _ in _training_sessions(store, run_id, left_out):
        reward = session_reward(store, session) if session else None
        metrics.add(build_samples(calls, session, reward).metrics)
    return metrics, dict(left_out)


def _write_samples(store: Store, writer: _BatchWriter, run_id: str | None,
                   images: _ImageFiles, left_out: Counter[str]) -> RunMetrics:
    metrics = RunMetrics()
    for session, calls, _ in _training_sessions(store, run_id, left_out):
        reward = session_reward(store, session) if session else None
        built = build_samples(calls, session, reward)
        metrics.add(built.metrics)
        del calls  # the samples are all that is needed from here on
        for sample in built.samples:
            images.add(sample.images)
            writer.add(sample_row(sample), len(sample.prompt_ids) + len(sample.response_ids))
    return metrics


def _write_verl(store: Store, writer: _BatchWriter, run_id: str | None,
                left_out: Counter[str]) -> None:
    index = 0
    for session in store.list_sessions(run_id):
        result = store.get_result(session.id)
        why = left_out_because(result)
        if why is not None:
            left_out[why] += 1
            continue
        prompt = session.metadata.get("prompt")
        prompt_images: list[dict[str, Any]] = []
        if not isinstance(prompt, str):
            first = store.first_call(session.id)
            prompt, hashes = _first_user_turn(first) if first else (None, [])
            if prompt is not None and hashes:
                prompt_images = [_inline_image(store, sha) for sha in hashes]
                prompt = IMAGE_MARKER * len(hashes) + prompt
        if prompt is None:
            left_out["sessions without a prompt"] += 1
            continue  # nothing was asked: no row to train on
        reward = session_reward(store, session)
        meta = session.metadata
        task = session_task(session, prompt)
        truth = task.data.get("ground_truth", meta.get("ground_truth"))
        writer.add({
            "data_source": meta.get("data_source") or task.environment or meta.get("environment")
            or "openforge",
            "prompt": [{"role": "user", "content": prompt}],
            "ability": meta.get("ability") or "agent",
            "reward_model": {"style": "rule", "ground_truth": ground_truth_text(truth)},
            "extra_info": {
                "index": index, "task_id": session.task_id, "rollout_id": session.rollout_id,
                "session_id": session.id, "run_id": session.run_id, "reward": reward,
                "passed": (result.reward.passed if result and result.reward else None),
                "status": result.status if result else None,
                "split": task.split, "task_json": task.model_dump_json(),
            },
            "agent_name": AGENT_NAME,
            "images": prompt_images,
        })
        index += 1


def _first_user_turn(call: Call) -> tuple[str | None, list[str]]:
    """The first user message's text and the hashes of its images (from `call.images`,
    which lists the request's images in order, so the first user message's come first)."""
    chat = _parse_request(call)
    if chat is None:
        return None, []
    if chat.raw_prompt is not None:
        return chat.raw_prompt, []
    before = 0  # images of tool results ahead of the first user message
    for message in chat.messages:
        if message.role == "user":
            n = len(message.images)
            return message.content, list(call.images[before:before + n])
        before += len(message.images)
    return None, []


def _inline_image(store: Store, sha: str) -> dict[str, Any]:
    image = store.get_image(sha)
    if image is None:
        raise ExportError(f"image {sha} is referenced by a call but not in the store")
    return {"bytes": image.data, "path": None}


def _write_sft(store: Store, writer: _BatchWriter, run_id: str | None,
               image_files: _ImageFiles, left_out: Counter[str]) -> None:
    for session, calls, result in _training_sessions(store, run_id, left_out):
        if session is None:
            continue
        reward = session_reward(store, session)
        if not _passed(result, reward):
            left_out["did not pass (SFT rows come from passing rollouts only)"] += 1
            continue
        samples = build_samples(calls, session, reward).samples
        by_id = {c.id: c for c in calls}
        main = _main_branch(samples, by_id)
        if main is None:
            continue
        conversation = final_conversation(by_id[main.call_ids[-1]])
        if conversation is None or not conversation.messages:
            continue
        # The final conversation is the last call's request plus its answer: the same images.
        images = list(by_id[main.call_ids[-1]].images)
        image_files.add(images)
        writer.add({
            "messages": [_message_row(m) for m in conversation.messages],
            "tools": json.dumps([t.to_renderer() for t in conversation.tools], ensure_ascii=False),
            "images": images, "session_id": session.id, "rollout_id": session.rollout_id,
            "task_id": session.task_id, "reward": reward, "num_turns": main.num_turns,
        })


def export_run(run_dir: Path, fmt: ExportFormat | str, out: Path, run_id: str | None = None) -> Path:
    """Export a run's recorded calls as parquet; returns the path of `out/data.parquet`
    (see `export` for the row count)."""
    return export(run_dir, fmt, out, run_id).path


def export(run_dir: Path, fmt: ExportFormat | str, out: Path,
           run_id: str | None = None) -> ExportResult:
    """Export a run's recorded calls as parquet into `out/data.parquet`.

    `run_dir` is a run directory holding `store.sqlite`, or a .sqlite store file. `run_id`
    limits the export to one run of a shared store. The file is written under a temporary
    name and renamed, so a crashed export never leaves a truncated `data.parquet`.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    store_path = resolve_store(Path(run_dir))
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; give a directory to write {DATA_FILE} into")
    out.mkdir(parents=True, exist_ok=True)
    target = out / DATA_FILE
    partial = out / f".{DATA_FILE}.partial"
    try:
        store = Store(store_path)
    except StoreError as exc:
        raise ExportError(str(exc)) from None
    try:
        writer = _BatchWriter(partial, SCHEMAS[fmt])
        image_files = _ImageFiles(store, out)
        left_out: Counter[str] = Counter()
        try:
            metrics = None
            if fmt == "samples":
                metrics = _write_samples(store, writer, run_id, image_files, left_out)
            elif fmt == "verl":
                _write_verl(store, writer, run_id, left_out)
            else:
                _write_sft(store, writer, run_id, image_files, left_out)
        finally:
            writer.close()
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        store.close()
    os.replace(partial, target)
    readme = _README[fmt] + f"\nRows: {writer.rows_written}. Source: `{store_path}`.\n"
    (out / "README.md").write_text(readme)
    metrics_file = out / "metrics.json"
    if metrics is not None:
        metrics_file.write_text(json.dumps(metrics.summary(), indent=2) + "\n")
    else:
        metrics_file.unlink(missing_ok=True)  # stale from an earlier samples export
    return ExportResult(path=target, rows=writer.rows_written, left_out=dict(left_out))


def iter_rows(path: Path, batch_size: int = 1024) -> Iterator[dict[str, Any]]:
    """Read an exported parquet file back row by row, a batch at a time."""
    parquet = pq.ParquetFile(path)
    for batch in parquet.iter_batches(batch_size=batch_size):
        yield from batch.to_pylist()
