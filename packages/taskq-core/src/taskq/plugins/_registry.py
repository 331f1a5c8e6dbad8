"""Plugin discovery: one pluggy manager per process, fed from entry points.

We loop over ``entry_points(group="taskq")`` ourselves instead of calling
``pm.load_setuptools_entrypoints``: that helper stops at the first plugin
that fails to import, and one broken third-party package must not take the
rest of TaskQ down with it. Failures are recorded and reported by name.

Hooks are called the same way: each implementation on its own
(:func:`call_each`, :func:`first_answer`), so one that raises, or answers
with something the hook does not take, is left out, recorded beside the load
failures (:func:`plugin_failures`, ``taskq plugins``) and logged in one line
once per process, while the other plugins' answers still count.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import os
import re
import reprlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pluggy
import structlog
from pydantic import TypeAdapter, ValidationError

from taskq._dsn import redact, url_scheme
from taskq.errors import (
    ConfigurationError,
    IncompatiblePluginError,
    PluginError,
    PluginHookError,
    PluginLoadError,
    TaskQError,
    UnknownBackendError,
)
from taskq.plugins import hookspecs

if TYPE_CHECKING:
    from taskq.backend import Backend
    from taskq.plugins.hookspecs import BackendFactory

__all__ = [
    "HookAnswer",
    "PluginFailure",
    "PluginInfo",
    "backend_factories",
    "call_each",
    "first_answer",
    "get_plugin_manager",
    "loaded_plugins",
    "open_backend",
    "plugin_failures",
    "plugin_trace_requested",
    "report_bad_answer",
    "report_command_failure",
]

_log = structlog.get_logger("taskq.plugins")

ENTRY_POINT_GROUP = "taskq"
TRACE_PLUGINS_ENV: Final = "TASKQ_TRACE_PLUGINS"
"""Set true to log each hook call and its end at debug (default false)."""
CORE_DISTRIBUTION = "taskq-core"

_CORE_BUG = (
    f"a bug in {CORE_DISTRIBUTION}: report it with the traceback the command logs with "
    f"TASKQ_LOG_LEVEL=debug"
)

# Which first-party distribution adds a scheme, for the "unknown scheme" hint; it also
# owns the scheme: a third party claiming it too is left out (backend_factories).
_SCHEME_PROVIDERS: dict[str, str] = {
    "memory": "taskq-core",
    "postgresql": "taskq-postgres",
    "postgres": "taskq-postgres",
}


@dataclass(frozen=True)
class PluginInfo:
    """A registered plugin: its entry-point name and the distribution that ships it."""

    name: str
    distribution: str
    version: str | None


PluginFailure = PluginLoadError | PluginHookError
"""What :func:`plugin_failures` lists: a plugin that did not load, or a hook of a
loaded one that failed."""


@dataclass(frozen=True)
class HookAnswer:
    """One implementation's answer to a hook: the plugin (its entry point name), the
    distribution that ships it, and what it returned."""

    plugin: str
    distribution: str
    result: Any


@dataclass
class _Loaded:
    pm: pluggy.PluginManager
    plugins: list[PluginInfo] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)
    # pluggy plugin name -> distribution, to attribute hook results
    dist_of: dict[str, str] = field(default_factory=dict)
    # (plugin, hook, topic) of the hook failures recorded: each is recorded (and
    # logged) once per process, however often the hook is called.
    recorded: set[tuple[str, str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # TASKQ_TRACE_PLUGINS: each hook call and its end logged at debug
    trace: bool = False


_BOOL: Final = TypeAdapter(bool)
"""The settings' boolean (pydantic's), for the variables outside them."""


def plugin_trace_requested() -> bool:
    """Whether :data:`TRACE_PLUGINS_ENV` asks for hook calls to be logged: a boolean as
    the settings take one (``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off``,
    in any case). Anything else raises :class:`~taskq.errors.ConfigurationError` naming
    it; the commands check it at start-up, as ``TASKQ_LOG_LEVEL``."""
    raw = os.environ.get(TRACE_PLUGINS_ENV, "").strip()
    if not raw:
        return False
    try:
        return _BOOL.validate_python(raw)
    except ValidationError:
        # Only `1` was taken: `true` left the trace off, and nothing said why.
        raise ConfigurationError(
            f"invalid setting {TRACE_PLUGINS_ENV}={raw!r}: expected true or false "
            "(or 1/0, yes/no, on/off, in any case), or leave it unset for false"
        ) from None


def _disabled() -> set[str]:
    raw = os.environ.get("TASKQ_DISABLE_PLUGINS", "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _load() -> _Loaded:
    from taskq.plugins import _builtin

    trace = plugin_trace_requested()  # before anything loads: a bad value loads nothing

    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    loaded = _Loaded(pm=pm)

    pm.register(_builtin, name="core")
    loaded.dist_of["core"] = CORE_DISTRIBUTION
    loaded.plugins.append(PluginInfo("core", CORE_DISTRIBUTION, _dist_version(CORE_DISTRIBUTION)))

    disabled = _disabled()
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else None
        if ep.name in disabled:
            # Skipped, not pm.set_blocked(): that unregisters the plugin already holding
            # the name, core's built-ins for a third-party entry point named "core".
            continue
        module: object = None
        try:
            # importlib's own error for a malformed value is "'NoneType' object has no
            # attribute 'group'"
            if ep.pattern.match(ep.value) is None:
                raise ValueError(
                    f"entry point value {ep.value!r} is not module[:attr] "
                    f"(e.g. 'taskq_mybackend._plugin')"
                )
            owner = loaded.dist_of.get(ep.name)
            if owner is not None:
                raise ValueError(
                    f"its entry point name {ep.name!r} is already taken by {owner}'s "
                    f"plugin; names in the taskq entry point group must be unique: ask "
                    f"{dist or 'its distribution'} to rename it"
                )
            module = ep.load()
            if pm.is_registered(module):
                raise ValueError(
                    f"{ep.value} is already registered as plugin {pm.get_name(module)!r}"
                )
            pm.register(module, name=ep.name)
            # A misspelt hook name would otherwise be silently ignored; checked plugin by
            # plugin, so the one at fault is named and left out, and the others load.
            pm.check_pending()
        # SystemExit too: a module's sys.exit("needs X") at import ended the command
        # there, its message not saying which plugin it came from.
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported, not fatal
            # Only this entry point's own registration: a name or module clash must not
            # take away the plugin that holds it (core's built-ins, for "core").
            if module is not None and pm.get_name(module) == ep.name:
                pm.unregister(plugin=module)
            failure = PluginLoadError(ep.name, dist, exc)
            loaded.failures.append(failure)
            # One line, on every command of this process: the traceback is for debugging.
            _log.error(
                "taskq.plugin-load-failed",
                plugin=ep.name,
                distribution=dist,
                error=f"{type(exc).__name__}: {exc}",
                hint=f"fix or uninstall it, or set TASKQ_DISABLE_PLUGINS={ep.name}",
            )
            _log.debug("taskq.plugin-load-traceback", plugin=ep.name, exc_info=exc)
            continue
        dist_name = dist or ep.name
        loaded.dist_of[ep.name] = dist_name
        loaded.plugins.append(PluginInfo(ep.name, dist_name, _dist_version(dist_name)))

    # Traced in _call_one: pluggy's hook-call monitoring sees pm.hook calls only, and
    # core calls each implementation itself, so it traced nothing.
    loaded.trace = trace
    return loaded


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager; entry points are loaded on the first call."""
    return _load().pm


