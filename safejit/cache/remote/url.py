"""The remote's address: ``redis://``, ``rediss://``, ``unix://`` and ``s3://`` URLs,
parsed strictly, with every credential held in a :class:`Secret` that prints as ``***``.

Credentials come only from the URL's userinfo or from the caller (who reads the
environment in ``safejit/_env.py``); nothing here reads the environment. A
password in a query string is refused: query strings end up in logs.

>>> url = parse_url("redis://writer:hunter2@cache.internal:6379/0")
>>> str(url)
'redis://writer:***@cache.internal:6379/0'
>>> url.password.reveal()
'hunter2'
"""

from __future__ import annotations

import hmac
import re
import unicodedata
from dataclasses import dataclass, field, replace
from typing import Final, Literal
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from ...errors import ConfigError

__all__ = ["ENGINES", "SCHEMES", "RemoteURL", "Secret", "parse_url"]

Scheme = Literal["redis", "rediss", "unix", "s3"]
SCHEMES: Final[tuple[Scheme, ...]] = ("redis", "rediss", "unix", "s3")
#: The engine behind each scheme.
ENGINES: Final = {"redis": "redis", "rediss": "redis", "unix": "redis", "s3": "s3"}
_REDIS_PORT: Final = 6379
#: Query parameters each scheme accepts; anything else is a ConfigError (a typo must not
#: silently fall back to a default such as an unverified TLS connection).
_QUERY: Final = {
    "redis": frozenset({"db"}),
    "rediss": frozenset({"db", "ca_certs"}),
    "unix": frozenset({"db"}),
    "s3": frozenset({"endpoint", "region"}),
}
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
_PREFIX = re.compile(r"[A-Za-z0-9!_.*'()/-]*\Z")
_MASK: Final = "***"


class Secret:
    """A credential: ``repr``, ``str`` and formatting show ``***``; :meth:`reveal` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise ConfigError("a remote credential must be a string")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({_MASK!r})"

    def __str__(self) -> str:
        return _MASK

    def __format__(self, spec: str) -> str:
        return _MASK

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, len(self._value)))

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        return (Secret, (self._value,))

    def __bool__(self) -> bool:
        return bool(self._value)


@dataclass(frozen=True, slots=True)
class RemoteURL:
    """A parsed remote address. ``host`` is the Redis host or the S3 bucket; ``path`` the
    Unix socket path or the S3 key prefix (no leading or trailing slash)."""

    scheme: Scheme
    host: str = ""
    port: int | None = None
    path: str = ""
    db: int = 0
    username: str | None = None
    password: Secret | None = field(default=None, compare=False)
    #: S3 only: the session token of temporary credentials (never in a URL).
    session_token: Secret | None = field(default=None, compare=False)
    endpoint: str | None = None
    region: str | None = None
    ca_certs: str | None = None

    @property
    def engine(self) -> str:
        return ENGINES[self.scheme]

    @property
    def tls(self) -> bool:
        return self.scheme == "rediss" or (self.scheme == "s3" and not (self.endpoint or "").startswith("http://"))

    def secrets(self) -> tuple[str, ...]:
        """The revealed credentials, longest first (what :meth:`redact` masks)."""
        values = (s.reveal() for s in (self.password, self.session_token) if s)
        return tuple(sorted((v for v in values if v), key=len, reverse=True))

    def redact(self, text: str) -> str:
        """``text`` with every credential of this URL, and any ``//user:pass@`` userinfo, masked."""
        for value in self.secrets():
            text = text.replace(value, _MASK)
            text = text.replace(quote(value, safe=""), _MASK)
        return _USERINFO.sub(r"\1" + _MASK + "@", text)

    def __str__(self) -> str:
        auth = ""
        if self.username is not None or self.password is not None:
            auth = quote(self.username or "", safe="")
            if self.scheme == "s3" and auth:
                auth = _key_id(auth)
            auth += f":{_MASK}@" if self.password is not None else "@"
        if self.scheme == "unix":
            return f"unix://{auth}{self.path}" + (f"?db={self.db}" if self.db else "")
        if self.scheme == "s3":
            query = "&".join(
                f"{k}={quote(v, safe=':/')}" for k, v in (("endpoint", self.endpoint), ("region", self.region)) if v
            )
            return f"s3://{auth}{self.host}/{self.path}" + (f"?{query}" if query else "")
        host = f"[{self.host}]" if ":" in self.host else self.host
        tail = f"?ca_certs={quote(self.ca_certs, safe='/')}" if self.ca_certs else ""
        return f"{self.scheme}://{auth}{host}:{self.port}/{self.db}{tail}"

    def __repr__(self) -> str:
        return f"RemoteURL({str(self)!r})"


