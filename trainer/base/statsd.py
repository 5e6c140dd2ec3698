"""statsd lines with DogStatsD tags: the one wire format of every metric of the project.

A line is ``<name>:<value>|<type>|#<key>:<value>,<key>:<value>``, e.g.::

    dtrain.train.loss:2.31|g|#dag_id:train_llama,run_id:manual__2026-05-01T09:30:00+00:00,task_id:train,map_index:-1,job:demo

statsd_exporter turns the tags into Prometheus labels (``dtrain_train_loss{run_id="manual__...", ...}``),
and so do Datadog's agent and Telegraf. DogStatsD's form rather than InfluxDB's (``name,k=v:value|g``),
because an Airflow run_id holds ':' and '+' (``manual__2026-05-01T09:30:00+00:00``): InfluxDB-style tags
sit in front of the first ':' of the line, where statsd_exporter (like every statsd server) splits the
name from the value, so such a run_id would break the line; after the first ':' a DogStatsD tag value
may hold ':' (a tag splits at its own first ':').

Both sides send through this module: the trainer (``trainer.report.metrics``) and the provider's
operators, sensors and triggers (``airflow_dtrain.metrics``). Standard library only.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping

RUN_TAGS: tuple[str, ...] = ("dag_id", "run_id", "task_id", "map_index", "job")
"""What every metric carries: the Airflow task instance that sent it (or whose group did) and the
job. The same keys on every line of a metric, so each metric has one label set."""
RANK_TAGS: tuple[str, ...] = ("node", "rank")
"""What a per-rank series carries besides RUN_TAGS: the node index and the global rank."""
UNKNOWN = "none"
"""The value of a tag the sender does not know (statsd_exporter drops a tag with an empty value,
which would give that line another label set)."""

TAG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TAGS_PATTERN = r"([A-Za-z_][A-Za-z0-9_]*:[^,|#\s]+(,[A-Za-z_][A-Za-z0-9_]*:[^,|#\s]+)*)?"
"""``key:value,key:value`` (or empty): what ``metrics.statsd_tags`` of the trainer's config holds."""
_UNSAFE = re.compile(r"[,|#\s]")


def tag_value(value: object) -> str:
    """A tag value that cannot break the line: ',', '|', '#' and whitespace become '_'; empty: ``UNKNOWN``."""
    text = _UNSAFE.sub("_", str(value)) if value is not None else ""
    return text or UNKNOWN


def format_tags(tags: Mapping[str, object]) -> str:
    """``{"dag_id": "d", "run_id": "r"}`` -> ``"dag_id:d,run_id:r"`` (in the mapping's order)."""
    for key in tags:
        if not TAG_KEY.fullmatch(key):
            raise ValueError(f"statsd tag key {key!r}: must be a letter or '_', then letters, digits or '_'")
    return ",".join(f"{key}:{tag_value(value)}" for key, value in tags.items())


def parse_tags(text: str) -> dict[str, str]:
    """The inverse of ``format_tags`` (a value keeps any ':' after its key's)."""
    return dict(item.split(":", 1) for item in text.split(",") if item) if text else {}


def line(name: str, value: float, kind: str, tags: Mapping[str, object] | None = None) -> str:
    """One statsd line: ``name:value|kind`` and, with tags, ``|#k:v,...``."""
    text = f"{name}:{value}|{kind}"
    return f"{text}|#{format_tags(tags)}" if tags else text


def parse_line(text: str) -> tuple[str, float, str, dict[str, str]]:
    """``(name, value, kind, tags)`` of a line ``line`` made (tests and tools read them back)."""
    name, rest = text.split(":", 1)
    parts = rest.split("|")
    tags = next((parse_tags(p[1:]) for p in parts[2:] if p.startswith("#")), {})
    return name, float(parts[0]), parts[1], tags


class Sender:
    """Fire-and-forget UDP: a metric must never stop what sends it."""

    def __init__(self, host: str, port: int):
        self.address = (host, port)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def send(self, name: str, value: float, kind: str, tags: Mapping[str, object] | None = None) -> None:
        try:
            self._sock.sendto(line(name, value, kind, tags).encode(), self.address)
        except OSError:
            pass  # no route, a name that does not resolve, a full buffer: the metric is lost, not the work

    def close(self) -> None:
        self._sock.close()