def loaded_plugins() -> list[PluginInfo]:
    """Every plugin registered in this process, core first."""
    return list(_load().plugins)


def plugin_failures() -> list[PluginFailure]:
    """Plugins whose entry point raised on import, then hooks of loaded plugins that
    raised or answered what the hook does not take (each once, as they were met in
    this process), each with its error."""
    return list(_load().failures)


def _record_hook_failure(
    failure: PluginHookError, *, topic: str = "", event: str = "taskq.plugin-hook-failed"
) -> None:
    """Add ``failure`` to :func:`plugin_failures` and log it in one line (its
    traceback at debug), unless this plugin's hook failed so (``topic``) before."""
    loaded = _load()
    with loaded.lock:
        key = (failure.name, failure.hook, topic)
        if key in loaded.recorded:
            return
        loaded.recorded.add(key)
        loaded.failures.append(failure)
    _log.error(
        event,
        hook=failure.hook,
        plugin=failure.name,
        distribution=failure.distribution,
        error=failure.problem,
        hint=failure.hint,
    )
    if failure.cause is not None:
        _log.debug(
            "taskq.plugin-hook-traceback",
            hook=failure.hook,
            plugin=failure.name,
            exc_info=failure.cause,
        )


def report_bad_answer(hook_name: str, answer: HookAnswer, expected: str, got: object) -> None:
    """Record that ``answer`` (or ``got``, a part of it) is not what ``hook_name``
    takes (``expected``): what it would have added is left out."""
    _record_hook_failure(
        PluginHookError(
            answer.plugin,
            answer.distribution,
            hook_name,
            f"returned {reprlib.repr(got)}, not {expected}",
        ),
        topic="bad-answer",
        event="taskq.plugin-hook-bad-result",
    )


