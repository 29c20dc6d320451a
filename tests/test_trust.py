"""Trust like Jupyter, for teams (issue 23): what could run code is signed by a person, and a store
someone else made is not yours, whoever owns its files.

The hardening table: each row a way a store's data could choose code, and the tests that show it
refused (or, for the author, loaded). ``test_the_hardening_table_names_real_tests`` keeps it honest.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
from conftest import need_module

import caravanserai
from caravanserai import cli, journal, signing
from caravanserai.errors import KeyFileInvalid, PublicKeyInvalid, SignatureInvalid, UntrustedPickle
from caravanserai.runs.lifecycle import append_event
from caravanserai.runs.trust import sign_item
from caravanserai.runs.view import inspect_run
from caravanserai.stores import open_store

HARDENING = {
    "a pickle written by someone else is refused, nothing runs": [
        "test_a_store_unpacked_by_someone_else_runs_nothing_until_they_trust_its_author",
        "test_tampered_pickles_are_refused_in_every_store_kind"],
    "its author re-opens her own store with no prompt and no trust configured": [
        "test_a_store_unpacked_by_someone_else_runs_nothing_until_they_trust_its_author",
        "test_a_pickled_instance_comes_back_for_its_author_after_sigkill"],
    "trusting the author's key (not the files' owner) lets a colleague load it": [
        "test_a_store_unpacked_by_someone_else_runs_nothing_until_they_trust_its_author"],
    "signature altered, payload swapped, signature removed, another key: in every store kind": [
        "test_tampered_pickles_are_refused_in_every_store_kind"],
    "a bad signature is refused even from a store trusted explicitly": [
        "test_tampered_pickles_are_refused_in_every_store_kind"],
    "a recorded launch command: someone else's needs --yes, a tampered one never runs": [
        "test_cli.py::test_resume_of_a_command_someone_else_signed_prints_it_and_needs_yes",
        "test_cli.py::test_resume_runs_its_authors_command_whatever_the_modes_and_never_a_tampered_one"],
    "a re-shown output bundle: active formats only when signed by a trusted key": [
        "test_ipython_ext.py::test_a_completed_cell_reshows_active_formats_only_when_signed_by_a_trusted_key",
        "test_ipython_ext.py::test_a_completed_cell_signed_by_someone_else_reshows_inert"],
    "a forged signature added by a `signed` event is left out and reported, never fatal": [
        "test_a_junk_signature_in_a_signed_event_is_left_out_and_reported_not_fatal"],
    "signatures follow a fork; pickles stored as objects are judged the same way": [
        "test_signatures_added_by_sign_follow_a_fork_and_large_pickles_are_judged_too"],
    "a signed and a plain store of one place never share a writer; bad `signed` options are one line": [
        "test_a_signed_and_a_plain_store_of_one_place_never_share_a_writer", "test_a_bad_signed_option_is_a_one_line_error"],
    "no usable key (a read-only home): the run goes on, unsigned, said once": [
        "test_without_a_usable_key_a_run_goes_on_unsigned_and_says_so_once"],
    "reading (show, journal, list, verify, export, diff, panels) never unpickles, for anyone": [
        "test_reading_runs_nothing.py::test_no_command_loads_a_pickled_value",
        "test_reading_runs_nothing.py::test_the_read_model_and_every_panel_show_a_stand_in",
        "test_a_store_unpacked_by_someone_else_runs_nothing_until_they_trust_its_author"],
    "old unsigned items: one line naming trust and sign; sign shows what it signs": [
        "test_legacy.py::test_cli_resume_of_a_0_2_0_dir_runs_its_command_once_signed",
        "test_sign_shows_what_it_signs_and_refuses_an_altered_item"],
    "a signed journal detects a line inserted or altered without a trusted key, in every store kind": [
        "test_a_signed_journal_flags_forged_lines_in_every_store_kind"],
    "the key: made 0600 on first use, refused when others can read it or it is not a key": [
        "test_the_key_is_made_private_on_first_use_and_refused_when_exposed"],
}


class Boom:
    """Loading it runs code: its ``__reduce__`` makes the file ``marker`` names (Path.touch)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


