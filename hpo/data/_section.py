"""The space file's ``data`` section, as validated (by :mod:`hpo.space`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DataSection", "DEFAULT_STAGE_TO", "study_folder_name"]

# The job's node-local folder on most SLURM sites; /tmp where it is not set.
DEFAULT_STAGE_TO = "${TMPDIR:-/tmp}"


@dataclass(frozen=True)
class DataSection:
    """What every node stages before its trials read it.

    ``items`` maps each name (what ``trial.data_path`` takes) to its source,
    an absolute path on the shared file system, resolved and checked where
    the space file was read. ``stage_to`` is the node-local folder the
    copies go under, its ``$VAR``/``${VAR:-fallback}`` references expanded
    on each node. ``keep`` leaves the copies there when the study ends.

    >>> section = DataSection({"digits": "/shared/digits"})
    >>> section.stage_to, section.keep, section.names
    ('${TMPDIR:-/tmp}', False, ('digits',))
    """

    items: dict[str, str] = field(default_factory=dict)
    stage_to: str = DEFAULT_STAGE_TO
    keep: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.items)

    def to_dict(self) -> dict[str, Any]:
        return {"stage_to": self.stage_to, "items": dict(self.items), "keep": self.keep}

    def describe(self) -> str:
        """One line for ``hpo validate``."""
        items = ", ".join(f"{name} <- {source}" for name, source in self.items.items())
        end = "kept at the end" if self.keep else "removed at the end"
        return f"{items}; staged to {self.stage_to} on each node, {end}"


def study_folder_name(study: str) -> str:
    """The folder of one study's copies under ``stage_to``: ``hpo-<study>``."""
    return f"hpo-{study}"
