"""An LLM judge behind any OpenAI-compatible endpoint (`POST {base_url}/chat/completions`).

The one judge endpoint of the claw environment (`environment_options.judge_base_url`,
`judge_model`, `judge_api_key_env`), for both benchmarks: QwenClawBench's judged parts
are asked here (`ask`: one user message, temperature 0, the answer's text back); a
Claw-Eval grader asks the same endpoint through Claw-Eval's own `LLMJudge`, in the
grader's process (`claweval/grade_main.py`), with its own prompts.

The judge is reached directly, never through the gateway, so its calls are never
recorded as the policy's; a gateway session URL is refused. The key, when the endpoint
needs one, is read from the environment variable named by `api_key_env`.

A judge that cannot be reached or answers with an error raises `JudgeError` after
`retries` attempts: the rollout is then an infrastructure failure, never a 0.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import httpx
from openforge.errors import OpenforgeError
from pydantic import BaseModel, ConfigDict, Field, field_validator

_SESSION_URL = re.compile(r"/s/[^/]+/v1")


class JudgeError(OpenforgeError):
    """The judge could not be asked or its answer could not be read."""


class JudgeEndpoint(BaseModel):
    """Where the judge is: the claw environment's `judge_*` options (`ClawOptions.judge`)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str  # e.g. http://127.0.0.1:8000/v1
    model: str
    api_key_env: str | None = None
    timeout_s: float = Field(default=300.0, gt=0)
    max_tokens: int = Field(default=20480, ge=1)  # what QwenClawBench asks its judge for
    retries: int = Field(default=3, ge=1)

    @field_validator("base_url")
    @classmethod
    def _not_a_session(cls, value: str) -> str:
        if _SESSION_URL.search(value):
            raise ValueError("is a session URL of the gateway; judge calls must not become "
                             "training data, point it at the judge itself")
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value.rstrip("/")

    def ask(self, prompt: str) -> str:
        """The judge's answer to one user message."""
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise JudgeError(f"the judge's key variable {self.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": 0.0, "max_tokens": self.max_tokens}
        url = f"{self.base_url}/chat/completions"
        last = ""
        for attempt in range(self.retries):
            if attempt:
                time.sleep(min(2.0 ** attempt, 30.0))
            try:
                response = httpx.post(url, json=body, headers=headers, timeout=self.timeout_s)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 500 or response.status_code == 429:
                last = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:  # a request the judge will never accept
                raise JudgeError(f"the judge at {url} refused the request: HTTP "
                                 f"{response.status_code}: {response.text[:300]}")
            return _answer_text(response, url)
        raise JudgeError(f"the judge at {url} failed {self.retries} times; last: {last[:300]}")


def _answer_text(response: httpx.Response, url: str) -> str:
    try:
        data: Any = response.json()
        content = data["choices"][0]["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise JudgeError(f"the judge at {url} answered without a chat completion: "
                         f"{response.text[:300]}") from None
    return str(content or "")