def report_command_failure(command: str, distribution: str, exc: Exception) -> None:
    """Record that the ``configure`` of ``command``, a ``taskq`` subcommand the
    ``taskq_cli_commands`` hook of ``distribution`` added, raised ``exc``: the command is
    left out, the others still work."""
    loaded = _load()
    plugin = next(
        (name for name, dist in loaded.dist_of.items() if dist == distribution), distribution
    )
    _record_hook_failure(
        PluginHookError(
            plugin,
            distribution,
            "taskq_cli_commands",
            f"added command {command!r}, whose configure raised {type(exc).__name__}: {exc}",
            cause=exc,
            hint=_CORE_BUG if distribution == CORE_DISTRIBUTION else None,
        ),
        topic=f"command:{command}",
    )


def _impls(hook_name: str) -> list[Any]:
    """The implementations of ``hook_name`` in registration order: core first, then
    the entry points (pluggy's call order is the reverse). Wrappers are left out:
    they wrap pluggy's own call, which this is not."""
    return [
        impl
        for impl in getattr(_load().pm.hook, hook_name).get_hookimpls()
        if not (impl.hookwrapper or impl.wrapper)
    ]


def _call_one(hook_name: str, impl: Any, kwargs: Mapping[str, Any]) -> tuple[bool, Any]:
    """Call one implementation; ``(False, None)`` when it raised (recorded)."""
    loaded = _load()
    dist = loaded.dist_of.get(impl.plugin_name, impl.plugin_name)
    fn: Callable[..., Any] = impl.function
    arguments = {k: kwargs[k] for k in impl.argnames}
    try:
        if loaded.trace:
            _log.debug("taskq.hook-call", hook=hook_name, plugin=impl.plugin_name, **arguments)
        result = fn(**arguments)
        if loaded.trace:
            _log.debug("taskq.hook-done", hook=hook_name, plugin=impl.plugin_name)
        return True, result
    except Exception as exc:  # noqa: BLE001 - plugin isolation
        _record_hook_failure(
            PluginHookError(
                impl.plugin_name,
                dist,
                hook_name,
                f"raised {type(exc).__name__}: {exc}",
                cause=exc,
                # core is no entry point: TASKQ_DISABLE_PLUGINS cannot turn it off
                hint=_CORE_BUG if dist == CORE_DISTRIBUTION else None,
            )
        )
        return False, None


def call_each(
    hook_name: str, *, before: Callable[[str], None] | None = None, **kwargs: Any
) -> list[HookAnswer]:
    """Call every implementation of a hook separately, isolating failures.

    Returns one :class:`HookAnswer` per implementation that returned, core's
    first. One that raises is recorded as a plugin failure (:class:`PluginHookError`,
    logged once per process as ``taskq.plugin-hook-failed``) and skipped: a broken
    plugin must not stop the others. ``before(distribution)`` runs ahead of each
    call (the CLI uses it to attribute the commands a plugin adds).
    """
    loaded = _load()
    answers: list[HookAnswer] = []
    for impl in _impls(hook_name):
        dist = loaded.dist_of.get(impl.plugin_name, impl.plugin_name)
        if before is not None:
            before(dist)
        returned, result = _call_one(hook_name, impl, kwargs)
        if returned:
            answers.append(HookAnswer(impl.plugin_name, dist, result))
    return answers


