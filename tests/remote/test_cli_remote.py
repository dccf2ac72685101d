"""The operator's command line for a remote cache, on the session's real servers:
``safejit warm --remote`` filling the remote (real worker processes), ``safejit remote
stats|ls|verify`` on Valkey and on moto's S3, the tamper matrix as findings, a down
server as a one-line error, a read-only auditor that writes nothing, hostile manifests
shown escaped and bounded, credentials never shown."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

import safejit
from safejit.cache.leaf import decode_manifest, encode_manifest
from safejit.cli import main
from safejit.cli._out import Out
from safejit.policy.trust import Ed25519Signer

from ._servers import free_port
from .test_acl import create_users
from .test_tier import TAMPERS, _rewrite

SRC = safejit.Source('#include "inner.h"\n#define VALUE 7\n', "k")
SIGNER = Ed25519Signer.generate()


@dataclass(frozen=True)
class Ran:
    rc: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


def cli(*args: str, width: int = 100) -> Ran:
    """``safejit ARGS`` in this process (the environment as the test set it)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = main(list(args), out=Out(stdout, stderr, use_rich=False, width=width))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    ran = Ran(rc, stdout.getvalue(), stderr.getvalue())
    assert "Traceback" not in ran.out + ran.err and "internal error" not in ran.err, ran
    return ran


@pytest.fixture
def env(monkeypatch, project):
    """The environment of a fleet's operator: the fake backend, the project declared,
    the builder's public key trusted."""
    monkeypatch.setenv("SAFEJIT_BACKEND", "fake")
    monkeypatch.setenv("SAFEJIT_SOURCE_ROOTS", str(project))
    monkeypatch.setenv("SAFEJIT_VERIFY_KEYS", f"{SIGNER.key_id}={SIGNER.public_key.hex()}")
    return monkeypatch


def _inc(project: Path) -> tuple[str, ...]:
    return (str(project / "include"),)


def _publish(rt: safejit.Runtime, project: Path, *names: str) -> list[safejit.Artifact]:
    made = [rt.compile(safejit.Source(SRC.code, name), include_dirs=_inc(project)).artifact for name in names]
    assert rt.flush_uploads(10).done
    return made


# -- warm --remote ------------------------------------------------------------------------
@pytest.fixture
def inventory(tmp_path, project) -> Path:
    """An inventory of two requests, recorded on a machine with no remote."""
    path = tmp_path / "inventory.jsonl"
    cfg = safejit.Config(
        backend="fake", cache_dirs=(str(tmp_path / "recorder"),), source_roots=(str(project),), inventory=str(path)
    )
    with safejit.Runtime(config=cfg) as rt:
        for name in ("alpha", "beta"):
            rt.compile(safejit.Source(SRC.code, name), include_dirs=_inc(project))
    return path


def _signed(tmp_path: Path) -> tuple[str, str]:
    """``--signing-key FILE``, the builder's key written to a file."""
    key = tmp_path / "builder.pem"
    key.write_bytes(SIGNER.private_pem())
    return ("--signing-key", str(key))


def _warm(tmp_path: Path, inventory: Path, disk: str, *more: str) -> Ran:
    (tmp_path / disk).mkdir(exist_ok=True)
    return cli("warm", str(inventory), "-j", "2", "--cache-dir", str(tmp_path / disk), *more)


