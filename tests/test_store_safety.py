"""Safe and forgiving stores: a table of bad inputs, each refused with a typed one-line error that
loses nothing.

Every row asserts the error class (and its stable ``code``), that the message is one line, and that
nothing was written or lost: directory listings, journal bytes or the store's run list before and
after. Real parts throughout: the local directory and SQLite in tmp dirs, PostgreSQL and a moto S3
server through the ``pg`` / ``s3`` fixtures, the journal service as its real Starlette app, child
processes for the file-size limit and for concurrent lockers.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from conftest import http_handler_transport, need_module
from servers._proc import free_port

import caravanserai
from caravanserai import (
    CaravanseraiError,
    InvalidRunId,
    InvalidStoreUrl,
    JournalCorruptionError,
    StoreFull,
    StoreUnavailable,
    UnknownStoreScheme,
)
from caravanserai.errors import ObjectLeaseTtlOptionInvalid
from caravanserai.ids import validate_run_id
from caravanserai.stores import LocalStore, MemoryStore, open_store
from caravanserai.stores.sql import SqliteStore
from caravanserai.testing import make_lines

PYTHON = sys.executable

BAD_RUN_IDS = ["../x", "a/b", "CON", "nul.txt", "a.", "x" * 300, "", ".hidden", "-dash", "a b", "a\nb", "LPT1.log",
               "com7", "Aux", "prn.tar.gz", "\u00fc" * 200, "a\\b", None, 7]
GOOD_LOOKALIKES = ["CONSOLE", "con-1", "COM10", "nul_", "auxiliary", "a.b", "LPT0", "x" * 128]


def one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and text.strip(), repr(text)
    return text


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for directories): 'nothing was written'."""
    if not root.exists():
        return {}
    found: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = None if path.is_dir() else path.read_bytes()
    return found


def _write(store, run_id: str, count: int = 2) -> list[str]:
    lines, _ = make_lines(run_id, count)
    with store.acquire(run_id) as lease:
        store.append(run_id, lines, lease=lease, seq=0)
    return lines


# ---- 1. run ids: one rule on every backend's journal face ----------------------------------------
@pytest.fixture(params=["local", "memory", "sqlite", "postgres", "s3", "http"])
def any_store(request, tmp_path):
    """(store, snapshot) for each backend; snapshot() captures what a failed call must leave alone."""
    kind = request.param
    if kind == "local":
        store = LocalStore(tmp_path / "local")
        _write(store, "kept")
        yield store, lambda: tree(tmp_path)
        return
    if kind == "memory":
        store = MemoryStore(uuid.uuid4().hex)
    elif kind == "sqlite":
        store = SqliteStore(str(tmp_path / "runs.db"), lease_ttl_ms=3000)
    elif kind == "postgres":
        pg = request.getfixturevalue("pg")
        store = open_store(f"{pg.dsn}?table=t_{uuid.uuid4().hex[:10]}&create_schema=1&lease_ttl_ms=3000")
    elif kind == "s3":
        s3 = request.getfixturevalue("s3")
        bucket = f"ids-{uuid.uuid4().hex[:10]}"
        s3.create_bucket(bucket)
        store = open_store(f"s3://{bucket}/p?endpoint={s3.endpoint}&region=us-east-1&access_key_id=testing"
                           "&secret_access_key=testing&lease_ttl_ms=3000")
    else:
        httpx = need_module("httpx", "http")
        from caravanserai.stores.http import HttpDurableStore

        sent: list = []

        def refuse(request):  # a checked id never reaches the wire
            sent.append(request)
            return httpx.Response(500, json={"error": {"code": "internal_error", "message": "must not be called"}})

        store = HttpDurableStore("http://127.0.0.1:9", "token", transport=http_handler_transport(refuse))
        yield store, lambda: list(sent)
        store.close()
        return
    _write(store, "kept")
    yield store, lambda: (store.list(), store.load("kept"), store.objects.list())
    store.close()


@pytest.mark.parametrize("bad", BAD_RUN_IDS, ids=repr)
def test_bad_run_ids_are_refused_by_every_journal_method(any_store, bad):
    store, snapshot = any_store
    before = snapshot()
    calls = {
        "acquire": lambda: store.acquire(bad),
        "load": lambda: store.load(bad),
        "remove": lambda: store.remove(bad),
        "has_run": lambda: store.has_run(bad),
        "events": lambda: store.events(bad),
        "last_updated": lambda: store.last_updated(bad),
        "torn_tail": lambda: store.torn_tail(bad),
        "refresh_views": lambda: store.refresh_views(bad),
        "committed": lambda: store.committed(bad, []),
        "append": lambda: store.append(bad, ["{}"], lease=None, seq=0),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidRunId) as info:
            call()
        assert info.value.code == "invalid_run_id", name
        one_line(info.value)
    assert snapshot() == before


