"""Read run directories written by caravanserai 0.2.0 and 0.1.x (no journal) as journal events.

0.2.0 wrote ``state.json`` then ``waypoint-N.md`` then ``latest``, without fsync, so a killed
run can hold a ``state.json`` one checkpoint ahead of ``latest``. When the orphan
``waypoint-(N+1).md`` is there too, it is the note that belongs to that state and becomes
waypoint N+1; otherwise, as 0.2.0 did, the state resumes with waypoint N. Reading is
deterministic (no clocks): the same directory always gives the same events. Waypoint files
left out that way are listed in ``run_started.skipped_waypoints``, so the local store does not
take them for views ahead of the journal. A ``state.json`` that is not JSON raises
``JournalCorruptionError`` (nothing is changed).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...errors import JournalCorruptionError
from ...journal import RawJSON

WAYPOINT_FILE = re.compile(r"waypoint-(\d+)\.md")
HEADER = re.compile(r"# Waypoint (\d+) (?:-|\u2014) (\S+)")
EPOCH = "1970-01-01T00:00:00.000000+00:00"


def is_legacy_dir(run_dir: Path) -> bool:
    return (run_dir / "latest").is_file() or (run_dir / "state.json").is_file()


def read_legacy_run(run_dir: Path, run_id: str) -> list[dict[str, Any]]:
    """Events equivalent to a 0.2.0/0.1.x run directory (``[]`` if it holds no checkpoint)."""
    if not is_legacy_dir(run_dir):
        return []
    notes = _read_waypoints(run_dir)
    latest = _read_latest(run_dir)
    if latest is None:
        latest = max(notes, default=0)
    state_path = run_dir / "state.json"
    has_state = state_path.is_file()
    state = _read_state(state_path, run_id) if has_state else None
    last = latest + 1 if (latest + 1) in notes and has_state else latest
    command = _read_command(run_dir)
    dash = next((note[2] for note in notes.values() if note[2]), "-")
    started_at = min((note[1] for note in notes.values()), default=EPOCH)
    events: list[dict[str, Any]] = [
        {
            "type": "run_started",
            "at": started_at,
            "run_id": run_id,
            "imported_from": "caravanserai 0.1.x" if dash == "\u2014" else "caravanserai 0.2.0",
            "command": command,
        }
    ]
    skipped = sorted(n for n in notes if n > last)
    if skipped:
        events[0]["skipped_waypoints"] = skipped
    for n in sorted(k for k in notes if k <= last):
        note, at, _ = notes[n]
        event: dict[str, Any] = {"type": "waypoint", "at": at, "n": n, "note": note, "imported": True}
        if n == last and has_state:
            event["state"] = _verbatim(state)
        events.append(event)
    if last not in notes and last > 0:
        # state.json and `latest` without the matching note file: keep the state, say so.
        events.append({"type": "waypoint", "at": started_at, "n": last, "imported": True,
                       "note": f"(waypoint-{last}.md is missing)", "state": _verbatim(state)})
    return events


def _read_state(path: Path, run_id: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        reason = " ".join(str(exc).split())[:200]
        raise JournalCorruptionError(
            f"run {run_id!r}: {str(path)!r} is not valid JSON ({reason}); restore it from a backup or move the run "
            "directory aside; nothing was changed",
            run_id=run_id, path=str(path),
        ) from None


def _verbatim(state: Any) -> RawJSON:
    # 0.2.0 wrote NaN/Infinity as bare tokens; keep them as written so they read back the same.
    return RawJSON(json.dumps(state, ensure_ascii=False, separators=(",", ":")), state)


def _read_latest(run_dir: Path) -> int | None:
    try:
        return int((run_dir / "latest").read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def _read_command(run_dir: Path) -> list[str] | None:
    try:
        meta = json.loads((run_dir / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    command = meta.get("command") if isinstance(meta, dict) else None
    return command if isinstance(command, list) else None


def _read_waypoints(run_dir: Path) -> dict[int, tuple[str, str, str]]:
    """waypoint number -> (note, at, dash) for every readable waypoint file."""
    found: dict[int, tuple[str, str, str]] = {}
    for path in run_dir.iterdir():
        match = WAYPOINT_FILE.fullmatch(path.name)
        if not match:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        header, _, body = text.partition("\n\n")
        head = HEADER.match(header)
        at, dash = EPOCH, ""
        if head:
            dash = "\u2014" if "\u2014" in header else "-"
            at = _normalise_time(head.group(2))
        note = body[:-1] if body.endswith("\n") else body
        found[int(match.group(1))] = (note, at, dash)
    return found


def _normalise_time(stamp: str) -> str:
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return EPOCH
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")
