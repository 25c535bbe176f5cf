"""The revisioned routing table: what the routing source holds and every replica caches.

Like an etcd key space, the table has one revision that grows by one with every change,
and each model's entry remembers the revision at which it last changed. The table's
revision tells a replica whether it is up to date (and lets it resume a watch where it
left off); a model's revision is what a compare-and-swap write names in ``If-Match``, so
two writers of different models never conflict and two writers of one model never lose
each other's change silently.
"""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from contracts.atomic_files import write_json_atomically
from serving.routing import ModelRouting, RoutingConfig


class RevisionConflict(Exception):
    """A write named a model revision that is no longer the model's current one."""

    def __init__(self, model: str, expected: int, current: int) -> None:
        super().__init__(
            f"routing of {model!r} is at revision {current}, not {expected}: it changed since "
            "it was read; read it again and retry"
        )
        self.current = current


class RoutingTableError(ValueError):
    """A stored or received routing table is unreadable or invalid."""


class RoutingEntry(BaseModel):
    """One model's routing and the table revision at which it last changed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    revision: int = Field(ge=1)
    routing: ModelRouting


class RoutingTable(BaseModel):
    """Every model's routing at one revision (0: nothing was ever written)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    revision: int = Field(default=0, ge=0)
    models: dict[str, RoutingEntry] = {}

    def model_revision(self, model: str) -> int:
        """The revision ``If-Match`` must name to change ``model`` (0 when it has no entry)."""
        entry = self.models.get(model)
        return 0 if entry is None else entry.revision

    def config(self) -> RoutingConfig:
        """The routing config this table puts in force."""
        return RoutingConfig(models={name: entry.routing for name, entry in self.models.items()})

    def with_model(
        self, model: str, routing: ModelRouting | None, *, if_match: int | None = None
    ) -> RoutingTable:
        """This table with ``model`` set (or removed, for None) at the next revision.

        ``if_match`` makes the write conditional on the model's revision. Writing what is
        already there returns the table unchanged, so a retried write does not move the
        revision every replica has to catch up with.
        """
        current = self.model_revision(model)
        if if_match is not None and if_match != current:
            raise RevisionConflict(model, if_match, current)
        existing = self.models.get(model)
        if (existing.routing if existing is not None else None) == routing:
            return self
        revision = self.revision + 1
        models = {name: entry for name, entry in self.models.items() if name != model}
        if routing is not None:
            models[model] = RoutingEntry(revision=revision, routing=routing)
        return RoutingTable(revision=revision, models=models)

    def to_json(self) -> dict:
        return self.model_dump(mode="json", exclude_none=True)


def parse_table(data: object, *, source: str) -> RoutingTable:
    """Validate a table received or read from ``source``; errors name the source."""
    try:
        return RoutingTable.model_validate(data)
    except pydantic.ValidationError as exc:
        raise RoutingTableError(f"{source}: invalid routing table: {exc}") from None


def load_table(path: Path) -> RoutingTable:
    """Read a table written by ``write_table``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RoutingTableError(f"{path}: cannot read the routing table: {exc}") from None
    return parse_table(data, source=str(path))


def write_table(path: Path, table: RoutingTable) -> None:
    """Replace the file atomically: after a crash it holds the old table or the new one."""
    write_json_atomically(path, table.to_json(), sort_keys=True)
