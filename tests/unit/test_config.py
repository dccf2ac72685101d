"""Config validates everything it can at construction."""

from __future__ import annotations

import dataclasses

import pytest

import safejit
from safejit import Config
from safejit.errors import ConfigError

KEY = b"k" * 32


def test_a_short_signing_key_is_refused_by_config():
    with pytest.raises(safejit.ConfigError, match="at least 16"):
        safejit.Config(signing_key=b"short")
    with pytest.raises(safejit.ConfigError):
        safejit.Config(signing_key="a string key, not bytes")  # type: ignore[arg-type]


def test_require_signed_defaults_to_whether_a_key_is_set():
    assert safejit.Config().require_signed is False
    assert safejit.Config(signing_key=KEY).require_signed is True
    assert safejit.Config(signing_key=KEY, require_signed=False).require_signed is False
    with pytest.raises(safejit.ConfigError, match=r"needs Config\.signing_key or Config\.verify_keys"):
        safejit.Config(require_signed=True)


def test_a_key_without_require_signed_reads_unsigned_leaves_and_writes_signed_ones(make_runtime, cache_dir):
    src = safejit.Source("#define V 3\n", "v")
    unsigned = make_runtime(backend="fake")
    unsigned.compile(src)
    mixed = make_runtime(backend="fake", signing_key=KEY, require_signed=False)
    assert mixed.compile(src).artifact.tier == "disk"  # the unsigned leaf is read
    strict = make_runtime(backend="fake", signing_key=KEY)
    assert strict.compile(src).artifact.tier == "compiled"  # not under require_signed: rebuilt, signed
    assert make_runtime(backend="fake", signing_key=KEY).compile(src).artifact.tier == "disk"
    other = make_runtime(backend="fake", signing_key=b"o" * 32, require_signed=False)
    # A signed leaf must verify, whatever require_signed says: another key's is a miss.
    explained = other.explain(src)
    assert explained.result == "miss" and explained.miss == "unknown_key"
    assert other.compile(src).artifact.tier == "compiled"


def test_relative_roots_mean_where_the_config_was_made_whatever_the_process_does_after(tmp_path, monkeypatch):
    """A relative cache or source root is made absolute when the Config is made (a later
    chdir used to move the cache, resolved at the first compile, and each compile's
    source roots with it); ``~`` is expanded then too."""
    here, there = tmp_path / "here", tmp_path / "there"
    for d in (here / "src" / "include", there / "src" / "include"):
        d.mkdir(parents=True)
    (here / "src" / "include" / "v.h").write_text("#define V 3\n")
    (there / "src" / "include" / "v.h").write_text("#define V 4\n")
    monkeypatch.chdir(here)
    monkeypatch.setenv("HOME", str(there))
    cfg = safejit.Config(backend="fake", cache_dirs=("cache", "~/ro"), source_roots=("src",))
    assert cfg.cache_dirs == (str(here / "cache"), str(there / "ro")) and cfg.source_roots == (str(here / "src"),)
    assert dataclasses.replace(cfg, tenant="t2").cache_dirs == cfg.cache_dirs  # (made again: unchanged)
    monkeypatch.chdir(there)
    with safejit.Runtime(config=cfg) as rt:
        mod = rt.compile(safejit.Source('#include "v.h"\n', "V"), include_dirs=(str(here / "src" / "include"),))
        assert mod.kernel("V")() == 3
    assert (here / "cache").is_dir() and not (there / "cache").exists()
    with safejit.Runtime(config=cfg) as rt, pytest.raises(safejit.PathConfinementError):
        rt.compile(safejit.Source('#include "v.h"\n', "V"), include_dirs=(str(there / "src" / "include"),))


