"""Remote URLs and settings: what parses, what is refused, the deadlines, and that a
credential never shows in a repr, a str, a message, a traceback or a log line."""

from __future__ import annotations

import logging
import pickle
import traceback

import pytest

from safejit.cache.remote import RemoteError, RemoteSettings, Secret, parse_url
from safejit.cache.remote.layout import Layout
from safejit.config import Config
from safejit.errors import ConfigError

PASSWORD = "Pa55-w0rd+/xyz"
ENCODED = "Pa55-w0rd%2B%2Fxyz"


def test_redis_url():
    url = parse_url(f"redis://writer:{ENCODED}@cache.internal:6380/2")
    assert (url.scheme, url.host, url.port, url.db, url.username) == ("redis", "cache.internal", 6380, 2, "writer")
    assert url.password is not None and url.password.reveal() == PASSWORD
    assert url.engine == "redis" and not url.tls


def test_redis_url_defaults():
    url = parse_url("redis://localhost")
    assert (url.port, url.db, url.username, url.password) == (6379, 0, None, None)


def test_rediss_url_is_tls_and_takes_a_ca_file():
    url = parse_url("rediss://:secret@cache:6379/0?ca_certs=/etc/ssl/ca.pem")
    assert url.tls and url.ca_certs == "/etc/ssl/ca.pem" and url.username is None


def test_unix_url():
    url = parse_url("unix://reader:pw@/run/valkey/valkey.sock?db=3")
    assert (url.scheme, url.path, url.db, url.username) == ("unix", "/run/valkey/valkey.sock", 3, "reader")


def test_s3_url():
    url = parse_url("s3://AKIAEXAMPLE:s3cr3t@my-bucket/fleet/cache?endpoint=http://minio:9000&region=eu-west-1")
    assert (url.host, url.path, url.endpoint, url.region, url.username) == (
        "my-bucket",
        "fleet/cache",
        "http://minio:9000",
        "eu-west-1",
        "AKIAEXAMPLE",
    )
    assert url.engine == "s3" and not url.tls
    assert parse_url("s3://my-bucket").path == ""


def test_credentials_from_the_caller():
    url = parse_url("redis://reader@cache", password=PASSWORD)
    assert url.username == "reader" and url.password is not None and url.password.reveal() == PASSWORD
    s3 = parse_url("s3://bucket-1/p", username="AKIA", password="sec", session_token="tok")
    assert s3.session_token is not None and s3.session_token.reveal() == "tok"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "http://cache",
        "redis://",
        "redis://cache/notanumber",
        "redis://cache/1?db=2",
        "redis://cache?password=x",
        "redis://cache?ssl=false",
        "redis://cache#frag",
        "redis://cache:99999",
        "rediss://cache?ca_certs=relative.pem",
        "unix://host/run/x.sock",
        "unix://relative.sock",
        "s3://UPPER",
        "s3://ab",
        "s3://bucket:9000/p",
        "s3://bucket/a//b",
        "s3://bucket/../up",
        "s3://bucket/p?endpoint=ftp://x",
        "s3://bucket/p?endpoint=http://u:p@host",
        "s3://bucket/p?endpoint=http://127.0.0.1:65536",  # (the S3 client panicked on each request)
        "s3://bucket/p?region=a&region=b",
        "s3://onlykey@bucket/p",
    ],
)
def test_bad_url_is_a_config_error(url):
    with pytest.raises(ConfigError):
        parse_url(url)


def test_password_given_twice_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        parse_url(f"redis://u:{PASSWORD}@cache", password="other")
    assert PASSWORD not in str(info.value)


def test_session_token_is_for_s3_only():
    with pytest.raises(ConfigError):
        parse_url("redis://cache", session_token="tok")


@pytest.mark.parametrize(
    "url",
    [
        f"redis://u:{ENCODED}@cache/notanumber",
        f"redis://u:{ENCODED}@cache?bogus=1",
        f"s3://u:{ENCODED}@BAD_BUCKET/p",
        f"unix://u:{ENCODED}@host/x.sock",
        f"redis://cache/0?password={ENCODED}",
        f"s3://bucket-1/p?endpoint=http://h:1&Secret_Access_Key={ENCODED}&region=x",
    ],
)
def test_config_error_messages_never_hold_the_password(url):
    with pytest.raises(ConfigError) as info:
        parse_url(url)
    text = str(info.value) + repr(info.value) + "".join(traceback.format_exception(info.value))
    assert PASSWORD not in text and ENCODED not in text


