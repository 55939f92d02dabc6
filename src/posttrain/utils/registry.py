"""String-keyed registries with decorator registration and helpful lookup errors."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """Lookup of a name that is not registered; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would show the repr of the message
        return str(self.args[0])


class Registry(Generic[T]):
    """`reg = Registry("policy loss")`; `@reg.register("ppo", aliases=("grpo",))`; `reg.get("ppo")`."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._items or key in self._aliases:
                    raise ValueError(f"{self.kind} {key!r} is already registered")
            self._items[name] = obj
            for a in aliases:
                self._aliases[a] = name
            return obj

        return deco

    def canonical(self, name: str) -> str:
        if name in self._items:
            return name
        if name in self._aliases:
            return self._aliases[name]
        choices = self.names(include_aliases=True)
        close = difflib.get_close_matches(name, choices, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownNameError(f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(choices)}")

    def get(self, name: str) -> T:
        return self._items[self.canonical(name)]

    def names(self, *, include_aliases: bool = False) -> list[str]:
        names = list(self._items)
        if include_aliases:
            names += list(self._aliases)
        return sorted(names)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