@pytest.mark.parametrize("good", GOOD_LOOKALIKES)
def test_names_close_to_reserved_ones_stay_valid(tmp_path, good):
    assert validate_run_id(good) == good
    store = LocalStore(tmp_path / "s")
    lines = _write(store, good)
    assert store.load(good) == lines and store.list() == [good]


def test_an_id_checked_once_is_remembered_only_as_the_text_that_was_checked():
    """validate_run_id remembers the ids it found valid; a str subclass whose str() names other text
    cannot make that text pass unchecked."""
    class Liar(str):
        def __str__(self) -> str:
            return "../../etc"

    assert validate_run_id(Liar("checked-run")) == "checked-run"
    with pytest.raises(InvalidRunId):
        validate_run_id("../../etc")
    assert validate_run_id("checked-run") == "checked-run"
    with pytest.raises(InvalidRunId):  # twice: a refusal is never remembered as valid
        validate_run_id("../../etc")


def test_the_local_store_never_touches_paths_outside_it(tmp_path):
    outside = tmp_path / "x"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    store = open_store(str(tmp_path / "store"))
    before = tree(tmp_path)
    for call in (lambda: store.acquire("../x"), lambda: store.remove("../x"), lambda: store.run_dir("../x")):
        with pytest.raises(InvalidRunId):
            call()
    assert tree(tmp_path) == before


@pytest.mark.parametrize("legacy", ["a b", "\u00fcn\u00efc\u00f8d\u00e9", "..x", "CON", "trailing."])
def test_0_2_0_directories_stay_readable_but_never_written(tmp_path, legacy):
    root = tmp_path / "s"
    run_dir = root / legacy
    run_dir.mkdir(parents=True)
    (run_dir / "waypoint-1.md").write_text("# Waypoint 1 - 2026-11-29T22:27:31+00:00\n\nstep 1\n")
    (run_dir / "state.json").write_text('{"step": 1}')
    (run_dir / "latest").write_text("1")
    store = LocalStore(root)
    before = tree(root)
    assert store.is_legacy_name(legacy)
    assert [e["type"] for e in store.events(legacy)] == ["run_started", "waypoint"]
    assert store.has_run(legacy) and store.torn_tail(legacy) == 0 and store.last_updated(legacy)
    for call in (lambda: store.acquire(legacy), lambda: store.append(legacy, ["{}"], lease=None, seq=0),
                 lambda: caravanserai.checkpoint(legacy, {"step": 2}, "no", store=store)):
        with pytest.raises(InvalidRunId):
            call()
    assert tree(root) == before
    assert store.remove(legacy) is True and not run_dir.exists()


def test_internal_directories_are_not_legacy_runs(tmp_path):
    store = LocalStore(tmp_path / "s")
    store.objects.put("latest", b"1")  # .objects/latest looks like a 0.2.0 view
    before = tree(tmp_path)
    assert not store.is_legacy_name(".objects")
    with pytest.raises(InvalidRunId):
        store.remove(".objects")
    assert tree(tmp_path) == before


