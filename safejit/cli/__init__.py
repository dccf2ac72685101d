"""The ``safejit`` command: demo, ls, stats, verify, prune, gc, explain, inspect, warm,
and ``remote stats|ls|verify``.

Exit status: 0 when all is well (``explain``: a hit); 1 when something was found
wrong (a leaf that does not verify, a bad usage record, an entry where a directory
should be; ``explain``: a miss; ``warm``: a request failed or skipped, or an upload
failed); 2 for an error (a bad option, a missing ``--cache-dir``, a ``SafejitError``,
a remote that cannot be reached).

Output is plain aligned text; with ``pip install 'safejit[cli]'`` (rich) it is
coloured on a terminal, with spinners while compiles run. ``--json`` (every command
but demo) prints one JSON document; its keys are listed in the README.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Final, TextIO, get_args

from .._version import __version__
from ..config import BackendName
from ..errors import PathConfinementError, SafejitError
from . import demo, explain, inspect, listing, remote, upkeep, warm
from ._common import EXIT_ERROR, CliError, directory, parse_age, parse_size, positive_int
from ._out import Out
from ._text import safe

__all__ = ["main", "parse_age", "parse_size"]

Command = Callable[[argparse.Namespace, Out], int]
#: What --backend takes (a name Config takes).
BACKENDS: Final = get_args(BackendName)


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each option's help (when there is one to show);
    descriptions kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, [], argparse.SUPPRESS) or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def _version() -> str:
    try:
        from importlib.metadata import version

        import rich  # noqa: F401  (whether it can be used, not only whether it is installed)

        shown = f"rich {version('rich')}"
    except Exception:  # (ImportError; no metadata: PackageNotFoundError)
        shown = "rich not installed: plain output"
    return f"safejit {__version__} (Python {platform.python_version()}; {shown})"


def _parser() -> argparse.ArgumentParser:
    """Every command and option, declared once (a subcommand group per function)."""
    p = argparse.ArgumentParser(
        prog="safejit",
        description="Run-time kernel compilation with a verified, shared cache.",
        epilog="Exit status: 0 all well, 1 something found wrong (or explain: a miss), 2 an error.",
        formatter_class=_Help,
    )
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("-v", "--verbose", action="store_true", help="log the library's INFO lines (compiles) to stderr")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cache_parser(must: str) -> argparse.ArgumentParser:
        cache = argparse.ArgumentParser(add_help=False)
        cache.add_argument(  # (after the command too: ``safejit warm -v``; absent, the one before it stands)
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="as safejit -v"
        )
        cache.add_argument(
            "--cache-dir",
            metavar="DIR",
            type=directory,
            help="the cache root to use (default: SAFEJIT_CACHE_DIRS, else $XDG_CACHE_HOME/safejit or "
            f"~/.cache/safejit); {must}",
        )
        return cache

    # (the commands that fill a cache make it; those that read one refuse a missing one: a typo)
    reading, filling = cache_parser("must exist"), cache_parser("made if missing")
    js = argparse.ArgumentParser(add_help=False)
    js.add_argument("--json", action="store_true", help="print one JSON document (keys: see the README)")

    def command(name: str, text: str, *parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
        cache = filling if name in ("demo", "warm") else reading
        return sub.add_parser(name, help=text, description=text, parents=[cache, *parents], formatter_class=_Help)

    d = command("demo", "compile a kernel on the host backend and show each cache tier")
    d.add_argument("--trace", action="store_true", help="print the span tree (needs safejit[otel])")
    d.add_argument(
        "--keep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the demo's leaf in the cache (--no-keep removes it at the end)",
    )

    _cache_parsers(command, js)
    _diagnosis_parsers(command, js)
    _warm_parser(command, js)
    _remote_parser(sub, js)
    return p


#: Makes one subcommand: ``command(name, help, *parent parsers)`` (each takes --cache-dir).
_Command = Callable[..., argparse.ArgumentParser]


def _cache_parsers(command: _Command, js: argparse.ArgumentParser) -> None:
    """``safejit ls|stats|verify|prune|gc``: the local cache's contents and upkeep."""
    ls = command("ls", "list the cache's leaves: short id, kernel, tenant, backend, size, age", js)
    ls.add_argument("--tenant", help="only this tenant's leaves")
    ls.add_argument("--backend", choices=BACKENDS, help="only this backend's leaves")
    ls.add_argument("--paths", action="store_true", help="print each leaf's id and directory, one per line")
    command("stats", "leaves and bytes per tenant and backend; hit rates and compile times from usage records", js)
    v = command("verify", "rehash every leaf; exit 0 only when all verify and every usage record is valid", js)
    v.add_argument(
        "--fix",
        action="store_true",
        help="quarantine damaged leaves (a signature these keys do not vouch for is reported, not moved: the keys may "
        "be the wrong ones); delete bad usage records",
    )
    v.add_argument(
        "--tenant",
        help="whose leaves' signatures to check, against SAFEJIT_VERIFY_KEYS (default: SAFEJIT_TENANT, else "
        "default); other tenants' leaves are rehashed, their signatures not checked",
    )

    pr = command("prune", "delete leaves by age, by count per build and by total size (least recently used first)", js)
    pr.add_argument(
        "--max-bytes",
        type=parse_size,
        metavar="SIZE",
        help="keep the cache under SIZE bytes: 500M, 10G "
        "(default: SAFEJIT_CACHE_MAX_BYTES, when no other limit is given)",
    )
    pr.add_argument(
        "--max-age", type=parse_age, metavar="AGE", help="delete leaves not used for AGE: 45m, 12h, 30d, 2w"
    )
    pr.add_argument(
        "--keep-per-build",
        type=positive_int,
        metavar="N",
        help="keep the N most recently used leaves of each build key (N >= 1)",
    )
    pr.add_argument("--grace", type=parse_age, default="60s", metavar="AGE", help="never delete a leaf used within AGE")
    pr.add_argument("--dry-run", action="store_true", help="report what would be deleted; delete nothing")
    g = command(
        "gc", "remove old staging residue, quarantine, usage records and idle lock files, and the obsolete v1/tools", js
    )
    g.add_argument(
        "--older-than", type=parse_age, default="1d", metavar="AGE", help="remove what is older than AGE: 30m, 12h, 1d"
    )