def first_answer(
    hook_name: str, *, accepts: Callable[[object], bool], expected: str, **kwargs: Any
) -> Any:
    """A ``firstresult`` hook's answer, each implementation called on its own and in
    pluggy's order (the last registered first), stopping at the first one that
    answers. An implementation that raises, or answers what ``accepts`` refuses
    (``expected`` says what it takes), is recorded as a plugin failure and the next
    one is asked; None passes. None when no implementation answers."""
    loaded = _load()
    for impl in reversed(_impls(hook_name)):
        returned, result = _call_one(hook_name, impl, kwargs)
        if not returned or result is None:
            continue
        if accepts(result):
            return result
        dist = loaded.dist_of.get(impl.plugin_name, impl.plugin_name)
        report_bad_answer(hook_name, HookAnswer(impl.plugin_name, dist, result), expected, result)
    return None


@dataclass
class _Claim:
    """One distribution's claim to a URL scheme: the entry points that made it (a
    later one of the same distribution replaces the earlier's factory)."""

    distribution: str
    plugins: list[str]
    factory: BackendFactory


@dataclass
class _Schemes:
    usable: dict[str, tuple[BackendFactory, str]]
    # scheme -> the claims of two or more third-party distributions: none is used
    contested: dict[str, list[_Claim]]


def backend_factories() -> dict[str, tuple[BackendFactory, str]]:
    """URL scheme -> (factory, distribution) of every scheme a backend can be
    opened for, across every loaded plugin.

    A scheme claimed by two distributions goes by one rule, whatever order the
    plugins load in: a scheme core serves stays core's, and one of TaskQ's own
    stays with the distribution it belongs to (``postgresql`` and ``postgres``
    with taskq-postgres); the other claims are left out. Claimed by two third
    parties, a scheme is nobody's, and :func:`open_backend` refuses it naming
    them. Either way each clash is a plugin failure (:func:`plugin_failures`) and
    every other scheme keeps working.
    """
    return _backend_schemes().usable


def _backend_schemes() -> _Schemes:
    claims: dict[str, dict[str, _Claim]] = {}
    for answer in call_each("taskq_backends"):
        mapping = answer.result
        if mapping is None:  # pluggy's "nothing from me"
            continue
        # A scheme no URL can have (my_db) was listed as installed and never found.
        if not isinstance(mapping, Mapping) or not all(
            isinstance(scheme, str)
            and url_scheme(f"{scheme}:") == scheme.lower()
            and callable(factory)
            for scheme, factory in mapping.items()
        ):
            report_bad_answer(
                "taskq_backends",
                answer,
                "a dict of URL scheme (a letter, then letters, digits, +, - or .) -> "
                "backend factory",
                mapping,
            )
            continue
        for given, factory in mapping.items():
            # A URL's scheme is read in lower case: MyDB was never found, though listed.
            scheme = given.lower()
            by_dist = claims.setdefault(scheme, {})
            claim = by_dist.get(answer.distribution)
            if claim is None:
                by_dist[answer.distribution] = _Claim(answer.distribution, [answer.plugin], factory)
            else:
                claim.factory = factory
                if answer.plugin not in claim.plugins:
                    claim.plugins.append(answer.plugin)

    schemes = _Schemes(usable={}, contested={})
    for scheme, by_dist in claims.items():
        if len(by_dist) == 1:
            [claim] = by_dist.values()
            schemes.usable[scheme] = (claim.factory, claim.distribution)
            continue
        kept = by_dist.get(CORE_DISTRIBUTION) or next(
            (c for d, c in by_dist.items() if _normalized(d) == _owner(scheme)), None
        )
        if kept is not None:
            schemes.usable[scheme] = (kept.factory, kept.distribution)
            for claim in by_dist.values():
                if claim is not kept:
                    _record_lost_claim(scheme, claim, kept.distribution)
        else:
            # sorted: the message is the same whatever order the plugins loaded in
            contested = sorted(by_dist.values(), key=lambda c: c.distribution)
            schemes.contested[scheme] = contested
            for claim in contested:
                others = _listed([c.distribution for c in contested if c is not claim])
                for plugin in claim.plugins:
                    _record_scheme_clash(
                        plugin,
                        claim.distribution,
                        scheme,
                        f"claims URL scheme {scheme!r}, as {others} does: TaskQ uses none of "
                        f"their backends for {scheme}:// (their other schemes still work)",
                        _contested_hint(schemes.contested[scheme]),
                    )
    return schemes


