"""String-keyed registries with decorator registration, plug-ins by import path, and helpful errors.

Every extension point of posttrain (policy losses, advantages, samplers, controllers, replay buffers,
group shapers, engines, episode runners, reward sources, tasks, rewards) is a :class:`Registry`.
A name is either a registered key (``"ppo"``) or an import path ``"package.module:Name"``: the
module is imported (so its ``@register...`` decorators run) and ``Name`` is taken from it, then
checked to be of the registry's kind. One code path serves all registries::

    LOSSES = Registry("policy loss")
    @LOSSES.register("ppo", aliases=("grpo",))
    def ppo(...): ...
    LOSSES.get("ppo"); LOSSES.get("my_lab.losses:my_loss")

A registry's ``accept(adapt, expected)`` sets how an imported object becomes an entry: ``adapt(obj)``
returns the entry, or None when ``obj`` is not of the kind (then the error quotes ``expected``).

**Lazy registration.** ``reg.register_lazy("hf", "posttrain.rollout.hf:hf_engine")``
lists a name whose code lives in an optional dependency without importing it: the
name shows in ``names()``, ``in`` and the did-you-mean hints, and the first ``get`` imports the module
(whose ``@register`` decorator may register the name itself) and takes the attribute. Entry points
(below) are read as lazy entries.

**Entry points.** A registry built with ``group="posttrain.samplers"`` also lists the
``importlib.metadata`` entry points of that group (read once, on first use), each as a lazy entry: an
installed package adds a method without editing posttrain::

    [project.entry-points."posttrain.samplers"]
    my-sampler = "my_lab.sampling:MySampler"
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from posttrain.utils.errors import InvalidValueError, PosttrainError

T = TypeVar("T")


class UnknownNameError(PosttrainError, KeyError, ValueError):
    """Lookup of a name that is not registered; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would show the repr of the message
        return str(self.args[0])


class PluginError(PosttrainError, ValueError):
    """A ``package.module:Name`` that cannot be imported, has no such attribute, or is the wrong kind."""


def is_import_path(name: str) -> bool:
    """True for ``"package.module:Name"`` (a plug-in), False for a registered key."""
    return isinstance(name, str) and ":" in name


