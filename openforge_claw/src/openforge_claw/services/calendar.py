"""The `calendar` mock service: events with a double-booking guard.

State: `events` (`{id, title, date: YYYY-MM-DD, start: HH:MM, end: HH:MM, attendees}`).
`POST /events` answers 409 with the clashing event when the new one overlaps another on
the same date, so an agent has to notice and recover (pick another slot).
`GET /free?date=D` lists the busy intervals of a day.
"""

from __future__ import annotations

from typing import Any

from openforge_claw.services.base import MockService, ServiceError


def _overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a.get("date") == b.get("date") and str(a.get("start")) < str(b.get("end"))
            and str(b.get("start")) < str(a.get("end")))


class CalendarService(MockService):
    name = "calendar"
    default_state: dict[str, list[dict[str, Any]]] = {"events": []}

    def action(self, method: str, parts: list[str], query: dict[str, str], body: Any,
               headers: dict[str, str]) -> Any:
        if method == "POST" and parts == ["events"]:
            event = self._body_object(body)
            for field in ("title", "date", "start", "end"):
                if not event.get(field):
                    raise ServiceError(400, f"an event needs `{field}`")
            events = self.collection("events")
            clash = next((e for e in events if _overlaps(e, event)), None)
            if clash is not None:
                raise ServiceError(409, f"overlaps event {clash['id']} {clash.get('title')!r} "
                                        f"{clash.get('start')}-{clash.get('end')}")
            record = {**event, "id": event.get("id", self.new_id(events))}
            events.append(record)
            return record
        if method == "GET" and parts == ["free"]:
            date = query.get("date", "")
            busy = sorted((e["start"], e["end"]) for e in self.collection("events")
                          if e.get("date") == date)
            return {"date": date, "busy": [{"start": s, "end": e} for s, e in busy]}
        return None
