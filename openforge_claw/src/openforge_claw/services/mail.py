"""The `mail` mock service: an inbox, sent mail, and a `POST /send` action.

State: `inbox` (received messages `{id, from, to, subject, body, read}`), `sent` (what the
agent sent), `contacts`. Actions: `POST /send {to, subject, body}` appends to `sent`
(400 when `to` or `subject` is missing); `POST /inbox/<id>/read` marks a message read.
"""

from __future__ import annotations

from typing import Any

from openforge_claw.services.base import MockService, ServiceError


class MailService(MockService):
    name = "mail"
    default_state: dict[str, list[dict[str, Any]]] = {"inbox": [], "sent": [], "contacts": []}

    def action(self, method: str, parts: list[str], query: dict[str, str], body: Any,
               headers: dict[str, str]) -> Any:
        if method == "POST" and parts == ["send"]:
            msg = self._body_object(body)
            to = msg.get("to")
            if not to or not msg.get("subject"):
                raise ServiceError(400, "send needs `to` and `subject` (and usually `body`)")
            recipients = to if isinstance(to, list) else [to]
            sent = self.collection("sent")
            record = {"id": self.new_id(sent), "to": recipients, "subject": msg["subject"],
                      "body": msg.get("body", "")}
            sent.append(record)
            return record
        if method == "POST" and len(parts) == 3 and parts[0] == "inbox" and parts[2] == "read":
            record = self.find(self.collection("inbox"), parts[1])
            record["read"] = True
            return record
        return None
