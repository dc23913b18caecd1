"""The ``hpo submit`` and ``hpo jobs`` commands (registered by ``hpo.cli``)."""

from __future__ import annotations


def add_commands(command) -> None:
    """Register this package's subcommands through ``command(name, help=...)``."""