_USERINFO = re.compile(r"(//[^/@:\s]*:)[^@\s]*@")
#: Credentials put in a query string (refused).
_QUERY_SECRETS: Final = ("password", "pass", "secret", "secret_access_key", "token")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_REGION = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}\Z")
#: The query parameters whose values a message may show, when plain (:data:`_PLAIN`).
_SHOWN: Final = frozenset().union(*_QUERY.values())
_PLAIN = re.compile(r"[A-Za-z0-9._:/-]*\Z")


def parse_url(
    url: str,
    *,
    username: str | None = None,
    password: str | Secret | None = None,
    session_token: str | Secret | None = None,
) -> RemoteURL:
    """Parse ``url``; ``username``/``password``/``session_token`` are credentials the caller
    read elsewhere (environment). A credential given both ways is a ConfigError, as is
    anything this parser does not understand. Messages never contain a credential."""
    if not isinstance(url, str) or not url:
        raise ConfigError("the remote URL must be a non-empty string")
    try:
        return _parse(url, username, password, session_token)
    except ConfigError as exc:
        said = _withheld(url, str(exc))
        if said == str(exc):
            raise
        raise ConfigError(said) from None


def _parse(
    url: str, username: str | None, password: str | Secret | None, session_token: str | Secret | None
) -> RemoteURL:
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port
    except ValueError:
        # (not urlsplit's words: a password holding '/', '?' or '#' ends the host early,
        # and the "port" it then names is the password's start)
        raise ConfigError(
            f"remote URL {_scrub(url)!r} does not parse (a '/', '?', '#' or '@' in a credential must be "
            "percent-encoded, and a port must be a number up to 65535)"
        ) from None
    if scheme not in SCHEMES:
        raise ConfigError(f"remote URL {_scrub(url)!r}: scheme must be one of {', '.join(SCHEMES)}")
    if parts.fragment:
        raise ConfigError(f"remote URL {_scrub(url)!r} must not have a #fragment")
    query = _query(url, scheme, parts.query)
    url_user = unquote(parts.username) if parts.username else None
    url_pass = Secret(unquote(parts.password)) if parts.password is not None else None
    if password is not None and url_pass is not None:
        raise ConfigError(f"remote URL {_scrub(url)!r}: a password is given both in the URL and by the caller")
    if username is not None and url_user is not None and username != url_user:
        raise ConfigError(f"remote URL {_scrub(url)!r}: the username is given both in the URL and by the caller")
    base = RemoteURL(
        scheme=scheme,  # checked against SCHEMES above
        username=url_user if url_user is not None else username,
        password=url_pass if url_pass is not None else _secret(password),
        session_token=_secret(session_token),
    )
    if base.session_token is not None and scheme != "s3":
        raise ConfigError("a session token applies to s3:// remotes only")
    if scheme == "s3":
        # urlsplit lowercases the host; a bucket name is taken as written (and must be lowercase).
        return _s3(url, base, parts.netloc.rpartition("@")[2], parts.path, port, query)
    return _redis(url, base, parts.hostname or "", parts.path, port, query)


def _secret(value: str | Secret | None) -> Secret | None:
    if value is None or isinstance(value, Secret):
        return value
    return Secret(value)


def _key_id(key: str) -> str:
    """An S3 access key id as shown: its last four characters at most (an id names the
    principal and its account); "" for none."""
    return (_MASK + key[-4:] if len(key) >= 16 else _MASK) if key else ""