def test_the_journal_service_checks_ids_with_the_same_rule(tmp_path):
    need_module("starlette", "http")
    need_module("httpx", "http")
    from caravanserai.service import create_app
    from starlette.testclient import TestClient

    backing = LocalStore(tmp_path / "served")
    _write(backing, "kept")
    before = tree(tmp_path)
    client = TestClient(create_app(backing, "tok"), headers={"Authorization": "Bearer tok"})
    for bad in ["CON", "nul.txt", "a.", "x" * 300, "..x", "a b"]:
        for method, path in [("GET", ""), ("DELETE", ""), ("POST", "/acquire"), ("POST", "/renew"),
                             ("POST", "/release"), ("POST", "/append")]:
            answer = client.request(method, f"/v1/runs/{bad}{path}", json={"token": 1, "seq": 0, "lines": ["{}"]})
            assert answer.status_code == 400, (bad, method, path, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "invalid_run_id" and "\n" not in error["message"]
    assert tree(tmp_path) == before


# ---- 2. store URLs: known forms only, one line each -----------------------------------------------
URL_ROWS = [
    # a known scheme without '//' is a mistyped URL, not a directory named 'sqlite:'
    ("sqlite:/runs.db", InvalidStoreUrl, "sqlite:///runs.db"),
    ("sqlite:runs.db", InvalidStoreUrl, "sqlite:///runs.db"),
    ("s3:/x", InvalidStoreUrl, "s3://bucket/prefix"),
    ("memory:/x", InvalidStoreUrl, "memory://name"),
    ("file:/x", InvalidStoreUrl, "file:///"),
    ("postgresql:x", InvalidStoreUrl, "postgresql://"),
    # sqlite
    ("sqlite://runs.db", InvalidStoreUrl, "sqlite:////abs/path/runs.db"),
    ("sqlite://", InvalidStoreUrl, "sqlite:///runs.db"),
    ("sqlite:///runs.db?bogus=1", InvalidStoreUrl, "known: lease_ttl_ms, table"),
    ("sqlite:///runs.db?lease_ttl_ms=soon", InvalidStoreUrl, "expected an integer"),
    ("sqlite:///runs.db?lease_ttl_ms=5", InvalidStoreUrl, "minimum 3000"),
    ("sqlite:///runs.db?table=x;drop", InvalidStoreUrl, "plain SQL identifier"),
    # file and memory take no options
    ("file:///{tmp}/s?views=0", InvalidStoreUrl, "takes none"),
    ("file://elsewhere/s", InvalidStoreUrl, "names host"),
    ("memory://m?x=1", InvalidStoreUrl, "take no options"),
    # postgresql (parsed before any connection)
    ("postgresql://u:hunter2@127.0.0.1:{port}/db?bogus=1", InvalidStoreUrl, "libpq parameter"),
    ("postgresql://u:hunter2@127.0.0.1:{port}/db?create_schema=maybe", InvalidStoreUrl, "expected true or false"),
    ("postgresql://u:hunter2@127.0.0.1:{port}/db?table=a-b", InvalidStoreUrl, "plain SQL identifier"),
    ("postgresql://u:hunter2@127.0.0.1:{port}/db?sslmode=sometimes", InvalidStoreUrl, "sslmode"),
    ("postgresql://u:hunter2@[::1/db", InvalidStoreUrl, "postgresql://user@host"),
    ("postgresql://u:hunter2@127.0.0.1:{port}/db", StoreUnavailable, "cannot connect to PostgreSQL"),
    # object storage: an explicit table of options
    ("s3://b/p?bogus=1", InvalidStoreUrl, "known: access_key_id, allow_http"),
    ("s3://b/p?endpoint=not a url", InvalidStoreUrl, "not a valid endpoint"),
    ("s3://b/p?endpoint=http://[::1", InvalidStoreUrl, "not a valid endpoint"),
    ("s3://b/p?endpoint=http://h:99999", InvalidStoreUrl, "not a valid endpoint"),
    ("s3://b/p?endpoint=ftp://h", InvalidStoreUrl, "http:// or https://"),
    ("s3://b/p?allow_http=maybe", InvalidStoreUrl, "expected true or false"),
    ("s3://b/p?lease_ttl_ms=1", ObjectLeaseTtlOptionInvalid, "minimum 3000"),  # the seed's code, also a URL error
    ("s3://b/p?secret_access_key=hunter2&oops=1", InvalidStoreUrl, "unknown option(s) oops"),
    ("s3://", InvalidStoreUrl, "s3://bucket/prefix"),
    ("gs://b?bogus=1", InvalidStoreUrl, "service_account"),
    ("az://c?bogus=1", InvalidStoreUrl, "account_name"),
    # the journal service client
    ("http://127.0.0.1:9/?bogus=1", InvalidStoreUrl, "known: backoff_ms"),
    ("http://127.0.0.1:9/?retries=many", InvalidStoreUrl, "expected an integer"),
    ("http://127.0.0.1:9/?token=hunter2&lock_ttl_ms=10", InvalidStoreUrl, "minimum 3000"),
    ("http://127.0.0.1:notaport/", InvalidStoreUrl, "https://host"),
    ("http://u:hunter2@127.0.0.1:9/", InvalidStoreUrl, "must not carry credentials"),
    ("http://example.com/x?token=hunter2", caravanserai.HttpInsecure, "https"),
    # unknown schemes
    ("mysql://u:hunter2@h/db", UnknownStoreScheme, "use one of"),
]


@pytest.mark.parametrize("url, error, hint", URL_ROWS, ids=[row[0] for row in URL_ROWS])
def test_bad_store_urls_are_one_line_errors(project, url, error, hint):
    needs = {"postgresql": ("psycopg", "postgres"), "s3": ("obstore", "s3"), "gs": ("obstore", "s3"),
             "az": ("obstore", "s3"), "http": ("httpx", "http")}
    module = needs.get(url.split(":", 1)[0])
    if module and "://" in url:
        need_module(*module)
    url = url.format(tmp=project, port=free_port())
    before = tree(project)
    with pytest.raises(error) as info:
        open_store(url)
    text = one_line(info.value)
    assert isinstance(info.value, CaravanseraiError) and info.value.code == error.code
    assert hint in text, text
    assert "hunter2" not in text and "hunter2" not in repr(info.value.fields)
    assert tree(project) == before  # no directory named 'sqlite:', no database file


def test_a_short_lease_ttl_is_one_error_by_url_or_by_constructor(project):
    """The one minimum, the one error: ``LeaseTtlInvalid`` from a constructor and from a URL option
    (where it is also an ``InvalidStoreUrl``, so URL error handling keeps catching it)."""
    from caravanserai import LeaseTtlInvalid
    from caravanserai.errors import LeaseTtlOptionInvalid
    from caravanserai.stores.objects import BucketStore

    need_module("httpx", "http")
    from caravanserai.stores.http import HttpStore

    made = [lambda: SqliteStore(str(project / "a.db"), lease_ttl_ms=5),
            lambda: BucketStore(caravanserai.MemoryObjects(), lease_ttl_ms=5),
            lambda: HttpStore("http://127.0.0.1:9", "t", lease_ttl_ms=5)]
    opened = [lambda: open_store("sqlite:///a.db?lease_ttl_ms=5"),
              lambda: open_store("http://127.0.0.1:9/?token=t&lease_ttl_ms=5"),
              lambda: open_store("http://127.0.0.1:9/?token=t&lock_ttl_ms=5")]
    for make in made + opened:
        with pytest.raises(LeaseTtlInvalid) as info:
            make()
        assert info.value.minimum == 3000 and isinstance(info.value, ValueError)
        assert "3000" in one_line(info.value)
    for make in opened:
        with pytest.raises(InvalidStoreUrl) as info:
            make()
        assert type(info.value) is LeaseTtlOptionInvalid and info.value.code == "invalid_store_url"
        assert info.value.option in ("lease_ttl_ms", "lock_ttl_ms") and info.value.lease_ttl_ms == 5
    assert not (project / "a.db").exists()  # refused before anything is created


def test_an_object_store_url_with_a_short_lease_has_the_seeds_code():
    """``s3://…?lease_ttl_ms=1000``: the seed's ``durable_object_lease_ttl_invalid``, and still a URL error."""
    from caravanserai import LeaseTtlInvalid, ObjectLeaseTtlInvalid
    from caravanserai.errors import LeaseTtlOptionInvalid

    need_module("obstore", "s3")
    with pytest.raises(ObjectLeaseTtlInvalid) as info:
        open_store("s3://bucket/prefix?lease_ttl_ms=1000&endpoint=http://127.0.0.1:9&region=us-east-1")
    error = info.value
    assert type(error) is ObjectLeaseTtlOptionInvalid and error.code == "durable_object_lease_ttl_invalid"
    assert isinstance(error, (InvalidStoreUrl, LeaseTtlOptionInvalid, LeaseTtlInvalid, ValueError))
    assert isinstance(error, InvalidStoreUrl) and error.option == "lease_ttl_ms" and error.minimum == 3000
    assert "below the minimum 3000" in one_line(error)


def test_a_real_server_refusing_a_libpq_option_is_invalid_store_url(pg):
    with pytest.raises(InvalidStoreUrl) as info:
        open_store(f"{pg.dsn}?no_such_libpq_option=1&table=t_x")
    assert "no_such_libpq_option" in one_line(info.value)


def test_the_url_forms_that_work(project):
    (project / "sub").mkdir()
    assert open_store("sqlite:///sub/rel.db").path == str(project / "sub" / "rel.db")
    absolute = project / "abs.db"
    assert open_store(f"sqlite:///{absolute}").path == str(absolute)
    assert open_store(f"file://{project}/files").root == project / "files"
    assert open_store("./sqlite-named-dir").root == project / "sqlite-named-dir"


# ---- 3. the file-size limit and a full disk: StoreFull, journal byte-identical ---------------------
CHILD_FULL = textwrap.dedent("""
    import json, resource, sys
    import caravanserai
    run_id, limit = sys.argv[1], int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        caravanserai.checkpoint(run_id, {"blob": "x" * 2_000_000}, "a large state")
    except Exception as err:
        print(json.dumps({"class": type(err).__name__, "code": getattr(err, "code", None), "message": str(err)}))
    else:
        print(json.dumps({"class": None}))
""")


def test_a_file_size_limit_mid_checkpoint_is_store_full_and_the_journal_is_untouched(project, child_env):
    caravanserai.checkpoint("big", {"step": 1}, "small state first")
    caravanserai.runs.close_all()  # let the child take the run
    open_store(None).flush_views()
    run_dir = project / ".caravanserai" / "big"
    journal_before = (run_dir / "journal.jsonl").read_bytes()
    # the lock's holder record and the run index's cache entry (recomputed: the failed write touched the
    # journal's mtime, though not its bytes) may change; the journal and every view may not
    views_before = {k: v for k, v in tree(run_dir).items() if k not in ("lock", "index.json")}
    limit = len(journal_before) + 4096  # room for part of the line: the write is cut short, then EFBIG
    done = subprocess.run([PYTHON, "-c", CHILD_FULL, "big", str(limit)], cwd=project, env=child_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert (outcome["class"], outcome["code"]) == ("StoreFull", "store_full"), outcome
    assert "\n" not in outcome["message"] and "nothing was written" in outcome["message"]
    assert (run_dir / "journal.jsonl").read_bytes() == journal_before
    assert {k: v for k, v in tree(run_dir).items() if k not in ("lock", "index.json")} == views_before
    assert caravanserai.load_latest("big") == ({"step": 1}, "small state first", 1)
    assert open_store(None).torn_tail("big") == 0


def test_a_full_object_face_is_store_full(project, child_env):
    code = textwrap.dedent("""
        import json, resource
        from caravanserai.stores import LocalStore
        store = LocalStore(".caravanserai")
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            store.objects.put("ckpt/a", b"x" * 100_000)
        except Exception as err:
            print(json.dumps({"class": type(err).__name__, "message": str(err)}))
    """)
    done = subprocess.run([PYTHON, "-c", code], cwd=project, env=child_env, capture_output=True, text=True, timeout=60)
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["class"] == "StoreFull" and "\n" not in outcome["message"], (outcome, done.stderr)
    assert "nothing was written" in outcome["message"]
    assert LocalStore(project / ".caravanserai").objects.list() == []  # no partial object, no temp file left
    assert [p.name for p in (project / ".caravanserai" / ".objects" / "ckpt").iterdir()] == []


def test_an_unusable_store_directory_is_store_unavailable(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the store's directory should be")
    store = LocalStore(blocker / "store")
    before = tree(tmp_path)
    for call in (lambda: store.acquire("r"), lambda: store.objects.put("k", b"1"), lambda: store.list(),
                 lambda: store.load("r"), lambda: store.remove("r"), lambda: store.torn_tail("r")):
        try:
            call()
        except StoreUnavailable as err:
            assert not isinstance(err, StoreFull) and "Not a directory" in one_line(err)
        # reads may also answer "no such run"; what matters is that no raw OSError escapes
    for call in (lambda: store.acquire("r"), lambda: store.objects.put("k", b"1")):
        with pytest.raises(StoreUnavailable):
            call()
    assert tree(tmp_path) == before


def test_a_failing_view_never_breaks_an_append(project):
    caravanserai.checkpoint("views", {"i": 1}, "one")
    run_dir = project / ".caravanserai" / "views"
    open_store(None).flush_views()
    (run_dir / "state.json").unlink()
    (run_dir / "state.json").mkdir()  # the next render of state.json cannot replace a directory
    assert caravanserai.checkpoint("views", {"i": 2}, "two") == 2
    open_store(None).flush_views()
    caravanserai.runs.close_all()
    assert caravanserai.load_latest("views") == ({"i": 2}, "two", 2)


# ---- 4. damaged and shrunk journals ---------------------------------------------------------------
def _three_waypoints(project: Path, run_id: str = "shrunk") -> Path:
    for i in (1, 2, 3):
        caravanserai.checkpoint(run_id, {"i": i}, f"step {i}")
    caravanserai.runs.close_all()
    open_store(None).flush_views()
    return project / ".caravanserai" / run_id


def _keep_lines(count: int):
    def cut(path: Path) -> None:
        lines = path.read_bytes().split(b"\n")
        path.write_bytes(b"\n".join(lines[:count]) + b"\n" if count else b"")
    return cut


def _garble_line(path: Path) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1][:30] + b"garbage"
    path.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("damage, match", [
    (_keep_lines(0), "holds no waypoint but the views show waypoint 3"),
    (_keep_lines(2), "holds waypoints up to 1 but the views show waypoint 3"),
    (_keep_lines(3), "holds waypoints up to 2 but the views show waypoint 3"),
], ids=["emptied", "cut-to-1", "cut-to-2"])
def test_an_emptied_or_shrunk_journal_is_damage_not_a_fresh_run(project, damage, match):
    run_dir = _three_waypoints(project)
    damage(run_dir / "journal.jsonl")
    before = {k: v for k, v in tree(run_dir).items() if k != "lock"}
    store = open_store(None)
    attempts = [lambda: store.load("shrunk"), lambda: store.acquire("shrunk"),
                lambda: caravanserai.checkpoint("shrunk", {"i": 0}, "start over?"),
                lambda: caravanserai.load_latest("shrunk"), lambda: caravanserai.durable("shrunk").__enter__()]
    for attempt in attempts:
        with pytest.raises(JournalCorruptionError) as info:
            attempt()
        text = one_line(info.value)
        assert match in text and "journal.jsonl" in text and "restore journal.jsonl from a backup" in text
        assert "nothing was changed" in text
    assert {k: v for k, v in tree(run_dir).items() if k != "lock"} == before
    fd = os.open(run_dir / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no failed attempt left the run locked
    finally:
        os.close(fd)


def test_lagging_views_and_restarted_numbering_are_not_damage(project):
    run_dir = _three_waypoints(project, "lag")
    (run_dir / "waypoint-3.md").unlink()  # a kill before the views caught up
    (run_dir / "latest").write_text("2")
    assert len(open_store(None).load("lag")) == 4
    run = caravanserai.runs.open_run("lag")
    run.append({"type": "restarted"})  # %%resumable --restart: numbering starts again at 1
    assert run.checkpoint({"again": 1}, "after restart") == 1
    run.close()
    open_store(None).flush_views()
    assert (run_dir / "latest").read_text() == "1" and (run_dir / "waypoint-3.md").exists()
    assert caravanserai.load_latest("lag") == ({"again": 1}, "after restart", 1)


def test_a_garbled_line_and_a_torn_tail(project):
    run_dir = _three_waypoints(project, "torn")
    path = run_dir / "journal.jsonl"
    store = open_store(None)
    intact = path.read_bytes()
    path.write_bytes(intact + b'{"v":1,"seq":4,"at":"2026-' + b"\x00" * 40)
    assert store.torn_tail("torn") == len(b'{"v":1,"seq":4,"at":"2026-') + 40
    assert store.load("torn") == intact.decode().splitlines()
    path.write_bytes(intact)
    assert store.torn_tail("torn") == 0
    _garble_line(path)
    garbled = path.read_bytes()
    with pytest.raises(JournalCorruptionError) as info:
        caravanserai.load_latest("torn")
    assert info.value.line == 2 and "\n" not in str(info.value)
    assert path.read_bytes() == garbled


def test_a_corrupt_0_2_0_state_file_is_journal_corruption(tmp_path):
    run_dir = tmp_path / "s" / "old"
    run_dir.mkdir(parents=True)
    (run_dir / "waypoint-1.md").write_text("# Waypoint 1 - 2026-11-29T22:27:31+00:00\n\nstep 1\n")
    (run_dir / "state.json").write_text('{"step": ')
    (run_dir / "latest").write_text("1")
    before = tree(tmp_path)
    store = LocalStore(tmp_path / "s")
    for call in (lambda: store.load("old"), lambda: store.acquire("old")):
        with pytest.raises(JournalCorruptionError) as info:
            call()
        assert "state.json" in one_line(info.value)
    assert {k: v for k, v in tree(tmp_path).items() if k != "s/old/lock"} == before


# ---- 5. RunLocked names the holder, even under contention ---------------------------------------
CHILD_LOCKER = textwrap.dedent("""
    import json, os, random, sys, time
    from caravanserai import RunLocked
    from caravanserai.stores import LocalStore
    root, start, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    store = LocalStore(root)
    while time.monotonic() < start:
        time.sleep(0.001)
    holds, named, unnamed = [], {}, []
    while time.monotonic() < start + seconds:
        t0 = time.monotonic()
        try:
            lease = store.acquire("contended")
        except RunLocked as err:
            t1 = time.monotonic()
            holder = err.holder or {}
            if not isinstance(holder.get("pid"), int) or f"pid {holder['pid']}" not in str(err):
                unnamed.append(str(err))
                continue
            # refusals naming one hold: the hold must overlap all of them, i.e. the latest start and the earliest end
            key = f"{holder['pid']}/{holder.get('token')}"
            seen = named.setdefault(key, [t0, t1, 0])
            seen[0], seen[1], seen[2] = max(seen[0], t0), min(seen[1], t1), seen[2] + 1
            continue
        time.sleep(random.random() * 0.004)
        lease.release()
        holds.append([os.getpid(), lease.token, t0, time.monotonic()])
    print(json.dumps({"holds": holds, "named": named, "unnamed": unnamed[:5]}))
""")


def test_run_locked_always_names_a_live_holder(tmp_path, child_env):
    root = tmp_path / "s"
    LocalStore(root).acquire("contended").release()  # the run directory exists before the race
    start = time.monotonic() + 3.0
    procs = [subprocess.Popen([PYTHON, "-c", CHILD_LOCKER, str(root), str(start), "2.5"], env=child_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    holds: dict[str, tuple[float, float]] = {}
    named: list[tuple[str, list]] = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        result = json.loads(out)
        assert result["unnamed"] == []  # never "another process"
        holds.update({f"{pid}/{token}": (h0, h1) for pid, token, h0, h1 in result["holds"]})
        named.extend(result["named"].items())
    assert holds and sum(seen[2] for _, seen in named) > 0
    for key, (latest_start, earliest_end, count) in named:
        # the named holder (pid and token) held the lock at some moment of every refusal naming it
        assert key in holds, (key, count)
        h0, h1 = holds[key]
        assert latest_start <= h1 and earliest_end >= h0, (key, count, holds[key], latest_start, earliest_end)


HOLDER = textwrap.dedent("""
    import sys, time
    from caravanserai.stores import open_store
    lease = open_store(sys.argv[1]).acquire(sys.argv[2])
    print("held", flush=True)
    time.sleep(60)
""")


def test_append_event_names_the_holder_when_the_run_stays_locked(tmp_path, child_env):
    from caravanserai import RunLocked
    from caravanserai.runs.lifecycle import append_event

    root = tmp_path / "s"
    child = subprocess.Popen([PYTHON, "-c", HOLDER, str(root), "held"], env=child_env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        before = tree(root / "held")
        with pytest.raises(RunLocked) as info:
            append_event(LocalStore(root), "held", {"type": "note"}, tries=3)
        text = one_line(info.value)
        assert info.value.holder["pid"] == child.pid and f"pid {child.pid} on " in text and " since " in text
        assert "another process" not in text and "(3 tries)" in text and "a note event" in text
        assert {k: v for k, v in tree(root / "held").items() if k != "lock"} == \
            {k: v for k, v in before.items() if k != "lock"}  # nothing appended
    finally:
        child.kill()
        child.wait()


def test_sql_run_locked_names_the_holder_or_says_why_it_cannot(tmp_path, monkeypatch):
    from caravanserai import RunLocked

    path = str(tmp_path / "runs.db")
    holder_store, other = SqliteStore(path), SqliteStore(path)
    lease = holder_store.acquire("busy")
    with pytest.raises(RunLocked) as info:
        other.acquire("busy")
    assert info.value.holder["lease"] == lease.holder["lease"] and f"pid {os.getpid()} on " in one_line(info.value)
    real = other._q
    reads: list[str] = []

    def lease_ends_between_reads(name, params):  # the holder's lease ended between the take and the read
        reads.append(name)
        return [] if name == "live_holder" else real(name, params)

    monkeypatch.setattr(other, "_q", lease_ends_between_reads)
    with pytest.raises(RunLocked) as info:
        other.acquire("busy")
    assert reads.count("acquire") == 2 and reads.count("live_holder") == 2  # read again once
    assert info.value.holder["lease"] == lease.holder["lease"] and "its lease ended just after" in one_line(info.value)
    monkeypatch.setattr(other, "_q", lambda name, params: [] if name in ("live_holder", "holder") else real(name, params))
    with pytest.raises(RunLocked) as info:
        other.acquire("busy")
    text = one_line(info.value)
    assert info.value.holder is None and "lease row vanished or named no holder when read, on two tries" in text
    assert "another process" not in text
    lease.release()
    holder_store.close()
    other.close()


def test_object_store_run_locked_names_the_writer_that_won_the_race(monkeypatch):
    from caravanserai import RunLocked
    from caravanserai.stores import IfVersion, MemoryObjects
    from caravanserai.stores.objects import BucketStore

    objects = MemoryObjects()
    first, racer, late = (BucketStore(objects, lease_ttl_ms=3000) for _ in range(3))
    first.acquire("race").release()  # the lease object exists, expired: anyone may take it over
    taken: list = []
    real_put = late._bucket.put

    def racer_wins(key, data, mode="overwrite"):  # (the three stores share this object face)
        if key == late._lease_key("race") and isinstance(mode, IfVersion) and not taken:
            taken.append(None)
            taken[0] = racer.acquire("race")  # another writer's CAS lands between this one's read and write
        return real_put(key, data, mode=mode)

    monkeypatch.setattr(late._bucket, "put", racer_wins)
    with pytest.raises(RunLocked) as info:
        late.acquire("race")
    text = one_line(info.value)
    assert info.value.holder["lease"] == taken[0].holder["lease"] and f"pid {os.getpid()} on " in text
    assert "just taken by another writer" not in text
    taken[0].release()


# ---- 6. SQLite file modes -------------------------------------------------------
def test_sqlite_files_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        store = open_store(f"sqlite:///{tmp_path}/priv.db")
        _write(store, "r")
        for name in ("priv.db", "priv.db-wal", "priv.db-shm"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
        store.close()
    finally:
        os.umask(old)


# ---- 7. open_store's cache forgets closed stores ------------------------------------------------
# close-then-reopen by URL on every backend (the journal service included) is a conformance case:
# StoreConformance.test_close_then_open_store_again_lists_and_appends (caravanserai/testing).
def test_a_closed_sqlite_store_says_so_in_one_line(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/closed.db")
    store.close()
    with pytest.raises(StoreUnavailable) as info:
        store.list()
    one_line(info.value)
    assert open_store(f"sqlite:///{tmp_path}/closed.db").list() == []


# ---- 8. object storage: no panics, no dumps, no metadata URLs --------------------------------------
def _s3_url(s3, **extra: str) -> str:
    bucket = f"safe-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(bucket)
    query = "&".join(f"{k}={v}" for k, v in {"endpoint": s3.endpoint, "region": "us-east-1", **extra}.items())
    return f"s3://{bucket}/p?{query}"


def test_allow_http_and_an_http_endpoint_work(s3):
    store = open_store(_s3_url(s3, allow_http="true", access_key_id="testing", secret_access_key="testing"))
    lines = _write(store, "r")
    assert store.load("r") == lines


def test_missing_credentials_name_the_environment_variables(s3, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_SKIP_SIGNATURE"):
        monkeypatch.delenv(name, raising=False)
    metadata = f"http://127.0.0.1:{free_port()}"  # never a cloud endpoint: a closed loopback port
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", metadata)
    store = open_store(_s3_url(s3))
    with pytest.raises(StoreUnavailable) as info:
        store.load("r")
    text = one_line(info.value)
    assert "AWS_ACCESS_KEY_ID" in text and "AWS_SECRET_ACCESS_KEY" in text
    assert metadata not in text and "169.254" not in text and "/latest/" not in text and "Debug" not in text


def test_a_rust_panic_becomes_one_line_and_interrupts_pass_through():
    need_module("obstore", "s3")
    from obstore.store import from_url

    from caravanserai.stores.obstore_objects import ObstoreObjects

    objects = ObstoreObjects(None, "s3://bucket")
    with pytest.raises(StoreUnavailable) as info:  # obstore 0.12 panics on a client option given as config
        objects._call(lambda: from_url("s3://bucket", config={"allow_http": "true"}))
    assert "failed internally" in one_line(info.value)

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        objects._call(interrupted)


def test_an_unreachable_endpoint_is_one_line_without_a_debug_dump():
    need_module("obstore", "s3")
    store = open_store(f"s3://nowhere/x?endpoint=http://127.0.0.1:{free_port()}&region=us-east-1&access_key_id=a"
                       "&secret_access_key=hunter2")
    with pytest.raises(StoreUnavailable) as info:
        store.load("r")
    text = one_line(info.value)
    assert "Debug source" not in text and "hunter2" not in text and "failed" in text


# ---- 9. the HTTP client maps the service's typed errors --------------------------------------------
def test_service_errors_keep_their_type_over_http(tmp_path):
    need_module("starlette", "http")
    httpx = need_module("httpx", "http")
    from caravanserai.service import create_app
    from starlette.testclient import TestClient

    from caravanserai.stores.http import HttpDurableStore

    project = tmp_path
    backing = LocalStore(project / "served")
    _write(backing, "r", 1)
    run_dir = project / "served" / "r"
    (run_dir / "waypoint-5.md").write_text("# Waypoint 5 - 2026-11-29T22:27:31+00:00\n\nahead\n")
    test_client = TestClient(create_app(backing, "tok"))

    def forward(request):
        answer = test_client.request(request.method, request.url.path, content=request.content,
                                     headers=dict(request.headers))
        return httpx.Response(answer.status_code, content=answer.content, headers=answer.headers)

    client = HttpDurableStore("http://127.0.0.1:9", "tok", transport=http_handler_transport(forward), retries=0)
    before = tree(project)
    for call in (lambda: client.load("r"), lambda: client.acquire("r")):
        with pytest.raises(JournalCorruptionError) as info:
            call()
        assert "waypoint 5" in one_line(info.value)
    assert {k: v for k, v in tree(project).items() if not k.endswith("lock")} == {
        k: v for k, v in before.items() if not k.endswith("lock")}
    client.close()


def test_a_missing_bucket_is_one_line_with_the_servers_reason(s3):
    store = open_store(f"s3://missing-{uuid.uuid4().hex[:8]}/p?endpoint={s3.endpoint}&region=us-east-1"
                       "&access_key_id=testing&secret_access_key=testing")
    with pytest.raises(StoreUnavailable) as info:
        store.list()
    text = one_line(info.value)
    assert "NoSuchBucket" in text and "<?xml" not in text
