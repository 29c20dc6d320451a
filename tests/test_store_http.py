"""http:// against the conformance suite, through a real uvicorn service on 127.0.0.1.

The service runs in a child process (``caravanserai.service.serve``) backed by a SQLite file or a
local directory; the errors are triggered for real: an insecure URL, a missing or wrong token, a
killed service, and a paused client fenced off after another client took its run over.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import REPO, http_handler_transport, need_module

httpx = need_module("httpx", "http", whole_module=True)  # the [http] extra: skipped locally, required under CI
need_module("starlette", "http", whole_module=True)
need_module("uvicorn", "http", whole_module=True)

from servers._proc import free_port  # noqa: E402
from servers.journal_service import JournalServiceProcess  # noqa: E402

from caravanserai import LeaseLost, RunLocked, StoreUnavailable  # noqa: E402
from caravanserai.stores import http as http_module  # noqa: E402
from caravanserai.stores import open_store  # noqa: E402
from caravanserai.stores.http import (  # noqa: E402
    HttpDurableStore,
    HttpInsecure,
    HttpTokenRequired,
    HttpUnauthorized,
)
from caravanserai.testing import StoreConformance, journal_machine, make_lines  # noqa: E402

TOKEN = "test-token-0123456789abcdef"


# ---- a real service in a child process ------------------------------------------------------------
class Server(JournalServiceProcess):
    def __init__(self, store_url: str, token: str = TOKEN, port: int | None = None) -> None:
        super().__init__(store_url, token, port)

    def client(self, token: str = TOKEN, **options) -> HttpDurableStore:
        options.setdefault("lock_ttl_ms", 3000)
        return HttpDurableStore(self.url, token, **options)


_SHARED: dict[str, Server] = {}
_ROOT: list[Path] = []


def shared_server(kind: str) -> Server:
    """One service per backing kind for the whole module (started on first use)."""
    if kind not in _SHARED:
        if not _ROOT:
            _ROOT.append(Path(tempfile.mkdtemp(prefix="caravanserai-http-")))
        root = _ROOT[0]
        url = f"sqlite:///{root}/{kind}.db?lease_ttl_ms=3000" if kind == "sqlite" else str(root / "dir-store")
        _SHARED[kind] = Server(url)
    return _SHARED[kind]


@pytest.fixture(scope="module", autouse=True)
def _stop_shared_servers():
    yield
    for server in _SHARED.values():
        server.stop()
    _SHARED.clear()
    if _ROOT:
        import shutil

        shutil.rmtree(_ROOT.pop(), ignore_errors=True)


# ---- conformance ------------------------------------------------------------------------------------
class TestHttpStoreOnSqlite(StoreConformance):
    @pytest.fixture
    def store(self):
        store = shared_server("sqlite").client()
        yield store
        store.close()

    @pytest.fixture
    def store_url(self):
        return f"{shared_server('sqlite').url}/?token={TOKEN}&lease_ttl_ms=3000"


class TestHttpStoreOnLocalDirectory(StoreConformance):
    @pytest.fixture
    def store(self):
        store = shared_server("dir").client()
        yield store
        store.close()

    @pytest.fixture
    def store_url(self):
        return f"{shared_server('dir').url}/?token={TOKEN}&lease_ttl_ms=3000"


_MACHINE_STORES: list[HttpDurableStore] = []


def _machine_store() -> HttpDurableStore:
    while _MACHINE_STORES:  # the previous example's teardown has released its lease
        _MACHINE_STORES.pop().close()
    store = shared_server("sqlite").client()
    _MACHINE_STORES.append(store)
    return store


TestHttpJournalMachine = journal_machine(_machine_store).TestCase
try:
    from hypothesis import settings

    TestHttpJournalMachine.settings = settings(max_examples=50, stateful_step_count=20, deadline=None)
except ImportError:  # pragma: no cover
    pass


# ---- configuration errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["http://example.com/journal", "http://10.0.0.7:8765", "http://127.example.com"])
def test_plain_http_outside_localhost_is_refused(url):
    with pytest.raises(HttpInsecure, match="journal URL must be https outside localhost") as info:
        HttpDurableStore(url, TOKEN)
    assert info.value.code == "durable_http_insecure"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("url", ["http://localhost:1", "http://127.0.0.1:1/prefix", "http://[::1]:1",
                                 "https://journal.example.com/caravanserai"])
def test_https_or_loopback_is_accepted_without_contacting_anything(url):
    store = HttpDurableStore(url, TOKEN)
    assert TOKEN not in store.url and TOKEN not in repr(store)
    store.close()


@pytest.mark.parametrize("token", [None, "", "   "])
def test_missing_token_is_refused(token):
    with pytest.raises(HttpTokenRequired, match="needs a token") as info:
        HttpDurableStore("https://journal.example.com", token)
    assert info.value.code == "durable_http_token_required"


def test_from_url_reads_the_token_and_options_from_the_url_or_the_environment(monkeypatch):
    monkeypatch.delenv("CARAVANSERAI_HTTP_TOKEN", raising=False)
    with pytest.raises(HttpTokenRequired):
        HttpDurableStore.from_url("https://journal.example.com/x")
    store = HttpDurableStore.from_url("https://journal.example.com/x/?token=s3cret&lock_ttl_ms=5000&retries=1")
    assert (store.url, store.lock_ttl_ms, store.retries) == ("https://journal.example.com/x", 5000, 1)
    assert "s3cret" not in store.url
    monkeypatch.setenv("CARAVANSERAI_HTTP_TOKEN", "from-env")
    assert HttpDurableStore.from_url("http://localhost:9/").url == "http://localhost:9"
    with pytest.raises(ValueError, match="unknown option"):
        HttpDurableStore.from_url("https://journal.example.com/?bogus=1")
    with pytest.raises(HttpInsecure):
        HttpDurableStore.from_url("http://journal.example.com/?token=x")


def test_open_store_routes_http_urls(monkeypatch):
    from caravanserai import open_store
    from caravanserai.stores import _SCHEMES

    for scheme in ("http", "https"):  # the scheme table entries this backend needs
        monkeypatch.setitem(_SCHEMES, scheme, ("caravanserai.stores.http", "HttpDurableStore", "http"))
    monkeypatch.setenv("CARAVANSERAI_HTTP_TOKEN", TOKEN)
    store = open_store("http://127.0.0.1:9/open-store-test")
    assert isinstance(store, HttpDurableStore)


def test_the_service_refuses_to_start_without_a_token(monkeypatch, tmp_path):
    from caravanserai.service import serve

    monkeypatch.delenv("CARAVANSERAI_HTTP_TOKEN", raising=False)
    with pytest.raises(HttpTokenRequired):
        serve(str(tmp_path / "s"))
    env = {k: v for k, v in os.environ.items() if k != "CARAVANSERAI_HTTP_TOKEN"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", f"from caravanserai.service import serve; serve({str(tmp_path)!r}, "
                           f"port={free_port()})"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "needs a token" in done.stderr


# ---- errors from a real service -----------------------------------------------------------------------
@pytest.fixture
def sleeps(monkeypatch):
    """Backoff sleeps of the HTTP store, recorded (and still slept, so timing stays real)."""
    recorded: list[float] = []

    def sleep(seconds: float) -> None:
        recorded.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(http_module, "_sleep", sleep)
    return recorded


def test_wrong_token_is_a_clear_401_and_not_retried(sleeps):
    server = shared_server("sqlite")
    store = server.client(token="not-the-token")
    sent: list[str] = []
    send = store._wire.request
    store._wire.request = lambda method, url, **kw: sent.append(urlsplit(url).path) or send(method, url, **kw)  # type: ignore[method-assign]
    assert store.health()["status"] == "ok"  # /health needs no token
    sent.clear()
    with pytest.raises(HttpUnauthorized) as info:
        store.list()
    assert info.value.code == "durable_http_unauthorized"
    assert "refused the token (HTTP 401)" in str(info.value) and "not-the-token" not in str(info.value)
    assert "\n" not in str(info.value)
    assert sent == ["/v1/runs"] and sleeps == []
    with pytest.raises(HttpUnauthorized):
        store.acquire("any-run")
    store.close()


def test_killed_service_is_store_unavailable_after_bounded_retries_and_nothing_is_lost(tmp_path, sleeps):
    db = f"sqlite:///{tmp_path}/killed.db?lease_ttl_ms=3000"
    server = Server(db)
    try:
        store = server.client(retries=3)
        lease = store.acquire("k")
        first, tail = make_lines("k", 3)
        store.append("k", first, lease=lease, seq=0)
        server.kill()
        more, _ = make_lines("k", 1, tail)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            store.append("k", more, lease=lease, seq=3)
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    message = str(info.value)
    assert len(sleeps) == 3 and elapsed < 10, (sleeps, elapsed)
    assert "\n" not in message and server.url in message and "after 4 attempts" in message
    assert "nothing acknowledged was lost" in message and info.value.code == "store_unavailable"

    restarted = Server(db, port=server.port)  # the service again, same backing store: every acknowledged line is there
    try:
        assert store.load("k") == first
        lease._deadline = time.monotonic() + 60  # even with a live-looking lease, the old lease died with the service
        with pytest.raises(LeaseLost, match="not the current lease"):
            store.append("k", more, lease=lease, seq=3)
        assert store.load("k") == first
        with ThreadPoolExecutor(6) as pool:  # several kept-alive connections in the pool
            assert list(pool.map(lambda _: store.load("k"), range(12))) == [first] * 12
        assert len(store._wire._idle) > 1
        restarted.kill()  # between two requests: every kept-alive connection is dead, the service is back
        restarted = Server(db, port=server.port)
        sleeps.clear()
        assert store.load("k") == first and sleeps == []  # a fresh connection at once, no retry backoff
        store.close()
    finally:
        restarted.stop()


def test_paused_client_is_fenced_after_another_client_took_the_run_over():
    server = shared_server("sqlite")
    a, b = server.client(), server.client()
    lease = a.acquire("fenced")
    lease._stop.set()  # stop A's renewals: as if A were paused (SIGSTOP, a closed laptop lid)
    first, tail = make_lines("fenced", 1)
    a.append("fenced", first, lease=lease, seq=0)
    with pytest.raises(RunLocked) as info:
        b.acquire("fenced")
    assert info.value.holder["pid"] == os.getpid() and info.value.holder["token"] == lease.token
    time.sleep(3.3)  # past the 3 s lease, by the service's clock
    taken = b.acquire("fenced")
    assert taken.token > lease.token
    assert b.load_held(taken) == first
    more, _ = make_lines("fenced", 1, tail)
    with pytest.raises(LeaseLost, match="expired"):  # A's own deadline has passed...
        a.append("fenced", more, lease=lease, seq=1)
    lease._lost, lease._deadline = None, time.monotonic() + 60  # ...and even if A's clock still trusted the lease,
    with pytest.raises(LeaseLost, match="refused"):  # ...the service refuses its token
        a.append("fenced", more, lease=lease, seq=1)
    assert not lease.held
    b.append("fenced", more, lease=taken, seq=1)
    assert a.load("fenced") == first + more
    taken.release()
    a.close()
    b.close()


def test_lease_is_renewed_in_the_background_past_its_ttl():
    server = shared_server("sqlite")
    store = server.client()
    lease = store.acquire("renewed")
    time.sleep(4)  # longer than the 3 s lease: renewed at a third of it
    lines, _ = make_lines("renewed", 2)
    store.append("renewed", lines, lease=lease, seq=0)
    lease.release()
    assert store.load("renewed") == lines
    store.close()


def test_durable_checkpoints_through_the_service_render_views_in_the_backing_directory():
    from caravanserai.waypoints import checkpoint

    from caravanserai import history, load_latest

    server = shared_server("dir")
    store = server.client()
    assert checkpoint("views-run", {"step": 1}, "first step", store=store) == 1
    assert checkpoint("views-run", {"step": 2}, "second step", store=store) == 2
    assert load_latest("views-run", store=store) == ({"step": 2}, "second step", 2)
    assert [w.n for w in history("views-run", store=store)] == [1, 2]
    run_dir = Path(server.store_url) / "views-run"
    deadline = time.monotonic() + 10
    while not (run_dir / "waypoint-2.md").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (run_dir / "waypoint-2.md").exists()
    store.close()


# ---- requests the service refuses: typed, one line ------------------------------------------------------
class LimitedServer(Server):
    """The real service (uvicorn, a child process) with a small request body limit: ``create_app``'s
    ``max_body_bytes``, which ``serve`` passes on when patched to."""

    def __init__(self, store_url: str, max_body_bytes: int) -> None:
        self.store_url, self.port = store_url, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        code = ("import functools, caravanserai.stores.http_service as s; "
                f"s.create_app = functools.partial(s.create_app, max_body_bytes={max_body_bytes}); "
                f"s.serve({store_url!r}, port={self.port}, token={TOKEN!r})")
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("the limited service did not start")


def test_a_request_over_the_body_limit_is_store_request_too_large(tmp_path, sleeps):
    from caravanserai.errors import StoreRequestTooLarge

    server = LimitedServer(str(tmp_path / "backing"), max_body_bytes=4096)
    try:
        store = server.client()
        lease = store.acquire("big")
        small, tail = make_lines("big", 2)
        store.append("big", small, lease=lease, seq=0)
        big, _ = make_lines("big", 1, tail, blob="x" * 8000)
        with pytest.raises(StoreRequestTooLarge) as info:
            store.append("big", big, lease=lease, seq=2)
        text = str(info.value)
        assert "\n" not in text and info.value.code == "store_request_too_large" and info.value.limit == 4096
        assert "HTTP 413" in text and "4096 bytes" in text and "max_body_bytes" in text and "nothing was written" in text
        assert isinstance(info.value, ValueError) and sleeps == []  # not retried
        assert store.load("big") == small  # nothing written, nothing lost
        lease.release()
        store.close()
    finally:
        server.stop()


def test_a_service_url_with_a_wrong_path_is_one_line_in_the_cli(tmp_path):
    server = shared_server("sqlite")
    proc = subprocess.run([sys.executable, "-m", "caravanserai", "list", "--store",
                           f"{server.url}/wrong-prefix?token={TOKEN}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"caravanserai: error: {server.url}/wrong-prefix is not a caravanserai journal service")
    assert "HTTP 404" in proc.stderr and "`caravanserai serve` printed" in proc.stderr


def test_a_request_the_service_rejects_is_store_request_rejected():
    from caravanserai.errors import InvalidStoreUrl, StoreRequestRejected

    server = shared_server("sqlite")
    store = server.client()
    with pytest.raises(StoreRequestRejected) as info:  # the protocol's own 400, from the real service
        store._post("runs/rejected/append", {"token": 1, "seq": 0, "lines": "not a list"}, run_id="rejected")
    assert info.value.code == "store_request_rejected" and info.value.status == 400
    assert info.value.service_code == "bad_request" and "'lines' must be" in str(info.value)
    assert "\n" not in str(info.value) and store.load("rejected") == []
    with pytest.raises(InvalidStoreUrl) as wrong:  # a path the service does not have
        store._request("GET", "no-such-route")
    assert "is not a caravanserai journal service" in str(wrong.value) and "HTTP 404" in str(wrong.value)
    store.close()


# ---- retries and idempotency, in process ---------------------------------------------------------------
def _mock_store(handler, **options) -> HttpDurableStore:
    return HttpDurableStore("http://127.0.0.1:9", TOKEN, transport=http_handler_transport(handler), **options)


def test_5xx_is_retried_with_exponential_backoff_and_the_key_is_kept(sleeps):
    seen: list[tuple[str, str | None]] = []

    def handler(request):
        seen.append((request.url.path, request.headers.get("idempotency-key")))
        if len(seen) < 3:
            return httpx.Response(503, json={"error": {"code": "store_unavailable", "message": "db busy"}})
        return httpx.Response(200, json={"removed": True})

    store = _mock_store(handler, backoff_ms=100)
    assert store.remove("r") is True
    seen = [s for s in seen if s[0].endswith("/runs/r")]  # (remove also deletes the run's index object after)
    assert len(seen) == 3 and len({key for _, key in seen}) == 1 and seen[0][1]
    assert len(sleeps) == 2 and 0.05 <= sleeps[0] <= 0.1 and 0.1 <= sleeps[1] <= 0.2


def test_4xx_is_not_retried(sleeps):
    calls: list[int] = []

    def handler(request):
        calls.append(1)
        return httpx.Response(400, json={"error": {"code": "bad_request", "message": "'lines' must be a list"}})

    with pytest.raises(ValueError, match="must be a list"):
        _mock_store(handler).list()
    assert calls == [1] and sleeps == []


def test_persistent_5xx_becomes_store_unavailable(sleeps):
    store = _mock_store(lambda request: httpx.Response(500, text="boom"), retries=2, backoff_ms=1)
    with pytest.raises(StoreUnavailable, match=r"after 3 attempts \(HTTP 500: boom\)"):
        store.load("r")
    assert len(sleeps) == 2


# ---- the service in process -----------------------------------------------------------------------
def test_bearer_check_is_constant_time(monkeypatch):
    import hmac

    from caravanserai import service

    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(service.hmac, "compare_digest", spy)
    expected = b"s3cret-token"
    assert service.check_bearer("Bearer s3cret-token", expected)
    assert service.check_bearer("bearer s3cret-token", expected)
    assert not service.check_bearer("Bearer s3cret-tokeX", expected)
    assert not service.check_bearer("Bearer s3cret", expected)  # a prefix is not enough
    assert not service.check_bearer("Basic s3cret-token", expected)
    assert not service.check_bearer(None, expected)
    assert len(calls) == 6
    assert all(len(a) == len(b) == 32 for a, b in calls)  # digests: even the length does not leak

    from starlette.testclient import TestClient

    from caravanserai.stores.memory import MemoryStore

    client = TestClient(service.create_app(MemoryStore("auth-check"), "s3cret-token"))
    calls.clear()
    answer = client.get("/v1/runs", headers={"Authorization": "Bearer wrong"})
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized"
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert len(calls) == 1  # the app's auth goes through check_bearer
    assert client.get("/v1/runs", headers={"Authorization": "Bearer s3cret-token"}).json() == {"runs": []}
    assert client.get("/health").json()["status"] == "ok"


def test_idempotency_key_applies_a_retried_append_and_create_once():
    from caravanserai.service import create_app
    from starlette.testclient import TestClient

    from caravanserai.stores.memory import MemoryStore

    backing = MemoryStore("idempotency")
    client = TestClient(create_app(backing, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    granted = client.post("/v1/runs/r/acquire", json={"holder": {"pid": 1, "lease": "L1"}, "ttl_ms": 5000}).json()
    again = client.post("/v1/runs/r/acquire", json={"holder": {"pid": 1, "lease": "L1"}, "ttl_ms": 5000}).json()
    assert again["token"] == granted["token"]  # a retried acquire gets its own lease back
    other = client.post("/v1/runs/r/acquire", json={"holder": {"pid": 2, "lease": "L2"}, "ttl_ms": 5000})
    assert other.status_code == 409 and other.json()["error"]["holder"]["pid"] == 1
    lines, _ = make_lines("r", 2)
    body = {"token": granted["token"], "seq": 0, "lines": lines}
    first = client.post("/v1/runs/r/append", json=body, headers={"Idempotency-Key": "k1"})
    retry = client.post("/v1/runs/r/append", json=body, headers={"Idempotency-Key": "k1"})
    assert first.json() == retry.json() == {"next_seq": 2} and retry.headers["idempotent-replay"] == "true"
    assert backing.load("r") == lines
    fresh = client.post("/v1/runs/r/append", json=body, headers={"Idempotency-Key": "k2"})
    assert fresh.status_code == 409 and fresh.json()["error"] == {
        "code": "seq_mismatch", "message": "append to run 'r' at seq 0, but the journal's next seq is 2",
        "run_id": "r", "expected": 2}
    stale = client.post("/v1/runs/r/append", json={**body, "token": granted["token"] - 1, "seq": 2})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "lease_lost"
    put = {"headers": {"If-None-Match": "*", "Idempotency-Key": "p1"}, "content": b"once"}
    assert client.put("/v1/objects/a/b", **put).status_code == 201
    assert client.put("/v1/objects/a/b", **put).status_code == 201  # the same create, replayed
    assert client.put("/v1/objects/a/b", headers={"If-None-Match": "*"}, content=b"twice").status_code == 412
    assert client.get("/v1/objects/a/b").content == b"once"
    assert client.get("/v1/objects/a/missing").json()["error"]["code"] == "object_not_found"
    assert client.get("/v1/runs/..hidden").status_code == 400
    assert client.post("/v1/runs/.x/acquire", json={}).json()["error"]["code"] == "invalid_run_id"


def test_service_lets_the_backing_lease_go_one_ttl_after_a_client_lease_expired():
    """An expired client lease nobody took stays its holder's (a late renewal or append is granted);
    another client takes it over at once; the reaper frees the backing lease one TTL after expiry."""
    from caravanserai.service import JournalService

    from caravanserai.stores.memory import MemoryStore

    now = [1000.0]
    backing = MemoryStore("reaper")
    service = JournalService(backing, clock=lambda: now[0], reap_every=3600)
    try:
        granted = service.acquire("r", {"pid": 1}, 3000)
        with pytest.raises(RunLocked):
            backing.acquire("r")  # the service holds the backing lease for its client
        now[0] += 3.5  # expired, not renewed: an overloaded client
        service.reap()
        assert "r" in service._held  # within the grace
        service.renew("r", granted["token"])  # late, but nobody else took the run: still its holder's
        lines, _ = make_lines("r", 1)
        now[0] += 3.5  # expired again: a late append is granted too
        assert service.append("r", granted["token"], 0, lines, True)["next_seq"] == 1
        now[0] += 5.9
        service.reap()
        assert "r" in service._held
        now[0] += 0.2  # expired one TTL ago: the reaper lets the backing lease go
        service.reap()
        backing.acquire("r").release()
        with pytest.raises(LeaseLost):
            service.renew("r", granted["token"])
        regranted = service.acquire("r", {"pid": 2}, 3000)
        assert regranted["token"] > granted["token"]
        now[0] += 3.1  # expired: another client takes it over at once, the late holder is fenced
        taken = service.acquire("r", {"pid": 3}, 3000)
        assert taken["token"] > regranted["token"]
        with pytest.raises(LeaseLost, match="not the current lease"):
            service.renew("r", regranted["token"])
    finally:
        service.close()


def test_a_stale_client_never_meets_its_token_again_after_a_restart_and_a_re_created_run(tmp_path):
    """A local directory forgets a removed run's tokens: a service started again must still not grant a token
    that a client of its previous instance holds, or that client's late append would land in the new run."""
    from caravanserai.stores.http_service import JournalService
    from caravanserai.stores.local.store import LocalStore

    first = JournalService(LocalStore(tmp_path / "backing"), reap_every=3600)
    stale = first.acquire("again", {"pid": 1}, 3000)
    first.append("again", stale["token"], 0, make_lines("again", 1)[0], True)
    first.close()  # the service restarts; its client does not know yet
    second = JournalService(LocalStore(tmp_path / "backing"), reap_every=3600)
    try:
        assert second.remove("again")
        fresh = second.acquire("again", {"pid": 2}, 3000)
        assert fresh["token"] > stale["token"] and fresh["next_seq"] == 0
        with pytest.raises(LeaseLost):
            second.append("again", stale["token"], 0, make_lines("again", 1)[0], True)
        with pytest.raises(LeaseLost):
            second.renew("again", stale["token"])
        assert second.store.load("again") == []
    finally:
        second.close()