def test_warm_remote_fills_the_remote_and_another_node_hits_it(env, tmp_path, inventory, redis_server, node, project):
    key = tmp_path / "builder.pem"
    key.write_bytes(SIGNER.private_pem())
    first = _warm(tmp_path, inventory, "builder", "--remote", redis_server.url, "--signing-key", str(key))
    assert first.rc == 0, first
    lines = first.out.splitlines()
    assert lines[0].split() == ["KERNEL", "RESULT", "UPLOAD"]
    assert lines[1].split() == ["alpha", "compiled", "uploaded"] and lines[2].split() == [
        "beta",
        "compiled",
        "uploaded",
    ]
    assert lines[-1] == "2 requests: compiled 2; uploads: uploaded 2"
    assert len(redis_server.admin().keys("sj:v1:default:fake:idx:*")) == 2
    # A second node (its own disk), through SAFEJIT_REMOTE: both are remote hits, nothing to upload.
    env.setenv("SAFEJIT_REMOTE", redis_server.url)
    second = _warm(tmp_path, inventory, "node-2", "--remote", "--json", "--signing-key", str(key))
    assert second.rc == 0, second
    results = {r["name"]: r for r in second.json()["results"]}
    assert {(r["result"], r["upload"]) for r in results.values()} == {("remote", None)}
    assert set(results["alpha"]) == {"name", "tenant", "result", "detail", "upload", "upload_reason", "upload_detail"}
    # An application on a third node gets it from the remote too:
    reader = node("3", remote_mode="read-only", verify_keys={SIGNER.key_id: SIGNER.public_key})
    mod = reader.compile(safejit.Source(SRC.code, "alpha"), include_dirs=_inc(project))
    assert mod.artifact.tier == "remote"


def test_warm_remote_uploads_disk_hits_the_remote_lacks(env, tmp_path, inventory, redis_server):
    key = tmp_path / "builder.pem"
    key.write_bytes(SIGNER.private_pem())
    signed = ("--signing-key", str(key))
    assert _warm(tmp_path, inventory, "builder", *signed).out.splitlines()[-1] == "2 requests: built 2"  # (no remote)
    ran = _warm(tmp_path, inventory, "builder", "--remote", redis_server.url, *signed)
    assert ran.rc == 0 and "2 requests: disk hit 2; uploads: uploaded 2" in ran.out, ran
    again = _warm(tmp_path, inventory, "builder", "--remote", redis_server.url, *signed)
    assert "2 requests: disk hit 2; uploads: already there 2" in again.out, again


def test_warm_remote_needs_a_signing_key_and_uploads_nothing_without(env, tmp_path, inventory, redis_server):
    """A remote leaf is used only when signed: ``warm --remote`` without ``--signing-key``
    stops before the remote is asked anything, and writes nothing there."""
    env.delenv("SAFEJIT_VERIFY_KEYS")  # (the recorder did not sign: its leaves are used only so)
    ran = _warm(tmp_path, inventory, "recorder", "--remote", redis_server.url)
    assert ran.rc == 2 and "--remote needs --signing-key" in ran.err, ran
    assert redis_server.admin().keys("sj:v1:*") == []