class BigValue:
    """Over 16 KiB pickled (saved as a stored object); loading it makes the file ``marker`` names."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (_touch_with_ballast, (self.marker, "x" * 40_000))


def _touch_with_ballast(marker: str, ballast: str) -> None:
    Path(marker).touch()


def test_the_hardening_table_names_real_tests():
    here = Path(__file__).parent
    for row, names in HARDENING.items():
        for name in names:
            module, _, test = name.rpartition("::")
            source = (here / (module or Path(__file__).name)).read_text(encoding="utf-8")
            assert f"def {test}(" in source, f"{row}: {name} is not a test"


# ---- the key ------------------------------------------------------------------------------------
def test_the_launch_is_signed_when_the_attempt_is_written_not_when_the_run_opens(monkeypatch):
    """Signing loads the key (~15 ms: most of re-running a finished run in a fresh process). It happens
    when the attempt's first event is written, over what that event records; a run opened and never
    written signs nothing."""
    from caravanserai.runs.trust import launch_payload

    store = open_store(f"memory://{uuid.uuid4().hex[:8]}")
    asked: list[int] = []
    real = signing.signer
    monkeypatch.setattr(signing, "signer", lambda: (asked.append(1), real())[1])
    with caravanserai.durable("lazy", store=store) as run:
        assert asked == []  # opened: nothing signed yet
        run.checkpoint({"n": 1}, "one")
        assert len(asked) == 1
    asked.clear()
    with caravanserai.durable("lazy", store=store) as run:  # finished: entered again, nothing written
        assert run.completed and run.state == {"n": 1}
    assert asked == []
    started = store.events("lazy")[0]
    me = signing.identity()
    message = signing.item_message("command", "launch", signing.sha256(launch_payload(started)))
    assert started["launch_signed"]["key"] == me.public
    assert signing.verify(me.public, message, started["launch_signed"]["sig"])
    assert list(started)[-2:] == ["caravanserai", "launch_signed"]  # where it always was: after the launch fields


def test_the_key_is_made_private_on_first_use_and_refused_when_exposed(tmp_path, monkeypatch):
    monkeypatch.delenv("CARAVANSERAI_KEY_FILE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    me = signing.identity()
    path = tmp_path / "data" / "caravanserai" / "signing_key"
    assert me.path == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert signing.identity().public == me.public and me.public.startswith("ed25519:") and len(me.public) == 51
    assert signing.verify(me.public, b"m", me.sign(b"m")) and not signing.verify(me.public, b"n", me.sign(b"m"))
    monkeypatch.setenv("CARAVANSERAI_KEY_FILE", str(tmp_path / "elsewhere" / "key"))
    assert signing.identity().public != me.public and (tmp_path / "elsewhere" / "key").exists()
    os.chmod(tmp_path / "elsewhere" / "key", 0o644)
    with pytest.raises(KeyFileInvalid, match="chmod 600") as exposed:
        signing.identity()
    assert exposed.value.code == "key_file_invalid" and "\n" not in str(exposed.value)
    (tmp_path / "junk").write_text("not a key")
    os.chmod(tmp_path / "junk", 0o600)
    monkeypatch.setenv("CARAVANSERAI_KEY_FILE", str(tmp_path / "junk"))
    with pytest.raises(KeyFileInvalid, match="not an Ed25519 private key"):
        signing.identity()
    with pytest.raises(PublicKeyInvalid) as bad:
        cli.run_command(["trust", "--key", "ed25519:short"])
    assert bad.value.code == "public_key_invalid" and "caravanserai key" in str(bad.value)


def test_a_key_in_another_pem_form_loads_to_the_same_identity(tmp_path, monkeypatch):
    """The key file _create writes is read without cryptography's PEM loader (its import was a sixth of
    a resume); any other PEM form of an Ed25519 key still goes through that loader, to the same key."""
    from cryptography.hazmat.primitives import serialization

    monkeypatch.setenv("CARAVANSERAI_KEY_FILE", str(tmp_path / "made" / "key"))
    me = signing.identity()
    made = (tmp_path / "made" / "key").read_bytes()
    other = b"Bag Attributes\n    friendlyName: me\n" + made  # as openssl pkcs12 writes a key out
    assert serialization.load_pem_private_key(other, password=None) is not None and signing._seed_key(other) is None
    (tmp_path / "openssh").write_bytes(other)
    os.chmod(tmp_path / "openssh", 0o600)
    monkeypatch.setenv("CARAVANSERAI_KEY_FILE", str(tmp_path / "openssh"))
    again = signing.identity()
    assert again.public == me.public and signing.verify(me.public, b"m", again.sign(b"m"))


def test_without_a_usable_key_a_run_goes_on_unsigned_and_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("CARAVANSERAI_KEY_FILE")
    monkeypatch.setenv("XDG_DATA_HOME", "/proc/no-such-place")  # cannot be created
    monkeypatch.setattr(signing, "_warned_unsigned", False)
    store = open_store(f"memory://{uuid.uuid4().hex[:8]}")
    for n in range(2):
        with caravanserai.durable("unsigned", store=store) as run:
            run.checkpoint({"n": n}, "saved")
    warned = [line for line in capsys.readouterr().err.splitlines() if "writing unsigned" in line]
    assert len(warned) == 1 and "cannot create your signing key" in warned[0]
    assert all("launch_signed" not in e for e in store.events("unsigned"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.run_command(["verify", "--store", store.url])  # a reader makes no key
    assert "unsigned\tsigned\tlaunch command by no one" in out.getvalue()


# ---- two people, one OS user --------------------------------------------------------------------
WRITER = """\
import pathlib, sys, caravanserai

