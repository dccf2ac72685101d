"""The code the Redis engine runs on the server: three bodies (the capped, write-once
index entry; renewing and releasing a lease only while holding it), each a server-side
function (``FCALL``) in a library of its own, and the same bodies as scripts where the
server has no FCALL. One home for what a writer's ACL must allow (docs/remote.md)."""

from __future__ import annotations

import re
import time
import weakref
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import redis as _redis

__all__ = ["FUNCTIONS", "SERVER_CODE"]

#: What runs on the server, each on its one key: ``publish`` a write-once manifest, capped
#: per build key in leaves (never past 1,024 whatever the caller asks: the function walks the
#: index, and an index a writer filled with millions of fields would hold the server) and in
#: bytes, names and manifests, as a read counts them (1 created, 0 exists, -1 full); ``renew`` a lease only
#: while it holds our token; ``release`` (compare-and-delete) likewise. With the flags of
#: each as a function (a lease is let go, or kept, on a server at maxmemory too).
_BODIES: Final = {
    "publish": (
        """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('HLEN', KEYS[1]) >= math.min(tonumber(ARGV[3]), 1024) then return -1 end
local total = string.len(ARGV[1]) + string.len(ARGV[2])
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  total = total + string.len(field) + redis.call('HSTRLEN', KEYS[1], field)
end
if total > tonumber(ARGV[4]) then return -1 end
return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
""",
        "",
    ),
    "renew": (
        """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
""",
        "'allow-oom'",
    ),
    "release": (
        """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""",
        "'allow-oom'",
    ),
}


def _named(name: str) -> str:
    """A body's function (and library) name: its own digest in it, so that a release that
    leaves a body as it was keeps its name (nothing to load again), and one that changes it
    never runs the old one under the new name."""
    import hashlib

    body, flags = _BODIES[name]
    return f"safejit_{name}_{hashlib.sha256(f'{flags}:{body}'.encode()).hexdigest()[:12]}"


#: The server-side functions (Redis >= 7, Valkey: ``FUNCTION LOAD``), a library each.
#: Functions, not scripts: a user allowed EVAL may run any Lua, a loop that stalls the
#: server for every tenant; one allowed FCALL only these, once an admin loaded them (they
#: persist). Where the server has no FCALL (Redis 6, Dragonfly) the same bodies run as
#: scripts (EVALSHA), for a writer the server lets run them.
FUNCTIONS: Final = tuple(
    f"#!lua name={_named(name)}\nredis.register_function{{function_name='{_named(name)}', "
    f"callback=function(KEYS, ARGV){body}end, flags={{{flags}}}}}\n"
    for name, (body, flags) in _BODIES.items()
)


class _Function:
    """One of :data:`FUNCTIONS`, called by FCALL; loaded first where it is not there yet, if
    this user may (an admin loads them once for users who may not: docs/remote.md); run as a
    script where the server has no FCALL."""

    def __init__(self, name: str) -> None:
        import hashlib

        self.name = _named(name)
        self.script = _BODIES[name][0]
        self.sha = hashlib.sha1(self.script.encode(), usedforsecurity=False).hexdigest()

    def __call__(self, client: _redis.Redis, key: str, *args: Any) -> Any:
        import redis

        if time.monotonic() >= _NO_FCALL.get(client, 0.0):
            try:
                return client.fcall(self.name, 1, key, *args)
            except redis.exceptions.ResponseError as exc:
                text = str(exc)
                if _FCALL_UNKNOWN.search(text):  # (FCALL itself; not a command a function called)
                    _NO_FCALL[client] = time.monotonic() + _NO_FCALL_S
                elif "Function not found" in text:
                    _load(client)
                    return client.fcall(self.name, 1, key, *args)
                else:
                    raise
        try:
            return client.evalsha(self.sha, 1, key, *args)
        except redis.exceptions.NoScriptError:
            return client.eval(self.script, 1, key, *args)


#: Clients of a server found without FCALL, and until when they run the bodies as scripts
#: (then FCALL is tried again: the server at that address may have been upgraded).
_NO_FCALL: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
_NO_FCALL_S: Final = 60.0
#: The server's answer to a FCALL it does not know (Valkey, Redis: quoted ' or `).
_FCALL_UNKNOWN: Final = re.compile(r"unknown command ['`]fcall['`]", re.IGNORECASE)


def _load(client: _redis.Redis) -> None:
    import redis

    try:
        for library in FUNCTIONS:
            client.function_load(library, replace=True)
    except redis.exceptions.NoPermissionError as exc:
        raise redis.exceptions.NoPermissionError(
            f"the server has not the safejit functions loaded, and this user may not load them: an admin "
            f"loads them once with FUNCTION LOAD (docs/remote.md) [{exc}]"
        ) from None


#: What the engine calls, by name.
SERVER_CODE: Final = {name: _Function(name) for name in ("publish", "renew", "release")}