@pytest.mark.parametrize(
    "url",
    [
        "redis://sj-writer:Zx9Kq2Lm/Pw7Rt+AbC==@cache.internal:6379/0",  # base64, not percent-encoded
        "redis://w:Zx9Kq2Lm?Pw7Rt@cache:6379/0",
        "redis://w:Zx9Kq2Lm#Pw7Rt@cache:6379/0",
        "redis://w:Zx9Kq2Lm@Pw7Rt@cache:6379/x",
        "s3://AKID:Zx9Kq2Lm/Pw7Rt@bucket-1/p",
        "redis://user:Zx9Kq2Lm@ss/Pw7RtTAIL@host:6379/0",  # (the database named is the password's tail)
        "redis:/user:Zx9Kq2LmPw7Rt@host",  # (no '//')
        "redis://user:Zx9Kq2Lm?Pw7Rt=1@host",  # (a query name out of the password)
        "s3://AKID:Zx9Kq2Lm/Pw7Rt/Pw7RtMore@bucket-1/p",
        "redis://user:1234?db=Tr0ub+4dor+xyz@cache.example",  # (the query decoded: no raw piece matched)
        "s3://AKID:12/Tr0ub4dor@bucket/p",  # (a piece of two characters: the bucket 'AKID:12')
        "unix://writer:Zx9Kq2Lm@/Pw7RtTAIL@/run/valkey.sock",  # (parsed: the password's tail the socket path)
    ],
)
def test_a_credential_not_percent_encoded_never_shows_in_the_error(url):
    """urlsplit ends the host at a '/', '?' or '#' in the password and names the rest a
    port in its error: the message showed the password's start (and an '@' in it its end)."""
    with pytest.raises(ConfigError) as info:
        parse_url(url)
    text = str(info.value) + repr(info.value) + "".join(traceback.format_exception(info.value))
    assert not any(piece in text for piece in ("Zx9Kq2Lm", "Pw7Rt", "Tr0ub", "4dor", "AKID:12")), text


@pytest.mark.parametrize(
    "url",
    [
        "sj-writer:Zx9Kq2LmPw7Rt@cache.internal:6379",  # (no scheme: user:pw reads as scheme:path)
        "//sj-writer:Zx9Kq2LmPw7Rt@cache.internal:6379",
        "redis//sj-writer:Zx9Kq2LmPw7Rt@cache.internal",
        "Zx9Kq2LmPw7Rt@cache.internal",
        "ftp://u:Zx9Kq2LmPw7Rt@cache.internal",
        "redis://cache/0?passwd=Zx9Kq2LmPw7Rt",  # (a credential under a name of its own)
        "redis://cache/0?auth=Zx9Kq2LmPw7Rt&db=1",
        "redis://cache?db=0;password=Zx9Kq2LmPw7Rt",  # (';' is no separator: one value)
        "redis://cache?pass%77ord=Zx9Kq2LmPw7Rt",
        "s3://bucket-1/p?endpoint=http%3A%2F%2Fk%3AZx9Kq2LmPw7Rt%40host",
        "s3://bucket-1/p?x-amz-security-token=Zx9Kq2LmPw7Rt",
        "redis://cache:6379/0#Zx9Kq2LmPw7Rt",
        "redis://cache/0?password=ab&Zx9Kq2LmPw7Rt",  # (the tail of a value that held a '&')
        "s3://AKIAZx9Kq2LmPw7RtXYZW@bucket-1/p?bogus=1",  # (an access key id: its last four at most)
    ],
)
def test_a_credential_in_a_url_of_no_known_shape_never_shows_in_the_error(url):
    """The scheme's ':' was taken to be the first ':' (``user:pw@host`` showed the
    password), and the query was echoed unless a credential's name was one of five."""
    with pytest.raises(ConfigError) as info:
        parse_url(url)
    text = str(info.value) + repr(info.value) + "".join(traceback.format_exception(info.value))
    assert "Zx9Kq2Lm" not in text and "Pw7Rt" not in text, text