def _scrub(url: str) -> str:
    """``url`` with whatever may be a credential masked: the userinfo up to the last '@'
    (a password may hold '@', '/', '?' or '#' not percent-encoded) — after its user name
    where the scheme is one of ours, whole where it is not (``user:pw@host`` has no
    scheme, and no way to tell a user from a password) — and every query value but the
    plain ones of the parameters a scheme accepts (a credential under any name, a value
    joined by ';', an endpoint with a userinfo), and any fragment."""
    start, end, known = _userinfo(url)
    if start <= end:
        user, colon, _ = url[start:end].partition(":")
        if not known:
            url = f"{url[:start]}{_MASK}@{url[end + 1 :]}"
        elif url[:start].lower() == "s3://":  # (an access key id, shown as str() shows one)
            key = _key_id(user.split("/")[0].split("?")[0].split("#")[0])
            url = f"{url[:start]}{key}{':' + _MASK if colon else ''}@{url[end + 1 :]}"
        elif colon or "/" in user or "?" in user or "#" in user:
            user = user.split("/")[0].split("?")[0].split("#")[0] + ":" if colon else ""
            url = f"{url[:start]}{user}{_MASK}@{url[end + 1 :]}"
        end = url.rfind("@")
    else:
        netloc = re.split(r"[/?#]", url[start:], maxsplit=1)[0]
        cut = _past_host(netloc)
        if cut >= 0:
            url = f"{url[: start + cut + 1]}{_MASK}{url[start + len(netloc) :]}"
    head, hash_, _ = url[end + 1 :].partition("#")
    rest, question, query = head.partition("?")
    if question:
        pairs = []
        for pair in query.split("&"):
            name, equals, value = pair.partition("=")
            if not equals:  # (a bare word: perhaps the tail of a value that held a '&')
                name = _MASK if name else name
            elif not (unquote(name) in _SHOWN and _PLAIN.match(unquote(value))):
                value = _MASK
            pairs.append(f"{name}{equals}{value}")
        rest += "?" + "&".join(pairs)
    return url[: end + 1] + rest + ("#" + _MASK if hash_ else "")


def _userinfo(url: str) -> tuple[int, int, bool]:
    """Where the userinfo of ``url`` may lie — after ``scheme://`` (at the start when there
    is none), up to the last '@' or character that normalizes to one (``＠``, ``﹫``: typed
    by an input method; ``start > end``: there is none) — and whether the scheme is one
    of ours."""
    found = _SCHEME.match(url)
    start = found.end() if found else 0
    known = found is not None and found.group(1).lower() in SCHEMES
    end = url.rfind("@")
    if not url.isascii():
        end = max([end, *(i for i, c in enumerate(url) if "@" in unicodedata.normalize("NFKC", c))])
    return start, end, known


def _past_host(netloc: str) -> int:
    """In a netloc with no userinfo, where what follows the host is no port (a password
    whose '@' and host went missing: ``user:pw``, ``user:pw:6380``): the index of the
    ':' before it, else -1."""
    host_end = netloc.find("]") + 1 if netloc.startswith("[") else 0
    colon = netloc.find(":", host_end)
    rest = netloc[colon + 1 :]
    return -1 if colon < 0 or (rest.isascii() and rest.isdigit()) else colon


def _withheld(url: str, message: str) -> str:
    """``message`` unless the credential in ``url`` holds what urlsplit takes for the end of
    the host ('/', '?', '#', '@' not percent-encoded): then the pieces it cut out of it (a
    database, a bucket, a query decoded, however short) may be in the message, which is
    replaced by one that says only what to fix."""
    start, end, known = _userinfo(url)
    secret = (url[start:end].partition(":")[2] if known else url[start:end]) if start < end else ""
    if any(c in secret for c in "/?#@"):
        return (
            f"remote URL {_scrub(url)!r} does not parse as meant (details withheld: they would show part of a "
            "credential; percent-encode '/', '?', '#', '@' and ':' in credentials)"
        )
    return message


