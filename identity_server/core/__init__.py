"""The seam for the resolve hot loop: the per-mention work every request does.

A `Core` turns a mention's text into its display form and key, decides it against the name
index (rules 1-4 of SPEC section 2) and runs the typo table's probe loops. Everything around
it (checks, the lifecycle, the write queue, the store) is plain Python that calls it through
this interface only, so a compiled implementation can replace the reference without touching
the rest; a differential test holds every implementation to the reference's answers.

`IDENTITY_CORE` picks one for the process, as `RAPIDFUZZ_IMPLEMENTATION` does for rapidfuzz (the
server reads it with its other settings): `reference` (pure Python, the definition), `compiled`
(the Cython module; an error where it was not built), or `auto` (the default): `compiled` where the
install could build it, else `reference`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

from identity_server.errors import StartupError

if TYPE_CHECKING:
    from identity_server.domain import Mention
    from identity_server.matching import Decision, IndexView

ENVIRONMENT_VARIABLE = "IDENTITY_CORE"
CHOICES = ("auto", "reference", "compiled")


class Core(Protocol):
    """The per-mention hot loop."""

    name: str

    def normalize(self, text: str) -> tuple[str, str]:
        """The display form of text and its key (SPEC section 2's definitions)."""
        ...

    def decide(self, index: IndexView, mention: Mention) -> Decision:
        """Rules 1-4 for a parsed mention over the index; changes nothing."""
        ...

    def one_edit_apart(self, a: str, b: str) -> bool:
        """Whether keys a and b are one counting edit apart (SPEC section 2, rule 4)."""
        ...

    def variant_hashes(self, key: str, base: int, seed: int) -> list[int]:
        """The typo table's hash of key and of each string one deletion away from it."""
        ...

    def probe_shards(self, hashes: list[int], shards: list[Any], anchors: list[str],
                     found: set[str]) -> None:
        """Add to `found` the anchors the packed shards file under any of `hashes`."""
        ...

    def probe_overlay(self, hashes: list[int], overlay: dict[int, str | set[str]],
                      found: set[str]) -> None:
        """Add to `found` the anchors the overlay files under any of `hashes`."""
        ...


class CoreUnavailable(StartupError):
    """The core asked for by IDENTITY_CORE cannot run here."""


def load_core(choice: str | None = None) -> Core:
    """The core `choice` names (default: the IDENTITY_CORE environment variable)."""
    if choice is None:
        choice = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise CoreUnavailable(f"{ENVIRONMENT_VARIABLE}={choice!r}: expected one of "
                              f"{', '.join(CHOICES)}")
    from identity_server.core.reference import ReferenceCore
    if choice == "reference":
        return ReferenceCore()
    try:
        from identity_server.core.compiled import CompiledCore
    except ImportError as e:
        if choice == "compiled":
            raise CoreUnavailable(
                f"{ENVIRONMENT_VARIABLE}=compiled, but the compiled core was not built in this "
                f"install ({e}); reinstall with a C compiler and Python's headers, or unset "
                f"{ENVIRONMENT_VARIABLE}") from e
        return ReferenceCore()
    return CompiledCore()


_selected: Core | None = None


def selected() -> Core:
    """This process's core (the typo table and the service share one): the one `use` chose,
    else the one IDENTITY_CORE names, chosen on first use."""
    global _selected
    if _selected is None:
        _selected = load_core()
    return _selected


def use(choice: str) -> Core:
    """Make the core `choice` names this process's (the server does, from its settings)."""
    global _selected
    _selected = load_core(choice)
    return _selected


__all__ = ["CHOICES", "ENVIRONMENT_VARIABLE", "Core", "CoreUnavailable", "load_core", "selected", "use"]