def _owner(scheme: str) -> str | None:
    """The TaskQ distribution ``scheme`` belongs to (normalised), if any."""
    owner = _SCHEME_PROVIDERS.get(scheme)
    return _normalized(owner) if owner else None


def _record_lost_claim(scheme: str, claim: _Claim, owner: str) -> None:
    for plugin in claim.plugins:
        _record_scheme_clash(
            plugin,
            claim.distribution,
            scheme,
            f"claims URL scheme {scheme!r}, which is {owner}'s: {scheme}:// stays with "
            f"{owner} (the plugin's other schemes still work)",
            f"ask {claim.distribution} to use a scheme of its own; "
            f"TASKQ_DISABLE_PLUGINS={plugin} turns the plugin off",
        )


def _record_scheme_clash(
    plugin: str, distribution: str, scheme: str, problem: str, hint: str
) -> None:
    _record_hook_failure(
        PluginHookError(plugin, distribution, "taskq_backends", problem, hint=hint),
        topic=f"scheme:{scheme}",
        event="taskq.plugin-scheme-clash",
    )


def _listed(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _contested_hint(claims: list[_Claim]) -> str:
    """How to leave a contested scheme to one claimant: each entry point is named (not
    a distribution: ``TASKQ_DISABLE_PLUGINS`` takes entry point names)."""
    values = [",".join(claim.plugins) for claim in claims]
    if len(values) == 2:
        options = " or ".join(f"TASKQ_DISABLE_PLUGINS={value}" for value in values)
        return f"uninstall one, or disable one by its entry point name: {options}"
    keep_first = ",".join(values[1:])
    return (
        f"uninstall all but one, or disable all but one by their entry point names "
        f"(TASKQ_DISABLE_PLUGINS={keep_first} keeps {claims[0].distribution})"
    )


def why_absent(distribution: str) -> str:
    """Why the plugin of ``distribution`` is not there, as the end of a sentence naming
    it: not installed, or installed and turned off (``TASKQ_DISABLE_PLUGINS``)."""
    if _dist_version(distribution) is None:
        return f"which is not installed: pip install {distribution}"
    wanted = _normalized(distribution)
    off = sorted(
        ep.name
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if ep.dist is not None and _normalized(ep.dist.name) == wanted and ep.name in _disabled()
    )
    if off:
        return f"which is installed but turned off by TASKQ_DISABLE_PLUGINS ({', '.join(off)})"
    return "which is installed but its plugin did not load (see `taskq plugins`)"


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _unknown_scheme_message(url: str, scheme: str, installed: list[str]) -> str:
    parts = [f"no installed TaskQ backend handles URL scheme {scheme!r} (in {redact(url)})."]
    parts.append(f"Installed schemes: {', '.join(sorted(installed)) or 'none'}.")
    base, plus, driver = scheme.partition("+")
    if plus and (base in installed or base in _SCHEME_PROVIDERS):
        # An application's SQLAlchemy URL (postgresql+asyncpg://) given as it is: the
        # message listed postgresql among the installed schemes and left it there.
        parts.append(
            f"The +{driver} names a driver, as in a SQLAlchemy URL; TaskQ picks its own: "
            f"give the URL as {base}://..."
        )
        scheme = base
    provider = None if scheme in installed else _SCHEME_PROVIDERS.get(scheme)
    if provider:
        parts.append(f"It comes with {provider}, {why_absent(provider)}.")
    failures = plugin_failures()
    if failures:
        parts.append("Plugin failures: " + " ".join(str(f) for f in failures))
    return " ".join(parts)


def open_backend(url: str, **options: Any) -> Backend:
    """Build the backend for ``url`` through the plugins' ``taskq_backends`` hooks.

    The scheme (the part before ``://``) selects the plugin. The backend is
    created, not connected; open it with ``await backend.open()`` or through
    ``TaskQ``. Raises :class:`~taskq.errors.UnknownBackendError` (a
    ``ValueError``) for an unknown scheme, listing the installed ones;
    :class:`~taskq.errors.PluginError` for a scheme two third-party
    distributions claim (see :func:`backend_factories`) and for a factory that
    raised an error of its own (a ``TaskQError`` it raises goes through as it
    is); :class:`~taskq.errors.IncompatiblePluginError` when the factory's
    answer is no backend, :class:`~taskq.errors.ProtocolVersionMismatch`
    when the backend speaks another protocol version than this core, and
    :class:`~taskq.errors.ProtocolKeywordMissing` when it lacks a keyword of its version.
    """
    from taskq.backend import check_protocol_keywords, check_protocol_version, missing_members

    # The scheme alone: a full parse (urlsplit) raised a bare ValueError on a host the
    # backend's own check explains (an unclosed IPv6 bracket).
    scheme = url_scheme(url)
    if scheme is None:
        raise UnknownBackendError(
            f"{redact(url)} is not a backend URL: expected scheme://..., "
            f"e.g. postgresql://localhost/app or memory://"
        )
    schemes = _backend_schemes()
    if scheme in schemes.contested:
        claims = schemes.contested[scheme]
        raise PluginError(
            f"URL scheme {scheme!r} (in {redact(url)}) is claimed by both "
            f"{_listed([c.distribution for c in claims])}, so TaskQ uses neither backend; "
            f"{_contested_hint(claims)}"
        )
    factories = schemes.usable
    if scheme not in factories:
        raise UnknownBackendError(_unknown_scheme_message(url, scheme, list(factories)))
    factory, dist = factories[scheme]
    try:
        backend = factory(url, **_accepted(factory, options))
    except TaskQError:
        raise  # says what to do already (a DSN check's ConfigurationError)
    except Exception as exc:
        # The factory's own words may quote the URL, or another URL among the options
        # (a direct_dsn): never a password.
        said = str(exc)
        for text in (url, *(v for v in options.values() if isinstance(v, str) and "://" in v)):
            said = said.replace(text, redact(text))
        raise PluginError(
            f"the {dist} backend for scheme {scheme!r} could not be built from "
            f"{redact(url)}: {type(exc).__name__}: {said}. Check the URL and the backend "
            f"options; if they are right, report it to {dist}"
        ) from exc
    if _not_a_backend(backend):
        raise IncompatiblePluginError(
            f"the {dist} backend factory for scheme {scheme!r} returned "
            f"{_described(backend)}, not a Backend; report it to {dist}, or upgrade it"
        )
    check_protocol_version(type(backend), distribution=dist)
    missing = missing_members(backend)
    if missing:
        raise IncompatiblePluginError(
            f"{dist} returned {type(backend).__qualname__} for scheme {scheme!r}, which does not "
            f"implement the Backend protocol; missing: {', '.join(missing)}"
        )
    check_protocol_keywords(backend, distribution=dist)
    return backend


def _accepted(factory: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """The options to pass ``factory``. A worker's and an application's backend settings
    (``schema`` and :data:`~taskq.settings.BACKEND_TUNABLES`: ``command_timeout``,
    ``poll_only``, ...) reach every backend; a factory that names its keywords, with no
    ``**options``, gets only those of them it names. Any other option goes through: a
    misspelt one stays the factory's error."""
    from taskq.settings import BACKEND_TUNABLES

    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return options
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return options
    named = {p.name for p in parameters}
    settings = {"schema", *BACKEND_TUNABLES.values()}
    return {name: value for name, value in options.items() if name in named or name not in settings}


def _not_a_backend(obj: object) -> bool:
    """None, a class (the factory's, not an instance), or anything declaring no
    protocol version: a backend of any version declares one."""
    return obj is None or isinstance(obj, type) or not hasattr(obj, "BACKEND_PROTOCOL_VERSION")


def _described(obj: object) -> str:
    if obj is None:
        return "None"
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__} itself"
    kind = type(obj)
    return f"a {kind.__module__}.{kind.__qualname__} (it declares no BACKEND_PROTOCOL_VERSION)"