def import_object(spec: str, kind: str = "object") -> Any:
    """Import ``"package.module:Name"`` (``Name`` may be dotted: ``Class.attr``) and return the object.

    Errors name the spec and the kind it was meant to be, e.g. ``policy loss 'my_losses:foo': module
    'my_losses' has no attribute 'foo'``."""
    module_name, _, attr = spec.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or not attr:
        raise PluginError(f"{kind} {spec!r}: expected 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PluginError(
            f"{kind} {spec!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}); "
            "is it installed or on PYTHONPATH?"
        ) from None
    except Exception as e:  # report any error raised while the plug-in module runs
        raise PluginError(
            f"{kind} {spec!r}: importing module {module_name!r} raised {type(e).__name__}: {e}"
        ) from None
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            where = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PluginError(f"{kind} {spec!r}: {where!r} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj


_INSTANCES: weakref.WeakSet[Registry[Any]] = weakref.WeakSet()


def all_registries() -> list[Registry[Any]]:
    """Every registry created so far (the tests' snapshot fixture restores them all)."""
    return list(_INSTANCES)


class Registry(Generic[T]):
    """`reg = Registry("policy loss")`; `@reg.register("ppo", aliases=("grpo",))`; `reg.get("ppo")`;
    `reg.get("my_pkg.mod:Name")` imports a plug-in."""

    def __init__(self, kind: str, *, group: str | None = None) -> None:
        self.kind = kind
        self.group = group  # importlib.metadata entry-point group read on first use (None: none)
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:attr", imported on first get
        self._lazy_aliases: dict[str, str] = {}
        self._plugins: dict[str, T] = {}
        self._entry_points_read = group is None
        _INSTANCES.add(self)
        self._adapt: Callable[[Any], T | None] = lambda obj: obj
        self._expected = "an object of this kind"

    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        for key in (name, *aliases):
            if is_import_path(key):
                raise InvalidValueError(
                    f"{self.kind} name {key!r} must not contain ':' (reserved for import paths)"
                )

        def deco(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._items or key in self._aliases:
                    raise InvalidValueError(f"{self.kind} {key!r} is already registered")
            self._items[name] = obj
            self._lazy.pop(name, None)  # a lazy entry whose module registers it on import
            for a in aliases:
                self._aliases[a] = name
                self._lazy_aliases.pop(a, None)
                self._lazy.pop(a, None)  # an alias also declared as its own entry point
            return obj

        return deco

    def register_lazy(self, name: str, target: str, *, aliases: tuple[str, ...] = ()) -> None:
        """List ``name`` now, import ``target`` (``"package.module:attr"``) on its first ``get``.

        The import may register ``name`` itself (a ``@register(name)`` decorator in that module);
        otherwise the attribute, adapted like a plug-in, becomes the entry."""
        if not is_import_path(target):
            raise InvalidValueError(
                f"{self.kind} {name!r}: lazy target {target!r} must be 'package.module:attr'"
            )
        for key in (name, *aliases):
            if is_import_path(key):
                raise InvalidValueError(
                    f"{self.kind} name {key!r} must not contain ':' (reserved for import paths)"
                )
            if key in self._items or key in self._aliases or key in self._lazy or key in self._lazy_aliases:
                raise InvalidValueError(f"{self.kind} {key!r} is already registered")
        self._lazy[name] = target
        for a in aliases:
            self._lazy_aliases[a] = name

    def _read_entry_points(self) -> None:
        if self._entry_points_read:
            return
        self._entry_points_read = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.group or ""):
            if ep.name in self:  # a built-in name wins; the installed plug-in stays reachable by path
                continue
            self.register_lazy(ep.name, ep.value)

    def reload_entry_points(self) -> None:
        """Read the entry-point group again (after installing a package in a running process)."""
        self._entry_points_read = self.group is None
        self._read_entry_points()

    def _resolve_lazy(self, name: str) -> None:
        """Import a lazy entry: its module may register it; else adapt the attribute."""
        target = self._lazy[name]
        obj = import_object(target, self.kind)
        if name in self._items:  # the module's decorator registered it
            return
        entry = self._adapt(obj)
        if entry is None:
            what = type(obj).__name__ if not isinstance(obj, type) else f"class {obj.__name__}"
            raise PluginError(f"{self.kind} {name!r} ({target}) is a {what}; expected {self._expected}")
        aliases = [a for a, n in self._lazy_aliases.items() if n == name]
        del self._lazy[name]
        for a in aliases:
            del self._lazy_aliases[a]
        self.register(name, aliases=tuple(aliases))(entry)

    def accept(self, adapt: Callable[[Any], T | None], expected: str) -> None:
        """How an imported plug-in object becomes an entry: ``adapt(obj)`` -> entry, or None when
        ``obj`` is not of this registry's kind (the error then says "expected <expected>")."""
        self._adapt = adapt
        self._expected = expected
        self._plugins.clear()

    def canonical(self, name: str) -> str:
        if is_import_path(name):
            self.get(name)  # raises when the plug-in is unusable
            return name
        self._read_entry_points()
        if name in self._lazy_aliases:
            name = self._lazy_aliases[name]
        if name in self._lazy:
            self._resolve_lazy(name)
        if name in self._items:
            return name
        if name in self._aliases:
            return self._aliases[name]
        choices = self.names(include_aliases=True)
        close = difflib.get_close_matches(str(name), choices, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownNameError(
            f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(choices)} "
            "(or 'package.module:Name' for a plug-in)"
        )

    def get(self, name: str) -> T:
        if is_import_path(name):
            return self._plugin(name)
        return self._items[self.canonical(name)]

    def _plugin(self, spec: str) -> T:
        if spec not in self._plugins:
            obj = import_object(spec, self.kind)
            entry = self._adapt(obj)
            if entry is None:
                what = type(obj).__name__ if not isinstance(obj, type) else f"class {obj.__name__}"
                raise PluginError(f"{self.kind} {spec!r} is a {what}; expected {self._expected}")
            self._plugins[spec] = entry
        return self._plugins[spec]

    def check(self, name: str) -> str:
        """Validate a configured name (registered key, alias or usable import path); return it.
        Raises ValueError with the accepted names (or the plug-in problem)."""
        if is_import_path(name):
            self.get(name)
            return name
        if name in self:
            return name
        accepted = self.names(include_aliases=True)
        close = difflib.get_close_matches(str(name), accepted, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise InvalidValueError(
            f"unknown value {name!r}{hint}; accepted: {', '.join(accepted)}, or 'package.module:Name'"
        )

    def entries(self) -> Iterable[T]:
        """Registered entries (without plug-ins and without lazy entries not imported yet)."""
        return self._items.values()

    def is_lazy(self, name: str) -> bool:
        """True while ``name`` is listed lazily and its module has not been imported."""
        self._read_entry_points()
        return name in self._lazy or name in self._lazy_aliases

    def names(self, *, include_aliases: bool = False) -> list[str]:
        self._read_entry_points()
        names = list(self._items) + list(self._lazy)
        if include_aliases:
            names += list(self._aliases) + list(self._lazy_aliases)
        return sorted(names)

    def snapshot(self) -> tuple[dict[str, Any], ...]:
        """The registry's state, for :meth:`restore` (tests: registrations made by one test do not leak).
        The entry points are read first, so a restore never forgets the installed plug-ins' names."""
        self._read_entry_points()
        return (
            dict(self._items),
            dict(self._aliases),
            dict(self._lazy),
            dict(self._lazy_aliases),
            dict(self._plugins),
        )

    def restore(self, state: tuple[dict[str, Any], ...]) -> None:
        """Put back a :meth:`snapshot`: names registered since are gone; lazy names and plug-in paths
        resolved since stay resolved (their modules were imported and will not register again)."""
        items, aliases, lazy, lazy_aliases, _plugins = (dict(d) for d in state)
        resolved = {k: v for k, v in self._items.items() if k in lazy}  # lazily imported meanwhile
        resolved_aliases = {a: n for a, n in self._aliases.items() if n in resolved}
        # resolved plug-in paths stay cached: their modules are imported for good and do not register
        # again, so a later lookup of the same path must still find the entry
        self._items, self._aliases = items, aliases
        self._items.update(resolved)
        self._aliases.update(resolved_aliases)
        self._lazy = {k: v for k, v in lazy.items() if k not in resolved}
        self._lazy_aliases = {a: n for a, n in lazy_aliases.items() if n not in resolved}

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self._read_entry_points()
        return (
            name in self._items or name in self._aliases or name in self._lazy or name in self._lazy_aliases
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


# ------------------------------------------------------------------------------------- adapters
def subclass_of(base: type) -> Callable[[Any], Any]:
    """Adapter for registries of classes: accept a subclass of ``base``."""

    def adapt(obj: Any) -> Any:
        return obj if isinstance(obj, type) and issubclass(obj, base) else None

    return adapt


def any_callable(obj: Any) -> Any:
    """Adapter for registries of factories: accept any callable."""
    return obj if callable(obj) else None


# ------------------------------------------------------------------------------ parameter checks
def check_params(
    kind: str,
    name: str,
    target: Callable[..., Any],
    params: Mapping[str, Any],
    *,
    skip_positional: int = 0,
    reserved: tuple[str, ...] = (),
) -> None:
    """Check configured keyword ``params`` against ``target``'s signature (a class: its constructor).

    ``skip_positional``: leading positional parameters the caller supplies (e.g. a factory's context);
    ``reserved``: keyword parameters the caller supplies (e.g. a sampler's ``seed``), which the config
    must not set. Raises ValueError naming unknown / missing parameters and listing the accepted ones.
    """
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    ps = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL,)]
    positional = [p for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    skipped = {p.name for p in positional[:skip_positional]}
    named = [
        p
        for p in ps
        if p.name not in skipped
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in reserved
    ]
    accepted = [p.name for p in named]
    acc = ", ".join(accepted) or "(none)"
    bad_reserved = [k for k in params if k in reserved]
    if bad_reserved:
        raise InvalidValueError(
            f"{kind} {name!r}: parameter(s) {', '.join(map(repr, bad_reserved))} are set by the trainer, "
            f"not the config; accepted: {acc}"
        )
    if not any(p.kind == p.VAR_KEYWORD for p in ps):
        unknown = [k for k in params if k not in accepted]
        if unknown:
            parts = []
            for k in unknown:
                close = difflib.get_close_matches(k, accepted, n=1)
                parts.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise InvalidValueError(
                f"{kind} {name!r}: unknown parameter(s) {', '.join(parts)}; accepted: {acc}"
            )
    missing = [p.name for p in named if p.default is p.empty and p.name not in params]
    if missing:
        raise InvalidValueError(
            f"{kind} {name!r}: missing required parameter(s) {', '.join(map(repr, missing))}; accepted: {acc}"
        )