def _query(url: str, scheme: str, text: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text))
    except ValueError:
        raise ConfigError(f"remote URL {_scrub(url)!r}: the query string does not parse") from None
    query: dict[str, str] = {}
    for name, value in pairs:
        if name.lower() in _QUERY_SECRETS:
            raise ConfigError(f"remote URL {_scrub(url)!r}: put credentials in the URL's userinfo, not the query")
        if name not in _QUERY[scheme]:
            raise ConfigError(
                f"remote URL {_scrub(url)!r}: unknown parameter {name!r} (accepted: {sorted(_QUERY[scheme])})"
            )
        if name in query:
            raise ConfigError(f"remote URL {_scrub(url)!r}: parameter {name!r} given twice")
        query[name] = value
    return query


def _db(url: str, text: str) -> int:
    if not text.isdigit() or len(text) > 5:
        raise ConfigError(f"remote URL {_scrub(url)!r}: the database must be a small number")
    return int(text)


def _redis(url: str, base: RemoteURL, host: str, path: str, port: int | None, query: dict[str, str]) -> RemoteURL:
    db = _db(url, query["db"]) if "db" in query else 0
    if base.scheme == "unix":
        if host or port is not None:
            raise ConfigError(f"remote URL {_scrub(url)!r}: write unix:///absolute/path.sock (no host)")
        if not path.startswith("/") or path.endswith("/"):
            raise ConfigError(f"remote URL {_scrub(url)!r}: the socket path must be absolute")
        if "@" in path:  # (a password's '@' not percent-encoded leaves its tail here)
            raise ConfigError(f"remote URL {_scrub(url)!r}: a socket path holds no '@'")
        return replace(base, path=unquote(path), db=db)
    if not host:
        raise ConfigError(f"remote URL {_scrub(url)!r} has no host")
    stripped = path.strip("/")
    if stripped:
        if "db" in query:
            raise ConfigError(f"remote URL {_scrub(url)!r}: the database is given twice")
        db = _db(url, stripped)
    ca = query.get("ca_certs")
    if ca is not None and not ca.startswith("/"):
        raise ConfigError(f"remote URL {_scrub(url)!r}: ca_certs must be an absolute path")
    return replace(base, host=host, port=port if port is not None else _REDIS_PORT, db=db, ca_certs=ca)


def _s3(url: str, base: RemoteURL, bucket: str, path: str, port: int | None, query: dict[str, str]) -> RemoteURL:
    if port is not None or not _BUCKET.match(bucket) or ".." in bucket:
        raise ConfigError(f"remote URL {_scrub(url)!r}: {bucket!r} is not a valid bucket name")
    prefix = unquote(path).strip("/")
    if not _PREFIX.match(prefix) or "//" in prefix or any(p in (".", "..") for p in prefix.split("/") if prefix):
        raise ConfigError(f"remote URL {_scrub(url)!r}: the key prefix {prefix!r} is not a plain S3 key prefix")
    endpoint = query.get("endpoint")
    if endpoint is not None:
        try:
            ep = urlsplit(endpoint)
            ep.port  # noqa: B018 (a port over 65535 raises here, not in the engine's client)
        except ValueError:
            raise ConfigError(
                f"remote URL {_scrub(url)!r}: the endpoint must be http(s)://host[:port], a port a number up to 65535"
            ) from None
        if ep.scheme not in ("http", "https") or not ep.hostname or ep.username or ep.password or ep.query:
            raise ConfigError(f"remote URL {_scrub(url)!r}: endpoint must be http(s)://host[:port] without credentials")
        endpoint = endpoint.rstrip("/")
    if (base.username is None) != (base.password is None):
        raise ConfigError(f"remote URL {_scrub(url)!r}: give both the access key id and the secret, or neither")
    region = query.get("region") or None
    if region is not None and not _REGION.match(region):
        # (it goes into each request's signature and host name: a newline or space in it
        # made the engine's client panic at every request)
        raise ConfigError(f"remote URL {_scrub(url)!r}: region must be letters, digits and '-' (us-east-1)")
    return replace(base, host=bucket, path=prefix, endpoint=endpoint, region=region)
