"""The `rest` mock service: a small REST API over whatever collections the task seeds.

When the seed holds an `api_key` (a string, not a collection), every request must carry
it in the `X-API-Key` header, else 401: tasks use this to test that the agent reads the
credentials it was given. `POST /<collection>/<id>/<verb>` on a record sets its `status`
to the verb's past form for the verbs `approve`, `cancel`, `ship` (e.g. orders).
"""

from __future__ import annotations

from typing import Any

from openforge_claw.services.base import MockService, ServiceError

_VERBS = {"approve": "approved", "cancel": "cancelled", "ship": "shipped"}


class RestService(MockService):
    name = "rest"

    def action(self, method: str, parts: list[str], query: dict[str, str], body: Any,
               headers: dict[str, str]) -> Any:
        key = self.state.get("api_key")
        if isinstance(key, str) and headers.get("x-api-key") != key:
            raise ServiceError(401, "missing or wrong X-API-Key header")
        if method == "POST" and len(parts) == 3 and parts[2] in _VERBS:
            record = self.find(self.collection(parts[0]), parts[1])
            record["status"] = _VERBS[parts[2]]
            return record
        return None
