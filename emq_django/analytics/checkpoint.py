"""Which bytes of which trace files have been processed (pure Python, no Spark).

The broker appends to the file of the current UTC hour, so a file is tracked by
the offset up to which it has been read, always cut after a complete line. A
plan lists, per file, the new byte range: a closed file read from its start is
handed to Spark as it is; any other range (the open hour's file, the rest of a
file read before) is copied into a staging file first, so that Spark never reads
past what the plan says.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emq_django.analytics.schema import TRACE_FILE_RE

log = logging.getLogger(__name__)

VERSION = 1
_TAIL_PROBE = 1 << 16


@dataclass(frozen=True)
class Source:
    """New bytes ``[start, end)`` of one trace file; ``end`` is after a newline."""

    path: Path
    start: int
    end: int
    closed: bool  # its hour is over: the broker no longer appends to it

    @property
    def whole(self) -> bool:
        """Spark may read the file itself: all of it is new and nothing follows."""
        return self.start == 0 and self.closed and self.end == self.path.stat().st_size


def file_hour(name: str) -> dt.datetime | None:
    """The UTC hour of ``trace-YYYYMMDD-HH.jsonl``, or None for other names."""
    m = TRACE_FILE_RE.match(name)
    if not m:
        return None
    return dt.datetime.strptime(m.group(1) + m.group(2), "%Y%m%d%H").replace(tzinfo=dt.UTC)


def complete_end(path: Path, size: int) -> int:
    """The offset just after the last newline in the first ``size`` bytes (0 if none)."""
    with path.open("rb") as f:
        pos = size
        while pos > 0:
            start = max(0, pos - _TAIL_PROBE)
            f.seek(start)
            chunk = f.read(pos - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                return start + i + 1
            pos = start
    return 0


@dataclass
class Checkpoint:
    path: Path
    offsets: dict[str, int] = field(default_factory=dict)
    batch: int = 0
    open_dir: str = ""  # events of the jobs still open, relative to the output
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        if not path.exists():
            return cls(path)
        doc = json.loads(path.read_text())
        if doc.get("version") != VERSION:
            raise ValueError(f"{path}: checkpoint version {doc.get('version')!r}, want {VERSION}")
        return cls(
            path,
            {k: int(v) for k, v in doc["files"].items()},
            int(doc["batch"]),
            doc.get("open_dir", ""),
            doc.get("extra", {}),
        )

    def save(self) -> None:
        doc = {
            "version": VERSION,
            "batch": self.batch,
            "open_dir": self.open_dir,
            "files": dict(sorted(self.offsets.items())),
            "extra": self.extra,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)  # atomic: a crash leaves the old or the new one

    def plan(
        self,
        trace_dir: Path,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        now: dt.datetime | None = None,
    ) -> list[Source]:
        """New byte ranges of the trace files whose hour overlaps [since, until)."""
        now = now or dt.datetime.now(dt.UTC)
        current_hour = now.replace(minute=0, second=0, microsecond=0)
        sources = []
        for path in sorted(trace_dir.glob("trace-*.jsonl")):
            hour = file_hour(path.name)
            if hour is None:
                continue
            if since is not None and hour + dt.timedelta(hours=1) <= since:
                continue
            if until is not None and hour >= until:
                continue
            start = self.offsets.get(path.name, 0)
            size = path.stat().st_size
            if size < start:
                log.warning(
                    "trace file %s shrank from %d to %d bytes; skipping it", path, start, size
                )
                continue
            end = complete_end(path, size) if size > start else start
            if end > start:
                sources.append(Source(path, start, end, closed=hour < current_hour))
        return sources

    def commit(self, sources: Iterable[Source]) -> None:
        for s in sources:
            self.offsets[s.path.name] = s.end


def stage(sources: Iterable[Source], directory: Path) -> list[Path]:
    """Paths for Spark to read: whole closed files as they are, other ranges copied
    into ``directory`` (one file each, renamed into place when complete)."""
    paths = []
    for i, s in enumerate(sources):
        if s.whole:
            paths.append(s.path)
            continue
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"{s.path.stem}.{s.start}-{s.end}.jsonl"
        tmp = directory / f".{target.name}.{i}.tmp"  # Spark skips names starting with "."
        with s.path.open("rb") as src, tmp.open("wb") as dst:
            src.seek(s.start)
            remaining = s.end - s.start
            while remaining > 0:
                chunk = src.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                dst.write(chunk)
                remaining -= len(chunk)
        os.replace(tmp, target)
        paths.append(target)
    return paths


def stage_all(sources: Iterable[Source], directory: Path) -> list[Path]:
    """Like ``stage`` but every range lands in ``directory`` (hard links for whole
    files when possible): the input directory of the streaming query."""
    paths = []
    rest = []
    for s in sources:
        if not s.whole:
            rest.append(s)
            continue
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"{s.path.stem}.0-{s.end}.jsonl"
        tmp = directory / f".{target.name}.tmp"
        try:
            os.link(s.path, tmp)
        except OSError:
            shutil.copyfile(s.path, tmp)
        os.replace(tmp, target)
        paths.append(target)
    return paths + stage(rest, directory)