class Boom:
    def __reduce__(self):  # loading this runs Path('MARKER').touch()
        return (pathlib.Path.touch, (pathlib.Path("MARKER"),))

boom = Boom()
with caravanserai.durable("shared-run", capture=["boom"]) as run:
    run.checkpoint({"step": 1}, "saved a pickled value")
    if len(sys.argv) > 1:
        raise SystemExit("stopped before the end")
"""


PANELS = """\
from caravanserai.widgets import ForkPanel, JournalTable, Timeline
timeline, table = Timeline("shared-run", live=False), JournalTable("shared-run", live=False)
fork = ForkPanel("shared-run", live=False)
timeline.cursor = 1
fork.steps.cursor = 0
timeline.to_html("timeline.html")
print(fork.steps.detail["editable"], timeline.detail, sep="\\n")
"""


def _as(who, cwd: Path, *argv: str, check_rc: int = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARAVANSERAI_")}
    env.update(who.env, PYTHONPATH=str(Path(__file__).parent.parent))
    proc = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == check_rc, (argv, proc.stdout, proc.stderr)
    return proc


def test_a_store_unpacked_by_someone_else_runs_nothing_until_they_trust_its_author(tmp_path, person):
    alice, bob = person("alice"), person("bob")
    mine = tmp_path / "alice-project"
    mine.mkdir()
    (mine / "job.py").write_text(WRITER)
    _as(alice, mine, "job.py", "stop", check_rc=1)
    with tarfile.open(tmp_path / "runs.tar", "w") as tar:  # what alice mails to bob
        tar.add(mine / ".caravanserai", arcname=".caravanserai")
        tar.add(mine / "job.py", arcname="job.py")
    theirs = tmp_path / "bob-project"
    theirs.mkdir()
    with tarfile.open(tmp_path / "runs.tar") as tar:
        tar.extractall(theirs, filter="tar")
    os.chmod(theirs / ".caravanserai", 0o700)  # bob's own files now, private: that proves nothing about authorship

    refused = _as(bob, theirs, "job.py", check_rc=1)
    assert "UntrustedPickle" in refused.stderr and "a key you do not trust" in refused.stderr
    assert "caravanserai trust --key ed25519:" in refused.stderr and not (theirs / "MARKER").exists()
    for argv in (["show", "shared-run"], ["journal", "shared-run"], ["list"], ["verify"]):
        shown = _as(bob, theirs, "-m", "caravanserai", *argv)
        assert not (theirs / "MARKER").exists(), argv
    assert "<pickled __main__.Boom, not loaded>" in _as(bob, theirs, "-m", "caravanserai", "show", "shared-run").stdout
    panels = _as(bob, theirs, "-c", PANELS).stdout
    assert "# boom = <pickled __main__.Boom, not loaded> (not editable here: kept)" in panels, panels
    assert "pickled __main__.Boom, not loaded" in (theirs / "timeline.html").read_text() and not (theirs / "MARKER").exists()
    shown = _as(bob, theirs, "-m", "caravanserai", "verify").stdout
    assert "launch command, pickle 'boom' by ed25519:" in shown and "not trusted" in shown
    resumed = _as(bob, theirs, "-m", "caravanserai", "resume", "shared-run", check_rc=1)
    assert resumed.stdout.startswith("the journal asks to run:") and not (theirs / "MARKER").exists()

    _as(alice, mine, "job.py")  # her own store, no trust configured: the pickle loads (and runs, as she wrote it)
    assert (mine / "MARKER").exists()

    key = _as(alice, mine, "-m", "caravanserai", "key", "--quiet").stdout.strip()
    _as(bob, theirs, "-m", "caravanserai", "trust", "--key", key, "--name", "alice")
    assert "by alice (ed25519:" in _as(bob, theirs, "-m", "caravanserai", "verify").stdout
    _as(bob, theirs, "job.py")
    assert (theirs / "MARKER").exists()


def test_sign_shows_what_it_signs_and_refuses_an_altered_item(tmp_path, person):
    alice, bob = person("alice"), person("bob")
    (tmp_path / "job.py").write_text(WRITER)
    _as(alice, tmp_path, "job.py", "stop", check_rc=1)
    asked = _as(bob, tmp_path, "-m", "caravanserai", "sign", "shared-run", check_rc=2)
    # what loading would really import and call, read from the pickle (not the type its writer recorded)
    assert "pickled variable 'boom': recorded as __main__.Boom, sha256 " in asked.stdout
    assert "loading it imports and may call pathlib.Path.touch" in asked.stdout and not (tmp_path / "MARKER").exists()
    assert "the recorded launch command: " in asked.stdout and "job.py stop" in asked.stdout
    assert "--yes" in asked.stderr and "nothing was signed" in asked.stderr
    signed = _as(bob, tmp_path, "-m", "caravanserai", "sign", "shared-run", "--yes")
    assert "signed 2 item(s) of run 'shared-run'" in signed.stdout
    again = _as(bob, tmp_path, "-m", "caravanserai", "sign", "shared-run")
    assert "nothing to sign" in again.stdout
    assert "launch command, pickle 'boom' by yours" in _as(bob, tmp_path, "-m", "caravanserai", "verify").stdout

    store = open_store(str(tmp_path / ".caravanserai"))
    entry = dict(inspect_run("shared-run", store).saved_entries()["boom"])
    entry["data"] = base64.b64encode(pickle.dumps({"swapped": True})).decode()  # alice's signature kept
    with signing_as(bob):
        _forge(store, "shared-run", entry)
    refused = _as(bob, tmp_path, "-m", "caravanserai", "sign", "shared-run", "--yes", check_rc=1)
    assert "does not verify" in refused.stderr and "nothing was signed" in refused.stderr
    assert "BAD SIGNATURE" in _as(bob, tmp_path, "-m", "caravanserai", "verify", check_rc=1).stdout


def test_a_junk_signature_in_a_signed_event_is_left_out_and_reported_not_fatal(tmp_path, person):
    """Anyone who can append can add a `signed` event: a record in it that does not verify must not make
    an intact item unusable (it is left out), and verify says so."""
    alice = person("alice")
    (tmp_path / "job.py").write_text(WRITER)
    _as(alice, tmp_path, "job.py", "stop", check_rc=1)
    store = open_store(str(tmp_path / ".caravanserai"))
    entry = inspect_run("shared-run", store).saved_entries()["boom"]
    digest = signing.sha256(base64.b64decode(entry["data"]))
    append_event(store, "shared-run", {"type": "signed", "items": [
        {"kind": "pickle", "name": "boom", "sha256": digest, "key": "junk\nshared-run\tsigned\tINJECTED", "sig": "x"}]})
    caravanserai.runs.close_all()
    report = _as(alice, tmp_path, "-m", "caravanserai", "verify", check_rc=1).stdout
    assert "shared-run\tBAD SIGNATURE\t1 signature(s)" in report and "pickle 'boom' by yours" in report
    assert "INJECTED" not in report  # text from the store never becomes a line of the report
    _as(alice, tmp_path, "job.py")  # the intact, signed value still loads for its author
    assert (tmp_path / "MARKER").exists()


def test_signatures_added_by_sign_follow_a_fork_and_large_pickles_are_judged_too(tmp_path, person, monkeypatch):
    alice, bob = person("alice"), person("bob")
    person.use(alice)
    monkeypatch.chdir(tmp_path)
    big = {"boom": Boom(tmp_path / "MARKER"), "ballast": None}
    big["ballast"] = BigValue(tmp_path / "BIG")
    with pytest.raises(RuntimeError), caravanserai.durable("p", capture=["boom", "ballast"], namespace=big) as run:
        run.checkpoint({"n": 1}, "saved")
        raise RuntimeError("stop")
    entries = inspect_run("p").saved_entries()
    assert "object" in entries["ballast"] and entries["ballast"]["codec"] == "pickle"  # over 16 KiB: a stored object
    caravanserai.runs.close_all()
    person.use(bob)
    with pytest.raises(UntrustedPickle):
        _reopen(open_store(None), "p")
    assert cli.run_command(["sign", "p", "--yes"]) == 0
    child = caravanserai.fork("p", at=1, new_run_id="p-fork")
    caravanserai.runs.close_all()
    namespace: dict = {}
    with caravanserai.durable(child, capture=["boom", "ballast"], namespace=namespace):
        pass
    assert (tmp_path / "MARKER").exists() and (tmp_path / "BIG").exists()  # both loaded for bob, in the fork


@contextlib.contextmanager
def signing_as(who):
    saved = {k: os.environ.get(k) for k in who.env}
    os.environ.update(who.env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ---- every store kind ---------------------------------------------------------------------------
KINDS = ["local", "memory", "sqlite", "postgres", "s3", "http"]
TOKEN = "trust-token-0123456789abcdef"


@pytest.fixture(scope="module")
def journal_service():
    need_module("httpx", "http")
    need_module("uvicorn", "http")
    from servers.journal_service import JournalServiceProcess

    root = Path(os.environ.get("TMPDIR", "/tmp")) / f"caravanserai-trust-{uuid.uuid4().hex[:8]}"
    server = JournalServiceProcess(str(root / "dir-store"), TOKEN)
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=KINDS)
def store_url(request, tmp_path) -> str:
    kind = request.param
    if kind == "local":
        return (tmp_path / "local").as_uri()
    if kind == "memory":
        return f"memory://trust-{uuid.uuid4().hex[:10]}"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    if kind == "postgres":
        pg = request.getfixturevalue("pg")
        return f"{pg.dsn}?table=t_{uuid.uuid4().hex[:10]}&create_schema=1"
    if kind == "s3":
        s3 = request.getfixturevalue("s3")
        bucket = f"trust-{uuid.uuid4().hex[:10]}"
        s3.create_bucket(bucket)
        return (f"s3://{bucket}/p?endpoint={s3.endpoint}&region=us-east-1&access_key_id=testing"
                "&secret_access_key=testing")
    service = request.getfixturevalue("journal_service")
    return f"{service.url}/?token={TOKEN}"


def _forge(store, run_id: str, entry: dict) -> None:
    """Append a waypoint whose saved variable ``boom`` is ``entry``: what anyone with write access can do."""
    append_event(store, run_id, {"type": "waypoint", "n": 9, "note": "forged", "state": {},
                                 "names": {"values": {"boom": entry}, "at": None}})


def _reopen(store, run_id: str) -> dict:
    namespace: dict = {}
    with caravanserai.durable(run_id, store=store, capture=["boom"], namespace=namespace):
        pass
    return namespace


def test_tampered_pickles_are_refused_in_every_store_kind(store_url, tmp_path, person, monkeypatch):
    store = open_store(store_url)
    t = f"t-{uuid.uuid4().hex[:8]}"  # the journal service is shared by the module's tests
    marker, planted = tmp_path / "MARKER", tmp_path / "PLANTED"
    with pytest.raises(RuntimeError), caravanserai.durable(t, store=store, capture=["boom"],
                                                           namespace={"boom": Boom(marker)}) as run:
        run.checkpoint({"n": 1}, "saved")
        raise RuntimeError("stop before the end")
    saved = inspect_run(t, store).saved_entries()["boom"]
    assert saved["codec"] == "pickle" and saved["type"] == f"{__name__}.Boom" and saved["signed"]["key"]
    evil = base64.b64encode(pickle.dumps(Boom(planted))).decode()
    with signing_as(person("mallory")):
        mallory = {**saved, "data": evil, "signed": sign_item("pickle", "boom", pickle.dumps(Boom(planted)))}
    altered = {**saved, "signed": {**saved["signed"], "sig": saved["signed"]["sig"][::-1]}}
    cases = [
        ("signature altered", altered, SignatureInvalid, "does not verify"),
        ("payload swapped, signature kept", {**saved, "data": evil}, SignatureInvalid, "does not verify"),
        ("signature removed", {k: v for k, v in saved.items() if k != "signed"}, UntrustedPickle, "caravanserai sign t-"),
        ("signed with another key", mallory, UntrustedPickle, "a key you do not trust"),
    ]
    for label, entry, error, words in cases:
        _forge(store, t, entry)
        with pytest.raises(error, match=words) as refused:
            _reopen(store, t)
        assert f"'{t}'" in str(refused.value) and "\n" not in str(refused.value), label
        assert not marker.exists() and not planted.exists(), label
    monkeypatch.setenv("CARAVANSERAI_TRUSTED_STORES", store.url)
    _forge(store, t, altered)
    with pytest.raises(SignatureInvalid):  # trusting the store does not make a bad signature good
        _reopen(store, t)
    assert not marker.exists() and not planted.exists()
    monkeypatch.delenv("CARAVANSERAI_TRUSTED_STORES")
    _forge(store, t, saved)  # the control: the author's own signed value loads, and runs as she wrote it
    _reopen(store, t)
    assert marker.exists() and not planted.exists()
    caravanserai.runs.close_all()


def _verify(url: str, run_id: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.run_command(["verify", run_id, "--store", url])
    return code, out.getvalue()


@pytest.mark.parametrize(("url", "words"), [
    ("memory://x?signed", "needs a value"), ("memory://x?signed=", "needs a value"), ("memory://x?signed=maybe", "true or"),
    ("memory://x?signed=1&signed=0", "twice"), ("runs?signed=1", r"file:///absolute/path\?signed=1")])
def test_a_bad_signed_option_is_a_one_line_error(url, words):
    from caravanserai.errors import InvalidStoreUrl

    with pytest.raises(InvalidStoreUrl, match=words) as bad:
        open_store(url)
    assert "\n" not in str(bad.value)


def test_a_signed_and_a_plain_store_of_one_place_never_share_a_writer(tmp_path):
    """A run open through the plain store is not written unsigned through the signed one: it is locked."""
    from caravanserai.errors import RunLocked

    plain, signed = open_store(tmp_path.as_uri()), open_store(tmp_path.as_uri() + "?signed=1")
    with caravanserai.durable("one", store=plain) as outer:
        outer.checkpoint({"n": 1}, "plain")
        with pytest.raises(RunLocked), caravanserai.durable("one", store=signed):
            pass
    with caravanserai.durable("one", store=signed) as run:
        run.checkpoint({"n": 2}, "signed")
    assert [signing.line_signature(line) is not None for line in plain.load("one")][-2:] == [True, True]


def test_a_signed_journal_flags_forged_lines_in_every_store_kind(store_url):
    signed_url = store_url + ("&" if "?" in store_url else "?") + "signed=1"
    store = open_store(signed_url)
    j = f"j-{uuid.uuid4().hex[:8]}"  # the journal service is shared by the module's tests
    assert store.journal_signer is not None and store.opened_url == signed_url
    caravanserai.checkpoint(j, {"n": 1}, "one", store=store)
    caravanserai.checkpoint(j, {"n": 2}, "two", store=store)
    caravanserai.runs.close_all()
    lines = store.load(j)
    assert all(signing.line_signature(line) == (signing.identity().public, True) for line in lines)
    code, out = _verify(signed_url, j)
    assert code == 0 and f"{j}\tjournal\t{len(lines)} of {len(lines)} lines signed ({len(lines)} by yours)" in out, out

    with store.acquire(j) as lease:  # someone with write access to the store but not the key
        events, tail = journal.decode(j, store.load_held(lease))
        stolen = json.loads(lines[0])["sig"]  # a real signature, over another line
        forged = journal.encode([{"type": "waypoint", "n": 3, "note": "forged", "state": {"n": 99}}], tail,
                                sign=lambda _line: stolen)[0]
        store.append(j, forged, lease=lease, seq=tail.seq)
    code, out = _verify(signed_url, j)
    assert code == 1 and f"journal line {len(lines) + 1}: its signature does not verify" in out, out
    with store.acquire(j) as lease:
        events, tail = journal.decode(j, store.load_held(lease))
        store.append(j, journal.encode([{"type": "waypoint", "n": 4, "note": "unsigned"}], tail)[0],
                     lease=lease, seq=tail.seq)
    code, out = _verify(signed_url, j)
    assert code == 1 and f"journal line {len(lines) + 2} is not signed" in out, out


# ---- a real kernel, SIGKILLed -------------------------------------------------------------------
KERNEL_SETUP = """\
class Model:
    def __init__(self):
        self.seen = []