@pytest.mark.parametrize(
    "url",
    [
        "redis://writer:Zx9Kq2LmPw7Rt\uff20cache.internal:6379/0",  # (a full-width '@', as input methods type it)
        "redis://writer:Zx9Kq2LmPw7Rt\ufe6bcache.internal:6379/0",  # (a small '@')
        "rediss://writer:Zx9Kq2LmPw7Rt:6380/0",  # (the '@host' lost)
        "s3://AKID:Zx9Kq2LmPw7Rt",  # (cut off at its '@')
        "s3://AKID:Zx9Kq2LmPw7Rt/p",
    ],
)
def test_a_credential_before_no_ascii_at_never_shows_in_the_error(url):
    """With no ASCII '@' there was no userinfo to mask: urlsplit's error made the message
    quote the URL, the password in clear."""
    with pytest.raises(ConfigError) as info:
        Config(remote=url, signing_key=b"0123456789abcdef0123")
    text = str(info.value) + repr(info.value) + "".join(traceback.format_exception(info.value))
    assert "Zx9Kq2Lm" not in text and "Pw7Rt" not in text, text


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("endpoint=http://[::1", "endpoint"),  # (a bare ValueError from urlsplit)
        ("endpoint=http://127.0.0.1:1&region=us%0Aeast-1", "region"),  # (the engine's client panicked at each request)
        ("endpoint=http://127.0.0.1:1&region=us east", "region"),
    ],
)
def test_a_bad_endpoint_or_region_is_a_config_error(query, says):
    with pytest.raises(ConfigError, match=says):
        Config(remote=f"s3://bucket-1/p?{query}", signing_key=b"0123456789abcdef0123")


@pytest.mark.parametrize(
    "url",
    [
        "redis://cache.ex\u00e4mple.com:6379/0?bogus=1",
        "s3://bucket/pr\u00e4fix",
        "redis://h\u00f3st:99999/0",
        "s3://bucket/p?region=eu-w\u00e9st-1",
        "rediss://writer:p\u00e4ssw\u00f6rd:6380/0",
    ],
)
def test_a_url_with_other_than_ascii_that_does_not_parse_is_a_config_error(url):
    """One with no character that normalizes to '@' raised a bare TypeError from the
    scrubbing of its message (a max of one argument)."""
    with pytest.raises(ConfigError) as info:
        Config(remote=url, signing_key=b"0123456789abcdef0123")
    assert "p\u00e4ssw" not in str(info.value)


def test_plain_values_of_known_parameters_still_show():
    with pytest.raises(ConfigError) as info:
        parse_url("s3://bucket-1/p?endpoint=http://minio:9000&region=eu-west-1&typo=1")
    assert "endpoint=http://minio:9000&region=eu-west-1&typo=***" in str(info.value)


def test_an_s3_access_key_id_shows_its_last_four_characters_at_most():
    assert str(parse_url("s3://AKIAIOSFODNN7EXAMPLE:s3cr3t@bucket-1/p")).startswith("s3://***MPLE:***@bucket-1")
    assert str(parse_url("s3://testing:s3cr3t@bucket-1/p")).startswith("s3://***:***@bucket-1")
    assert str(parse_url("redis://writer:s3cr3t@cache")).startswith("redis://writer:***@")  # (a user: by design)


def test_secret_never_prints():
    secret = Secret(PASSWORD)
    for text in (str(secret), repr(secret), f"{secret}", f"{secret!r}", f"{secret:>20}", "%s" % secret):  # noqa: UP031 (logging formats with %)
        assert PASSWORD not in text
    assert pickle.loads(pickle.dumps(secret)).reveal() == PASSWORD
    assert secret == Secret(PASSWORD) and secret != Secret("other")


@pytest.mark.parametrize(
    "url",
    [
        f"redis://writer:{ENCODED}@cache:6379/0",
        f"rediss://:{ENCODED}@cache:6379/0",
        f"unix://writer:{ENCODED}@/run/v.sock",
        f"s3://AKIA:{ENCODED}@bucket-1/prefix?endpoint=http://127.0.0.1:9000",
    ],
)
def test_url_and_settings_reprs_redact_the_password(url):
    settings = RemoteSettings.from_url(url)
    for text in (str(settings.url), repr(settings.url), repr(settings), str(settings), f"{settings}"):
        assert PASSWORD not in text and ENCODED not in text
        assert "***" in text
    assert pickle.loads(pickle.dumps(settings)) == settings


def test_redaction_masks_the_credentials_in_any_text():
    settings = RemoteSettings.from_url("s3://bucket-1/p", username="AKIA", password=PASSWORD, session_token="TOKEN123")
    assert settings.redact(f"failed with {PASSWORD} and TOKEN123 at //u:{PASSWORD}@h") == (
        "failed with *** and *** at //u:***@h"
    )


def test_redis_url_str_round_trips():
    for text in ("redis://cache:6379/0", "rediss://cache:6380/1?ca_certs=/ca.pem", "unix:///run/v.sock?db=2"):
        assert str(parse_url(text)) == text


def test_deadline_scales_with_size_between_floor_and_cap():
    settings = RemoteSettings.from_url("redis://cache")
    assert settings.deadline(0) == 0.05
    assert settings.deadline(1 << 20) == 0.05
    assert settings.deadline(100_000_000) == pytest.approx(0.5)
    assert settings.deadline(10**12) == 2.0
    assert RemoteSettings.from_url("s3://bucket-1").deadline(0) == 0.5
    assert RemoteSettings.from_url("s3://bucket-1", timeout_s=0.2).deadline(0) == 0.2


