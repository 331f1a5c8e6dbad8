"""The registry through which core and plugins add ``taskq`` subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Command", "CommandRegistry"]

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """One ``taskq`` subcommand."""

    name: str
    help: str
    configure: Configure
    run: Run
    distribution: str


class CommandRegistry:
    """Collects subcommands from the ``taskq_cli_commands`` hook.

    A name registered twice is refused with both distributions named, so a
    plugin cannot silently replace a core command.
    """

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}
        self._current_distribution = "taskq-core"

    def _set_distribution(self, distribution: str) -> None:
        self._current_distribution = distribution

    def add(self, name: str, *, help: str, configure: Configure, run: Run) -> None:
        """Register subcommand ``name``; ``run`` returns the process exit code."""
        if name in self._commands:
            other = self._commands[name].distribution
            raise ValueError(
                f"taskq subcommand {name!r} is registered by both {other} and "
                f"{self._current_distribution}"
            )
        self._commands[name] = Command(name, help, configure, run, self._current_distribution)

    def commands(self) -> list[Command]:
        """Registered commands, sorted by name."""
        return sorted(self._commands.values(), key=lambda c: c.name)