"""

KERNEL_CELL = """\
%%resumable own-pickle
import time
from caravanserai import resumable_iterate
model = Model()
for x in resumable_iterate(range(5)):
    model.seen.append(x)
    time.sleep(0.3)
print("done", model.seen, type(model).__name__)
"""


def test_a_pickled_instance_comes_back_for_its_author_after_sigkill(tmp_path, kernel, kernel_env, person):
    from kernel_helpers import events, wait_for_waypoints

    kernel_env.update(person("alice").env)  # her own key, and nothing trusted
    k = kernel()
    k.ok("%load_ext caravanserai")
    k.ok(KERNEL_SETUP)
    k.submit(KERNEL_CELL)
    wait_for_waypoints(tmp_path, "own-pickle", 2)
    k.kill_and_restart()
    saved = [e for e in events(tmp_path, "own-pickle") if e.get("names")][-1]["names"]["values"]["model"]
    assert saved["codec"] == "pickle" and saved["type"] == "__main__.Model"
    assert saved["signed"]["key"] == json.loads(_as(person("alice"), tmp_path, "-c", (
        "import json; from caravanserai import signing; print(json.dumps(signing.identity().public))")).stdout)
    k.ok("%load_ext caravanserai")
    k.ok(KERNEL_SETUP)
    got = k.ok(KERNEL_CELL)
    assert "done [0, 1, 2, 3, 4] Model" in got.stdout, got.stdout
    assert any("resumed" in text and "model" in text for text in got.displays), got.displays
    assert not (person("alice").home / "caravanserai" / "trusted_keys").exists()