def test_a_relative_root_without_a_working_directory_is_a_config_error(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(safejit.ConfigError, match="no working directory"):
        safejit.Config(cache_dirs=("cache",))
    assert safejit.Config(cache_dirs=(str(tmp_path / "abs"),)).cache_dirs == (str(tmp_path / "abs"),)


@pytest.mark.parametrize(
    "field, value",
    [
        ("trust_stat", "false"),  # (true to Python: the unsafe way round for trust_stat)
        ("nvrtc_worker", "0"),
        ("trace_memory_hits", "no"),
        ("tenant", None),
        ("memory_max_entries", 1.5),
        ("max_deps", 0.5),
        ("memory_max_bytes", True),
        ("inventory", 5),
        ("host_cc", 5),
        ("nvcc", b"/usr/local/cuda/bin/nvcc"),
    ],
)
def test_a_field_of_the_wrong_type_is_a_config_error_naming_it(field, value):
    """Switches given as text were taken as true, counts as fractions; names and paths of
    another type passed Config and failed at the first compile with a raw TypeError."""
    with pytest.raises(safejit.ConfigError, match=f"Config.{field} must be"):
        safejit.Config(**{field: value})


def test_a_count_too_large_for_a_float_is_no_overflow():
    assert safejit.Config(memory_max_entries=10**400).memory_max_entries == 10**400


@pytest.mark.parametrize("field", ["inventory", "nvcc", "ascend_home", "host_cc", "host_cxx"])
def test_an_empty_path_is_unset_as_it_always_was(field, monkeypatch):
    """A variable set to nothing unsets it (CI, containers): since the type checks it was
    refused, and every Runtime() with it."""
    assert getattr(safejit.Config(**{field: ""}), field) is None
    monkeypatch.setenv(f"SAFEJIT_{field.upper()}", "")
    assert getattr(safejit.Config.from_env(), field) is None


def test_a_whole_number_written_as_a_float_is_a_count():
    config = safejit.Config(memory_max_bytes=2e9, max_artifact_bytes=1e9)
    assert (config.memory_max_bytes, config.max_artifact_bytes) == (2_000_000_000, 1_000_000_000)
    assert type(config.memory_max_bytes) is int


def test_a_default_cache_root_that_is_not_utf8_is_a_config_error(tmp_path, monkeypatch):
    """An explicit root that is not UTF-8 was refused, the default one (XDG_CACHE_HOME)
    taken: published to, and every later disk hit raised UnicodeEncodeError."""
    import os

    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/xdg\xff")
    monkeypatch.setenv("XDG_CACHE_HOME", bad)
    with pytest.raises(safejit.ConfigError, match="not UTF-8"):
        safejit.Config().resolved_cache_dirs()


@pytest.mark.parametrize("tenant", ["tmp", "locks", "quarantine", "tools", "usage"])
def test_a_tenant_named_as_one_of_the_caches_own_directories_is_refused(tenant, tmp_path):
    """Its leaves landed in the cache's own directories (v1/tools/...): listed nowhere,
    and removed by gc whatever their age."""
    with pytest.raises(ConfigError, match="reserved"):
        Config(tenant=tenant, cache_dirs=(str(tmp_path / "c"),))
    assert not (tmp_path / "c").exists()


def _s3(cfg_url: str) -> Config:
    return Config(remote=cfg_url, backend="fake")


def test_credentials_in_the_url_win_over_the_environment(monkeypatch):
    """With AWS_* set (CI runners, laptops) and a key in the URL, every compile raised
    ConfigError ("a password is given both in the URL and by the caller"), and an
    AWS_SESSION_TOKEN was attached to the URL's key."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVENVENVENVENV1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
    url = _s3("s3://AKIAURLURLURLURLURL2:url-secret@bucket-1/p").remote_settings(env=True).url
    assert (url.username, url.password.reveal(), url.session_token) == ("AKIAURLURLURLURLURL2", "url-secret", None)
    monkeypatch.setenv("SAFEJIT_REMOTE_PASSWORD", "env-password")
    monkeypatch.setenv("SAFEJIT_REMOTE_USERNAME", "env-user")
    url = Config(remote="redis://writer:url-password@cache").remote_settings(env=True).url
    assert (url.username, url.password.reveal()) == ("writer", "url-password")
    with pytest.raises(ConfigError, match="username"):  # (whose password: the URL's user's, or env-user's?)
        Config(remote="redis://writer@cache")
    monkeypatch.setenv("SAFEJIT_REMOTE_USERNAME", "writer")
    url = Config(remote="redis://writer@cache").remote_settings(env=True).url  # (what the URL lacks)
    assert (url.username, url.password.reveal()) == ("writer", "env-password")
    url = Config(remote="redis://:url-password@cache").remote_settings(env=True).url  # (no user in the URL)
    assert (url.username, url.password.reveal()) == ("writer", "url-password")


def test_aws_variables_apply_as_a_pair_with_their_token(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVENVENVENVENV1")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
    url = _s3("s3://bucket-1/p").remote_settings(env=True).url  # (a key without its secret: none)
    assert (url.username, url.password, url.session_token) == (None, None, None)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    url = _s3("s3://bucket-1/p").remote_settings(env=True).url
    assert (url.username, url.password.reveal(), url.session_token.reveal()) == (
        "AKIAENVENVENVENVENV1",
        "env-secret",
        "env-token",
    )


def test_a_runtime_with_url_and_env_credentials_compiles(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVENVENVENVENV1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    rt = safejit.Runtime(
        config=Config(
            backend="fake",
            remote="s3://AKIAURLURLURLURLURL2:url-secret@bucket-1/p?endpoint=http://127.0.0.1:9&region=x",
            cache_dirs=(str(tmp_path / "c"),),
            remote_connect_timeout_s=0.05,
            signing_key=b"a-fleet-hmac-key-0123456789",
        )
    )
    try:
        assert rt.compile(safejit.Source("#define V 1\n", "v")) is not None  # (the remote is down: a miss)
    finally:
        rt.close()


def test_a_runtime_with_a_remote_needs_keys_to_check_its_leaves(tmp_path):
    """A remote leaf is used only when signed by a key the node trusts: a Runtime given a
    remote and no key, or one that uploads (read-write) without a signing key, is refused
    before anything is asked of the remote (without a key any writer of the keyspace chose
    the bytes every node loaded). A remote that is off needs none; the Config alone (the
    operator commands, which load nothing) is accepted."""
    url = "redis://127.0.0.1:9/0"
    cache = (str(tmp_path / "c"),)
    reader_keys = (("k1", bytes(32)),)
    with pytest.raises(ConfigError, match=r"Config\.remote needs the keys its leaves are signed with"):
        safejit.Runtime(config=Config(backend="fake", remote=url, cache_dirs=cache))
    with pytest.raises(ConfigError, match=r"'read-write' needs Config\.signing_key"):
        safejit.Runtime(config=Config(backend="fake", remote=url, cache_dirs=cache, verify_keys=reader_keys))
    assert Config(remote=url).remote == url
    for cfg in (
        Config(backend="fake", remote=url, cache_dirs=cache, verify_keys=reader_keys, remote_mode="read-only"),
        Config(backend="fake", remote=url, cache_dirs=cache, signing_key=b"a-fleet-hmac-key-0123456789"),
        Config(backend="fake", remote=url, cache_dirs=cache, remote_mode="off"),
    ):
        safejit.Runtime(config=cfg).close()
    assert not (tmp_path / "c").exists()  # (refused before anything was made)


def test_an_s3_key_in_the_url_takes_its_secret_from_the_environment(monkeypatch):
    """What the CLI's warning says to do (the secret in SAFEJIT_REMOTE_PASSWORD) was refused
    ("give both the access key id and the secret"), the key id shown whole."""
    monkeypatch.setenv("SAFEJIT_REMOTE_PASSWORD", "env-secret")
    url = _s3("s3://AKIAURLURLURLURLURL2@bucket-1/p").remote_settings(env=True).url
    assert (url.username, url.password.reveal()) == ("AKIAURLURLURLURLURL2", "env-secret")


def test_credentials_of_another_engine_in_the_environment_do_not_stop_a_config(monkeypatch):
    monkeypatch.setenv("SAFEJIT_REMOTE_SESSION_TOKEN", "s3-token")  # (S3's: a Redis URL takes none)
    assert Config(remote="redis://cache").remote_settings(env=True).url.session_token is None
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVENVENVENVENV1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "aws-token")
    url = _s3("s3://bucket-1/p").remote_settings(env=True).url
    assert url.session_token.reveal() == "aws-token"  # (the pair's own, never safejit's)
