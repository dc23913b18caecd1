"""Where a trial finds its data: the node's copies, or the sources themselves."""

from __future__ import annotations

import abc
import os
import weakref
from collections.abc import Mapping
from pathlib import Path

from hpo.data._copies import Lease
from hpo.data._section import DataSection
from hpo.data._stage import node_folder, stage

__all__ = ["DataPaths", "SourcePaths", "StagedData"]


class DataPaths(abc.ABC):
    """The data items a trial may ask for, by name."""

    @property
    @abc.abstractmethod
    def names(self) -> tuple[str, ...]:
        """The known names."""

    @abc.abstractmethod
    def path(self, name: str) -> Path:
        """The path of item ``name`` (a known one) as this trial reads it."""


class SourcePaths(DataPaths):
    """The sources themselves, unchanged: a Trial built by hand, to try an
    objective without a study.

    >>> SourcePaths({"digits": "/data/digits.npz"}).path("digits")
    PosixPath('/data/digits.npz')
    """

    def __init__(self, items: Mapping[str, str | os.PathLike[str]]) -> None:
        self._items = {name: Path(source) for name, source in items.items()}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def path(self, name: str) -> Path:
        return self._items[name]


class StagedData(DataPaths):
    """The study's items as copies on this node, each made by the first
    trial of the node that asks for it (see :func:`hpo.data.stage`).

    One per trial: the copies it hands out stay on the node, whatever is
    staged meanwhile, until :meth:`release` (called when it is collected,
    or when the process ends, at the latest)."""

    def __init__(self, section: DataSection, study: str) -> None:
        self.section, self.study = section, study
        self._leases: list[Lease] = []
        self._release = weakref.finalize(self, _release, self._leases)

    def release(self) -> None:
        """Let the copies go: one that is no longer current is removed once no trial reads it."""
        self._release()

    @property
    def names(self) -> tuple[str, ...]:
        return self.section.names

    def path(self, name: str) -> Path:
        folder = node_folder(self.section.stage_to, self.study)  # expanded here, on the node
        return stage(name, self.section.items[name], folder, self._leases)


def _release(leases: list[Lease]) -> None:
    while leases:
        leases.pop().release()
