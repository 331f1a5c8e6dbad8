"""``taskq plugins``: what is installed, and what failed: a plugin that did not load,
or a hook of a loaded one that raised, answered what the hook does not take, or
claimed a URL scheme another distribution has."""

from __future__ import annotations

import argparse
import json

from taskq.cli._commands import CommandRegistry


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def _run(args: argparse.Namespace) -> int:
    from taskq.errors import PluginLoadError
    from taskq.plugins import backend_factories, loaded_plugins, plugin_failures
    from taskq.worker._transient import transient_errors

    schemes: dict[str, list[str]] = {}
    for scheme, (_, dist) in backend_factories().items():
        schemes.setdefault(dist, []).append(scheme)
    # The hooks that can be asked without side effects are, so that their failures show
    # here (taskq_cli_commands was, to build the command line); not taskq_default_dsn,
    # which may start a server.
    transient_errors()
    plugins = [
        {
            "name": p.name,
            "distribution": p.distribution,
            "version": p.version,
            "backend_schemes": sorted(schemes.get(p.distribution, [])),
        }
        for p in loaded_plugins()
    ]
    failures = [
        {"name": f.name, "distribution": f.distribution, "hook": None, "error": str(f.cause)}
        if isinstance(f, PluginLoadError)
        else {
            "name": f.name,
            "distribution": f.distribution,
            "hook": f.hook,
            "error": f"{f.hook} hook {f.problem}",
        }
        for f in plugin_failures()
    ]
    if args.json:
        print(json.dumps({"plugins": plugins, "failures": failures}, indent=2))
    else:
        width = max(len(p["name"] or "") for p in plugins)
        for p in plugins:
            extra = f"  schemes: {', '.join(p['backend_schemes'])}" if p["backend_schemes"] else ""
            print(f"{p['name']:<{width}}  {p['distribution']} {p['version'] or ''}{extra}")
        for f in failures:
            print(f"FAILED {f['name']} ({f['distribution']}): {f['error']}")
    return 1 if failures else 0


def register(cli: CommandRegistry) -> None:
    cli.add(
        "plugins",
        help="list installed TaskQ plugins, their backend URL schemes and plugin failures",
        configure=_configure,
        run=_run,
    )