def _diagnosis_parsers(command: _Command, js: argparse.ArgumentParser) -> None:
    """``safejit explain|inspect``: whether a compile would hit, and what a leaf holds."""
    e = command(
        "explain", "would compiling SOURCE hit the cache? On a miss, say why (exit 0 on a hit, 1 on a miss)", js
    )
    e.add_argument("source", help="the source file (under a --source-root), as compiled by Runtime.source(path)")
    e.add_argument("--name", help="the source's name, as Runtime.source(path, name=...) (default: the file's stem)")
    e.add_argument(
        "-I",
        "--include",
        action="append",
        default=[],
        metavar="DIR",
        help="an include dir, as compile(include_dirs=...); repeatable",
    )
    e.add_argument(
        "-D",
        "--define",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="a define, as compile(defines=...); repeatable",
    )
    e.add_argument(
        "--flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="a compiler flag, as compile(flags=...); repeatable (--flag=-O3)",
    )
    e.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help='a declared extra; VALUE as JSON (132, true, "text"); repeatable',
    )
    _source_roots(e)
    e.add_argument("--backend", choices=BACKENDS, help="the backend (default: SAFEJIT_BACKEND, else host)")
    e.add_argument("--arch", help="target architecture, as compile(arch=...): sm_90 (default: the device's)")
    e.add_argument("--tenant", help="the tenant namespace (default: SAFEJIT_TENANT, else default)")

    i = command("inspect", "show a leaf: manifest, inputs, argv and the files its build read", js)
    i.add_argument(
        "leaf", metavar="LEAF", help="a leaf id from `safejit ls` (a prefix of 4+ hex digits) or a leaf directory"
    )
    i.add_argument("--deps", action="store_true", help="list every dependency and absent path (default: a summary)")


def _warm_parser(command: _Command, js: argparse.ArgumentParser) -> None:
    """``safejit warm``: build an inventory ahead of time."""
    w = command("warm", "build an inventory's requests in parallel processes, skipping what verifies", js)
    w.add_argument("inventory", help="a JSON-lines inventory (Config.inventory / SAFEJIT_INVENTORY)")
    w.add_argument(
        "--remote",
        nargs="?",
        const="",
        metavar="URL",
        help="fill this remote cache too (read-write; without URL: SAFEJIT_REMOTE): "
        "each request's build or disk hit is uploaded unless the remote has it; waits for the uploads",
    )
    w.add_argument(
        "--signing-key",
        metavar="FILE",
        help="sign the leaves built (and uploaded) with this key: an Ed25519 private key in PEM, or an HMAC key",
    )
    w.add_argument(
        "-j", "--jobs", type=positive_int, default=os.cpu_count() or 2, metavar="N", help="parallel processes"
    )
    _source_roots(w)