def test_a_backing_lease_the_service_cannot_renew_in_time_is_a_retry_not_a_lost_lease(tmp_path):
    """The service too busy to renew its own lease on the backing store, and the store briefly unreachable:
    the client's append (batched or not) and renew get 503 store_unavailable and keep the run; once the
    store answers, the same append goes through."""
    from caravanserai.stores.http_service import JournalService

    backing = open_store(f"sqlite:///{tmp_path}/busy.db?lease_ttl_ms=3000")
    service = JournalService(backing, reap_every=3600)
    try:
        granted = service.acquire("busy", {"pid": 1}, 3000)
        held = service._held["busy"]
        held.backing._stop.set()
        renew = held.backing._renew

        def unreachable() -> None:
            raise StoreUnavailable("the database did not answer", run_id="busy")

        held.backing._renew, held.backing._deadline = unreachable, time.monotonic()  # late, and cannot renew now
        lines, _ = make_lines("busy", 1)
        [answer] = service._commit([(held, "busy", 0, lines, None)], [])  # the batched path
        assert isinstance(answer, StoreUnavailable)
        with pytest.raises(StoreUnavailable):
            service.append("busy", granted["token"], 0, lines, True)  # the threaded path
        with pytest.raises(StoreUnavailable):
            service.renew("busy", granted["token"])
        assert service._held.get("busy") is held and backing.load("busy") == []
        held.backing._renew = renew  # the store answers again
        [answer] = service._commit([(held, "busy", 0, lines, None)], [])
        assert answer == {"next_seq": 1} and backing.load("busy") == lines
    finally:
        service.close()
        backing.close()