def test_a_bad_signing_key_file_is_named_with_the_flag_and_what_is_wrong(env, tmp_path, inventory, redis_server):
    """A missing key file said only "No such file or directory: missing.key"; an encrypted
    PEM "does not parse: TypeError", a public key "...: ValueError"."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"a passphrase"),
        )
    )
    public = tmp_path / "public.pem"
    public.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for path, says in (
        (tmp_path / "missing.key", "No such file or directory"),
        (tmp_path, "Is a directory"),
        (encrypted, "is encrypted"),
        (public, "not a public key"),
    ):
        ran = _warm(tmp_path, inventory, "builder", "--remote", redis_server.url, "--signing-key", str(path))
        assert ran.rc == 2 and f"--signing-key {path}: " in ran.err and says in ran.err, ran
        assert "Error" not in ran.err, ran
    assert redis_server.admin().keys("sj:v1:*") == []


def test_warm_remote_reports_each_refused_upload_and_fails(env, tmp_path, inventory, redis_server):
    create_users(redis_server.admin(), "default")
    reader = f"redis://sj-default-reader:default-reader-pw@127.0.0.1:{redis_server.port}/0"
    ran = _warm(tmp_path, inventory, "builder", "--remote", reader, *_signed(tmp_path))
    assert ran.rc == 1, ran
    assert ran.out.splitlines()[1].split() == ["alpha", "compiled", "failed:", "denied"]
    assert "upload of alpha (tenant default): failed: denied: remote redis put_blob: denied (" in ran.out
    assert (
        "default-reader-pw" not in ran.out + ran.err
        and "***"
        in _warm(
            tmp_path,
            inventory,
            "builder",
            "--remote",
            reader.replace(f":{redis_server.port}", f":{free_port()}"),
            *_signed(tmp_path),
        ).err
    )


def test_warm_remote_needs_a_remote_that_answers(env, tmp_path, inventory):
    signed = _signed(tmp_path)
    assert _warm(tmp_path, inventory, "b", "--remote", *signed).err.startswith("error: --remote needs a URL")
    started = time.monotonic()
    down = _warm(tmp_path, inventory, "b", "--remote", f"redis://127.0.0.1:{free_port()}/0", *signed)
    assert down.rc == 2 and down.out == "" and "refused" in down.err and len(down.err.splitlines()) == 1
    assert time.monotonic() - started < 5  # (nothing compiled: no worker started)


# -- stats, ls, verify on both engines ----------------------------------------------------
@pytest.fixture
def filled(env, engine_url, node, project):
    """Two signed leaves on the engine, and a lease held."""
    builder = node("builder", remote=engine_url, signing_key=SIGNER.private_pem())
    made = _publish(builder, project, "alpha", "beta")
    lease = builder._init()[0].remote.store.acquire_lease(made[0].build_key, holder="builder")
    assert lease is not None
    return engine_url, made


def test_stats_counts_keys_leaves_blobs_and_leases(filled):
    url, made = filled
    report = cli("remote", "stats", "--remote", url, "--json").json()
    keys = ("build_keys", "leaves", "blobs", "heads", "leases_held", "complete", "breaker")
    assert {k: report[k] for k in keys} == {
        "build_keys": 2,
        "leaves": 2,
        "blobs": 1,  # (both kernels compile to the same bytes: one blob)
        "heads": 2 if url.startswith("redis") else 0,  # (each build key's first artifact, again)
        "leases_held": 1,
        "complete": True,
        "breaker": "closed",
    }
    assert report["blob_bytes"] > made[0].size and report["round_trip_ms"] > 0
    assert report["head_bytes"] == (2 * (report["blob_bytes"] + 32) if report["heads"] else 0)
    assert (report["tenant"], report["backend"], report["engine"]) == ("default", "fake", url.split(":")[0])
    text = cli("remote", "stats", "--remote", url)
    assert text.rc == 0 and "  build keys   2" in text.out and "  leases held  1" in text.out
    bounded = cli("remote", "stats", "--remote", url, "--limit", "1")
    assert "counts are lower bounds" in bounded.out and "  build keys   1" in bounded.out


def test_ls_lists_ids_kernels_sizes_signers(filled):
    url, made = filled
    ran = cli("remote", "ls", "--remote", url)
    assert ran.rc == 0, ran
    rows = [line.split() for line in ran.out.splitlines()]
    assert rows[0] == ["ID", "KERNEL", "SIZE", "SIGNER", "CREATED"]
    ids = {a.build_key[:8] + a.deps_key[:4] for a in made}
    assert {r[0] for r in rows[1:3]} == ids and [r[1] for r in rows[1:3]] == ["alpha", "beta"]
    assert rows[1][4] == SIGNER.key_id
    listed = cli("remote", "ls", "--remote", url, "--json").json()
    assert set(listed) == {"remote", "engine", "tenant", "backend", "limit", "complete", "leaves", "findings"}
    leaf = listed["leaves"][0]
    assert set(leaf) == {"id", "build_key", "deps_key", "entry", "kernel", "bytes", "digest", "signer", "created"}
    assert leaf["entry"] == leaf["deps_key"]  # (the first signer's entry: the bare deps key)
    assert leaf["signer"] == {"alg": "ed25519", "key_id": SIGNER.key_id} and leaf["bytes"] == made[0].size
    one = cli("remote", "ls", "--remote", url, "--limit", "1")
    assert "stopped at 1 leaves (--limit): there are more" in one.out


def test_verify_passes_signed_leaves_and_with_local_checks_this_machines_files(filled, project, env):
    url, _ = filled
    ran = cli("remote", "verify", "--remote", url)
    assert ran.rc == 0 and "2/2 remote leaves verify" in ran.out, ran
    assert cli("remote", "verify", "--remote", url, "--local").rc == 0
    (project / "include" / "inner.h").write_text("#define INNER 9\n")  # this machine's header differs
    assert cli("remote", "verify", "--remote", url).rc == 0  # (nothing local is looked at)
    local = cli("remote", "verify", "--remote", url, "--local", "--json")
    assert local.rc == 1
    report = local.json()
    assert (report["local"], report["checked"], report["verified"]) == (True, 2, 0)
    assert {f["reason"] for f in report["findings"]} == {"dep_changed"}
    env.delenv("SAFEJIT_VERIFY_KEYS")
    untrusted = cli("remote", "verify", "--remote", url)
    assert untrusted.rc == 1 and "unknown_key" in untrusted.out and "no verify_keys configured" in untrusted.out


# -- the tamper matrix ----------------------------------------------------------------------
#: What ``remote verify`` names for each tampering of test_tier's matrix. The leaves are
#: signed: a manifest rewritten in place fails its signature before anything else is
#: checked; one moved, or whose listed closure was changed, names another leaf first.
VERIFY_REASONS = {
    "flipped byte in the blob and the head": {"artifact"},
    "blob and head swapped for another": {"artifact"},
    "manifest under another build key": {"mismatch"},
    "manifest under another deps key": {"mismatch"},
    "manifest of another tenant": {"mismatch"},
    "closure digest that differs from the local file": {"mismatch"},
    "oversize artifact": {"signature"},
    "compression bomb": {"signature"},
    "manifest that is not JSON": {"manifest"},
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_a_tampered_remote_leaf_is_a_finding(env, node, project, redis_server, tamper):
    _publish(node("a", signing_key=SIGNER.private_pem()), project, "k")
    TAMPERS[tamper][0](redis_server)
    ran = cli("remote", "verify", "--remote", redis_server.url, "--json")
    assert ran.rc == 1, ran
    assert {f["reason"] for f in ran.json()["findings"]} == VERIFY_REASONS[tamper]


def test_an_unsigned_leaf_is_a_finding_under_verify_keys(env, node, project, redis_server):
    _publish(node("a", signing_key=SIGNER.private_pem()), project, "k")
    _rewrite(redis_server, lambda d: d.pop("signature"))  # (a writer without the key: no uploader makes one)
    ran = cli("remote", "verify", "--remote", redis_server.url)
    assert ran.rc == 1 and "unsigned: the leaf is not signed" in ran.out and "0/1 remote leaves verify" in ran.out


def test_verify_and_ls_on_s3_find_a_flipped_blob(env, node, project, s3_url, s3_client):
    (art,) = _publish(node("a", remote=s3_url, signing_key=SIGNER.private_pem()), project, "k")
    prefix = s3_url.split("/")[3].split("?")[0]
    key = f"{prefix}/v1/default/cas/{art.digest[:2]}/{art.digest}"
    blob = bytearray(s3_client.get_object(Bucket="sj-remote-tests", Key=key)["Body"].read())
    blob[-1] ^= 0xFF
    s3_client.put_object(Bucket="sj-remote-tests", Key=key, Body=bytes(blob))
    assert cli("remote", "ls", "--remote", s3_url).rc == 0
    ran = cli("remote", "verify", "--remote", s3_url, "--json")
    assert ran.rc == 1 and [f["reason"] for f in ran.json()["findings"]] == ["artifact"]


# -- a remote that is down ----------------------------------------------------------------
@pytest.mark.parametrize("engine", ["redis", "s3"])
@pytest.mark.parametrize("command", ["stats", "ls", "verify"])
def test_a_down_server_is_one_line_and_exit_2_within_the_connect_timeout(env, command, engine):
    port = free_port()
    url = {
        "redis": f"redis://sj:hunter2-secret@127.0.0.1:{port}/0",
        "s3": f"s3://testing:hunter2-secret@b-down?endpoint=http://127.0.0.1:{port}&region=us-east-1",
    }[engine]
    started = time.monotonic()
    ran = cli("remote", command, "--remote", url)
    assert time.monotonic() - started < 1.0  # (connect: 100 ms; nothing listens: refused at once)
    # (the password on the command line is warned of first)
    warning, error = ran.err.splitlines()
    assert warning.startswith("warning: ") and "SAFEJIT_REMOTE_PASSWORD" in warning
    assert ran.rc == 2 and ran.out == ""
    assert error.startswith("error: ") and "refused" in error
    assert "hunter2-secret" not in ran.err and "***" in ran.err


def test_no_remote_configured_is_an_error(env):
    ran = cli("remote", "ls")
    assert ran.rc == 2 and "no remote: give --remote URL, or set SAFEJIT_REMOTE" in ran.err


# -- read-only: the auditor ---------------------------------------------------------------
WRITES = ("set", "setnx", "hset", "hsetnx", "del", "unlink", "pexpire", "expire", "eval", "evalsha", "flushall")


def test_the_auditor_runs_stats_ls_and_verify_and_nothing_is_written(env, node, project, redis_server):
    _publish(node("a", signing_key=SIGNER.private_pem()), project, "alpha", "beta")
    admin = redis_server.admin()
    create_users(admin, "default")
    auditor = f"redis://sj-default-auditor:default-auditor-pw@127.0.0.1:{redis_server.port}/0"
    before = {k: admin.dump(k) for k in admin.keys("*")}
    admin.config_resetstat()
    assert cli("remote", "stats", "--remote", auditor).rc == 0
    assert cli("remote", "ls", "--remote", auditor).rc == 0
    verified = cli("remote", "verify", "--remote", auditor, "--local")
    assert verified.rc == 0 and "2/2 remote leaves verify" in verified.out, verified
    used = {name.removeprefix("cmdstat_") for name in admin.info("commandstats")}
    assert used & set(WRITES) == set() and "scan" in used and "getrange" in used
    assert {k: admin.dump(k) for k in admin.keys("*")} == before
    # A node's reader may not list keys (SCAN would show every tenant's key names):
    reader = f"redis://sj-default-reader:default-reader-pw@127.0.0.1:{redis_server.port}/0"
    denied = cli("remote", "ls", "--remote", reader)
    assert denied.rc == 2 and "denied" in denied.err and "default-reader-pw" not in denied.err


# -- hostile manifests --------------------------------------------------------------------
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\u202e" + "A" * 60_000


def test_hostile_manifests_are_shown_escaped_and_bounded(env, node, project, redis_server):
    (art,) = _publish(node("a", signing_key=SIGNER.private_pem()), project, "k")
    admin = redis_server.admin()
    index = f"sj:v1:default:fake:idx:{art.build_key}"
    man = decode_manifest(admin.hget(index, art.deps_key))
    signature = msgspec.structs.replace(man.signature, key_id="\x1b[31m" + "K" * 120)
    planted = msgspec.structs.replace(man, name=HOSTILE, signature=signature)
    admin.hset(index, "e" * 64, encode_manifest(msgspec.structs.replace(planted, deps_key="e" * 64)))
    admin.hset(index, "f" * 64, b'{"name": "\\u001b[2J' + b"B" * 5000 + b'", "schema": 2}')
    for command in ("ls", "verify"):
        ran = cli("remote", command, "--remote", redis_server.url)
        assert ran.rc == 1, ran
        assert "\x1b" not in ran.out + ran.err and "\u202e" not in ran.out
        assert max(len(line) for line in ran.out.splitlines()) < 600
        as_json = cli("remote", command, "--remote", redis_server.url, "--json")
        assert "\x1b" not in as_json.out and len(as_json.out) < 20_000
    listed = cli("remote", "ls", "--remote", redis_server.url, "--json").json()
    kernels = {leaf["kernel"] for leaf in listed["leaves"]}
    assert "k" in kernels and None in kernels  # (the undecodable one: listed, and a finding)
    (long,) = [k for k in kernels if k and len(k) > 1]
    assert long.startswith("\x1b]0;pwned") and len(long) <= 201
    shown = cli("remote", "ls", "--remote", redis_server.url).out
    assert "\\x1b]0;pwned\\x07" in shown and "\\u202e" in shown
    findings = cli("remote", "verify", "--remote", redis_server.url, "--json").json()["findings"]
    assert sorted(f["reason"] for f in findings) == ["manifest", "mismatch"]


def test_index_entries_the_store_leaves_out_are_a_finding(env, node, project, redis_server):
    (art,) = _publish(node("a", signing_key=SIGNER.private_pem()), project, "k")
    admin = redis_server.admin()
    index = f"sj:v1:default:fake:idx:{art.build_key}"
    admin.hset(index, "not a deps key\x1b[2J", b"{}")
    for command in ("ls", "verify"):
        ran = cli("remote", command, "--remote", redis_server.url, "--json")
        assert ran.rc == 1
        (finding,) = ran.json()["findings"]
        assert finding["path"] == f"remote:{art.build_key}" and finding["reason"] == "manifest"
        assert finding["detail"].startswith("1 of 2 entries left out: over 1048576 bytes, or not named as leaves")
    # An entry over max_manifest_bytes (1 MiB): the index is not read past it (oversize).
    admin.hset(index, "d" * 64, b"x" * (2 << 20))
    for command in ("ls", "verify"):
        ran = cli("remote", command, "--remote", redis_server.url, "--json")
        assert ran.rc == 1
        (finding,) = ran.json()["findings"]
        assert finding["path"] == f"remote:{art.build_key}" and finding["reason"] == "oversize", finding


def test_credentials_in_the_url_are_never_shown(env, node, project, redis_server):
    admin = redis_server.admin()
    create_users(admin, "default")
    url = f"redis://sj-default-auditor:default-auditor-pw@127.0.0.1:{redis_server.port}/0"
    for command in ("stats", "ls", "verify"):
        for fmt in ((), ("--json",)):
            ran = cli("remote", command, "--remote", url, *fmt)
            assert "default-auditor-pw" not in ran.out + ran.err
            assert "redis://sj-default-auditor:***@127.0.0.1" in ran.out, shlex.join([command, *fmt])


def test_the_readme_lists_every_json_key(filled):
    url, _ = filled
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for command in ("stats", "ls", "verify"):
        (row,) = [line for line in readme.splitlines() if line.startswith(f"| `remote {command}` |")]
        keys = set(cli("remote", command, "--remote", url, "--json").json())
        assert keys == {k for k in keys if f"`{k}`" in row}, (command, row)


def test_a_key_of_another_type_in_the_index_space_is_one_finding(filled, redis_server):
    """One string key where an index should be stopped every remote command (WRONGTYPE in
    the scan: 'cannot be reached', exit 2); it is a finding of that key now."""
    url, _ = filled
    if url.startswith("s3://"):
        pytest.skip("a key type is Redis's")
    redis_server.admin().set("sj:v1:default:fake:idx:" + "c" * 64, b"not an index")
    for command in ("ls", "verify"):
        ran = cli("remote", command, "--remote", url, "--json")
        assert ran.rc == 1, ran
        assert any(f["path"].startswith("remote:" + "c" * 64) for f in ran.json()["findings"]), ran.out
    assert cli("remote", "stats", "--remote", url).rc == 0