def test_defaults():
    settings = RemoteSettings.from_url("redis://cache")
    assert settings.connect_timeout_s == 0.1
    assert settings.compress_min_bytes == 64 << 10
    assert settings.lease_ttl_s == 30.0
    assert settings.breaker.probe_interval_s == 5.0


@pytest.mark.parametrize(
    "field",
    [
        {"connect_timeout_s": 0},
        {"timeout_s": -1},
        {"timeout_s": float("nan")},
        {"timeout_max_s": 0.01},
        {"max_bytes": 0},
        {"index_cap": True},
        {"head_max_bytes": -1},
        {"head_max_bytes": True},
        {"head_max_bytes": 1.5},
        {"compress_level": 30},
        {"lease_ttl_s": float("inf")},
        {"lease_ttl_s": 100000.0},  # (past what a lease command takes: refused here, not at the first miss)
        {"lease_ttl_s": 0.0005},
        {"no_such_setting": 1},
    ],
)
def test_bad_setting_is_a_config_error(field):
    with pytest.raises(ConfigError):
        RemoteSettings.from_url("redis://cache", **field)


@pytest.mark.parametrize("tenant", ["", "T1", "t1:x", "t1*", "t1/x", "-t", "a" * 64])
def test_tenant_that_could_reach_another_namespace_is_refused(tenant):
    with pytest.raises(ValueError):
        Layout(tenant, "cuda")


def test_auth_failure_from_a_real_server_never_shows_the_password(redis_server, make_store, caplog):
    redis_server.admin().execute_command("ACL", "SETUSER", "writer", "on", ">right-password", "~*", "+@all")
    store = make_store(f"redis://writer:{ENCODED}@127.0.0.1:{redis_server.port}/0")
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(RemoteError) as info:
            store.index("a" * 64)
    assert info.value.reason == "denied"
    err = info.value
    shown = str(err) + repr(err) + "".join(traceback.format_exception(err)) + caplog.text + repr(store)
    assert PASSWORD not in shown and ENCODED not in shown
    assert pickle.loads(pickle.dumps(err)).reason == "denied"


def test_failures_against_unreachable_remotes_never_show_the_password(make_store, caplog):
    from ._servers import free_port

    port = free_port()
    urls = [
        f"redis://writer:{ENCODED}@127.0.0.1:{port}/0",
        f"s3://AKIA:{ENCODED}@bucket-1/p?endpoint=http://127.0.0.1:{port}&region=us-east-1",
    ]
    for url in urls:
        store = make_store(url)
        with caplog.at_level(logging.DEBUG):
            with pytest.raises(RemoteError) as info:
                store.index("a" * 64)
        assert info.value.reason == "refused"
        shown = str(info.value) + repr(info.value) + "".join(traceback.format_exception(info.value)) + caplog.text
        assert PASSWORD not in shown and ENCODED not in shown


def test_deadline_classes_are_few_and_never_shorter_than_the_deadline():
    settings = RemoteSettings.from_url("redis://cache")
    sizes = [0, 1, 10 << 20, 20 << 20, 50 << 20, 100 << 20, 300 << 20, 1 << 30]
    classes = [settings.deadline_class(n) for n in sizes]
    assert classes == [0.05, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert all(c >= settings.deadline(n) for c, n in zip(classes, sizes, strict=True))


def test_an_index_entry_is_named_by_its_deps_key_and_signer():
    from safejit.cache.remote.layout import _KEY_ID, entry_name, split_entry
    from safejit.policy import trust

    assert _KEY_ID.pattern == trust._KEY_ID.pattern  # (the key ids a signer may have)
    d = "ab" * 32
    assert entry_name(d) == d and split_entry(d) == (d, "")
    named = entry_name(d, "ed25519-0123456789abcdef")
    assert named == f"{d}.ed25519-0123456789abcdef" and split_entry(named) == (d, "ed25519-0123456789abcdef")
    for bad in ("", d[:63], d.upper(), d + ".", d + "x", d + ".-x", d + ".a/b", d + "." + "k" * 129, "z" * 64):
        assert split_entry(bad) is None, bad
    for deps, key_id in ((d[:63], ""), (d, "a b"), (d, ".x"), (d, "k" * 129)):
        with pytest.raises(ValueError):
            entry_name(deps, key_id)
    assert Layout("t", "cuda").s3_idx(d, named).endswith(f"/idx/{d}/{named}.json")
    with pytest.raises(ValueError):
        Layout("t", "cuda").s3_idx(d, "../x")