def test_run_index_reads_versions_in_one_request(tmp_path, monkeypatch) -> None:
    """The run index over the service: every run's version comes from one ``GET /v1/runs?versions=1``;
    with current entries, no journal is read."""
    import caravanserai
    from caravanserai.runs.index import check_index, list_runs

    server = Server(str(tmp_path / "backing"))
    try:
        store = server.client()
        for name in ("web-1", "web-2"):
            with caravanserai.durable(name, store=store) as run:
                run.checkpoint({"n": 1}, "one")
        listed = {e.run_id: e.summary["waypoints"] for e in list_runs(store)}
        assert listed == {"web-1": 1, "web-2": 1} and check_index(store) == []

        def no_journal_reads(run_id: str) -> list[str]:
            raise AssertionError(f"the journal of {run_id} was read although its index entry is current")

        monkeypatch.setattr(store, "_load", no_journal_reads)
        assert {e.run_id: e.summary["waypoints"] for e in list_runs(store)} == listed
        store.close()
    finally:
        server.stop()


def test_the_transport_journal_leaves_the_stores_own_requests_alone():
    """A run on the HTTP store whose id reads like a model call: its appends are neither journaled
    nor named as unjournaled model requests (they are the store's own)."""
    import warnings

    import caravanserai

    store = shared_server("sqlite").client()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with caravanserai.durable("chat-completions-generate", store=store) as run:
                run.checkpoint({"step": 1}, "one")
                receipt = run.receipt()
        assert receipt.unjournaled == [] and receipt.calls == []
    finally:
        store.close()