def _source_roots(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a declared source root (default: SAFEJIT_SOURCE_ROOTS); repeatable",
    )


def _remote_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], js: argparse.ArgumentParser) -> None:
    """``safejit remote stats|ls|verify``."""
    text = "what a remote cache holds for a tenant and backend (stats, ls, verify); reads only"
    r = sub.add_parser("remote", help=text, description=text, formatter_class=_Help)
    rsub = r.add_subparsers(dest="remote_command", required=True, metavar="COMMAND", help="what to do")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--remote",
        metavar="URL",
        help="the remote (default: SAFEJIT_REMOTE); credentials masked, a password better in SAFEJIT_REMOTE_PASSWORD",
    )
    where.add_argument("--tenant", help="the tenant namespace (default: SAFEJIT_TENANT, else default)")
    where.add_argument("--backend", choices=BACKENDS, help="the backend's index (default: SAFEJIT_BACKEND)")

    def command(name: str, text: str, limit: int, what: str) -> argparse.ArgumentParser:
        c = rsub.add_parser(name, help=text, description=text, parents=[where, js], formatter_class=_Help)
        c.add_argument("--limit", type=positive_int, default=limit, metavar="N", help=f"look at {what} at most")
        return c

    command(
        "stats",
        "build keys, leaves, blobs and bytes, leases held; the breaker and a round trip",
        100_000,
        "N keys of each kind",
    )
    command("ls", "the remote's leaves: short id, kernel, size, signer, created", 1000, "N leaves")
    verify = "check each remote leaf: manifest, names, deps key, signature, artifact bytes; exit 1 on a finding"
    v = command("verify", verify, 1000, "N leaves")
    v.add_argument("--local", action="store_true", help="also rehash each leaf's closure against this machine's files")
    v.add_argument(
        "--cache-dir",
        metavar="DIR",
        type=directory,
        help="with --local: the cache root of the Runtime that probes the toolchain",
    )
    v.add_argument(
        "--source-root",
        action="append",
        default=[],
        metavar="DIR",
        help="with --local: a declared source root (default: SAFEJIT_SOURCE_ROOTS); repeatable",
    )


_COMMANDS: dict[str, Command] = {
    "demo": demo.cmd_demo,
    "ls": listing.cmd_ls,
    "stats": listing.cmd_stats,
    "verify": upkeep.cmd_verify,
    "prune": upkeep.cmd_prune,
    "gc": upkeep.cmd_gc,
    "explain": explain.cmd_explain,
    "inspect": inspect.cmd_inspect,
    "warm": warm.cmd_warm,
    "remote": remote.cmd_remote,
}


class _SafeFormatter(logging.Formatter):
    """Log lines with every control character escaped (paths in them come from the cache)."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(safe(line) for line in super().format(record).split("\n"))


@contextlib.contextmanager
def _logging(verbose: bool, stream: TextIO) -> Iterator[None]:
    """The library's log lines, escaped, on ``stream`` (WARNING and up; INFO with -v),
    while the command runs."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO if verbose else logging.WARNING)
    logger = logging.getLogger("safejit")
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # (not also through an unescaped root handler, nor logging's last resort)
    if verbose:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.level, logger.propagate = saved


def main(argv: Sequence[str] | None = None, *, out: Out | None = None) -> int:
    args = _parser().parse_args(argv)
    out = out if out is not None else Out()
    try:
        with _logging(args.verbose, out.err):
            return _COMMANDS[args.command](args, out)
    except CliError as exc:
        out.error(str(exc), *exc.more)
    except SafejitError as exc:  # (a compiler's log follows its first line: shown indented, escaped)
        first, *rest = str(exc).split("\n")
        if isinstance(exc, PathConfinementError) and hasattr(args, "source_root"):
            rest.insert(0, "(on this command line: --source-root DIR)")
        out.error(f"{type(exc).__name__}: {first}", *rest[:40])
    except KeyboardInterrupt:
        out.error("interrupted")
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_ERROR
    except OSError as exc:
        out.error(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
    except Exception as exc:  # a bug; its message may hold text from the cache: escaped, no traceback
        out.error(f"internal error: {type(exc).__name__}: {exc}", "(a bug in safejit: please report it)")
    return EXIT_ERROR


def _quiet_stdout() -> None:
    """After a reader closed the pipe (``safejit ls | head``): no error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
