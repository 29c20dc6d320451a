"""The journal store's HTTP connections (``stores/http_wire.py``) against a real HTTP/1.1 server.

The server is the standard library's ``ThreadingHTTPServer`` on loopback (plain and TLS), so the
answers come over real sockets in the shapes a proxy or server may send: keep-alive, ``Connection:
close``, chunked, a body ended by closing, the answer to HEAD. Every case runs twice: with httptools
parsing the answers (the fast path, when the ``[http]`` extra is installed) and with ``http.client``
alone (what runs without it).
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need_module

from caravanserai.stores import http_wire
from caravanserai.stores.http_wire import Wire, WireError


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless an answer says otherwise

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1  # type: ignore[attr-defined]

    def parse_request(self) -> bool:
        self.server.requests += 1  # type: ignore[attr-defined]  # every request line that arrived
        return super().parse_request()

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, body: bytes, *, headers: dict[str, str] | None = None, length: bool = True) -> None:
        self.send_response(status, "Quite Fine" if status == 200 else None)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/json?a=1&b=two":
            self._answer(200, b'{"big": 123456789012345678901234567890, "x": "\\u00e9"}',
                         headers={"Content-Type": "application/json", "X-Twice": "one"})
        elif self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"hello ", b"chunked ", b"world"):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/until-close":  # no length, not chunked: the body ends with the connection
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"all of it")
            self.close_connection = True
        elif self.path == "/close":
            self._answer(200, b"bye", headers={"Connection": "close"})
            self.close_connection = True
        elif self.path == "/quietly-closed":  # no "Connection: close", but closed after the answer
            self._answer(200, b"kept?")
            self.close_connection = True
        elif self.path == "/hang-up":  # a server that hangs up without answering
            self.close_connection = True
        elif self.path == "/half":  # announces 100 bytes, sends 4, hangs up
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"half")
            self.close_connection = True
        elif self.path == "/interim":  # a 100 Continue before the answer, as a server may send
            self.send_response_only(100)
            self.end_headers()
            self.wfile.flush()
            self._answer(200, b"after the interim")
        elif self.path == "/accept":  # how many Accept headers came
            self._answer(200, str(len(self.headers.get_all("Accept") or [])).encode() + b" " +
                         (self.headers.get("Accept") or "").encode())
        elif self.path == "/empty":
            self._answer(204, b"", length=False)
        else:
            self._answer(404, b"no such thing")

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1234")  # the size of what GET would send
        self.end_headers()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        echo = f'{{"got": {body.decode()}, "key": "{self.headers.get("Idempotency-Key")}", ' \
               f'"type": "{self.headers.get("Content-Type")}", "auth": "{self.headers.get("Authorization")}"}}'
        self._answer(201, echo.encode())


def _serve(context: ssl.SSLContext | None = None) -> Iterator[tuple[str, http.server.ThreadingHTTPServer]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.connections = server.requests = 0  # type: ignore[attr-defined]
    server.daemon_threads = True
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if context else 'http'}://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(params=["httptools", "http.client"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which of the two paths parses answers; httptools is in the [http] and [test] extras."""
    if request.param == "httptools":
        need_module("httptools", "http")
        assert http_wire.httptools is not None
    else:
        monkeypatch.setattr(http_wire, "httptools", None)
    return request.param


@pytest.fixture
def server() -> Iterator[tuple[str, http.server.ThreadingHTTPServer]]:
    yield from _serve()


@pytest.fixture
def wired(parser: str, server: tuple[str, http.server.ThreadingHTTPServer]) -> Iterator[tuple[Wire, str, Any]]:
    """A ``Wire`` to the plain server (with a default Authorization header), its URL and the server."""
    base, srv = server
    wire = Wire(base, {"Authorization": "Bearer t"}, 5.0)
    try:
        yield wire, base, srv
    finally:
        wire.close()


def test_answers_of_every_shape_are_read_whole_and_the_connection_kept_when_it_may_be(wired) -> None:
    wire, base, srv = wired
    answer = wire.request("GET", base + "/json", params={"a": "1", "b": "two"})
    assert (answer.status_code, answer.reason_phrase) == (200, "Quite Fine")
    assert answer.json() == {"big": 123456789012345678901234567890, "x": "\u00e9"}  # beyond 64 bits: exact
    assert answer.headers["content-type"] == "application/json" and answer.headers["x-twice"] == "one"
    assert wire.request("HEAD", base + "/object").headers["content-length"] == "1234"  # and no body waited for
    assert wire.request("GET", base + "/chunked").content == b"hello chunked world"
    posted = wire.request("POST", base + "/echo", json_body={"lines": ["a\u00e9"]}, headers={"Idempotency-Key": "k1"})
    assert posted.status_code == 201
    assert posted.json() == {"got": {"lines": ["a\u00e9"]}, "key": "k1", "type": "application/json", "auth": "Bearer t"}
    assert wire.request("GET", base + "/empty").status_code == 204
    interim = wire.request("GET", base + "/interim")
    assert (interim.status_code, interim.reason_phrase, interim.content) == (200, "Quite Fine", b"after the interim")
    assert wire.request("GET", base + "/accept").content == b"1 application/json"
    assert wire.request("GET", base + "/accept", headers={"Accept": "text/plain"}).content == b"1 text/plain"
    assert wire.request("GET", base + "/missing").status_code == 404
    assert srv.connections == 1  # every answer so far left the connection open: one connection did it all
    assert wire.request("GET", base + "/close").content == b"bye"
    assert wire.request("GET", base + "/until-close").content == b"all of it"
    assert wire.request("GET", base + "/chunked").content == b"hello chunked world"
    assert srv.connections == 3  # each answer that closed its connection was followed by a new one


def test_a_connection_the_server_closed_while_idle_is_left_out(wired) -> None:
    wire, base, srv = wired
    assert wire.request("GET", base + "/quietly-closed").content == b"kept?"  # looks kept-alive, is closed
    assert len(wire._idle) == 1
    assert wire.request("GET", base + "/chunked").content == b"hello chunked world"
    assert srv.connections == 2  # the closed one was left out (its socket read EOF), not written into


def test_a_kept_alive_connection_found_closed_only_when_written_to_is_sent_again_once(wired, monkeypatch) -> None:
    wire, base, srv = wired
    assert wire.request("GET", base + "/quietly-closed").content == b"kept?"
    monkeypatch.setattr(http_wire.select, "select", lambda r, w, x, t: ([], [], []))  # the check misses the close
    assert wire.request("GET", base + "/chunked").content == b"hello chunked world"  # resent on a new connection
    assert srv.connections == 2


def test_a_server_that_hangs_up_or_stops_mid_body_is_a_wire_error(wired) -> None:
    wire, base, srv = wired
    with pytest.raises(WireError) as hung:
        wire.request("GET", base + "/hang-up")
    assert "\n" not in str(hung.value) and "Remote" in str(hung.value)
    with pytest.raises(WireError) as half:
        wire.request("GET", base + "/half")
    assert "\n" not in str(half.value)
    assert wire.request("GET", base + "/chunked").status_code == 200  # a new connection after each


def test_a_request_target_with_a_space_or_control_character_is_refused_before_sending(wired) -> None:
    wire, base, srv = wired
    for target in ("/a b", "/a\x00b", "/a\x7fb"):
        with pytest.raises(WireError, match="control characters|Invalid|can't contain"):
            wire.request("GET", base + target)
    with pytest.raises(ValueError):
        wire.request("GET", base + "/chunked", headers={"X-Note": "a\r\nX-Injected: 1"})
    assert srv.requests == 0  # nothing was sent for any of them


def _certificates(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for 127.0.0.1 it signed with its key, made with cryptography (a core
    dependency), with the extensions a strict verifier (Python 3.13's default) asks for."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def issue(subject: str, key, issuer: str, issuer_key, ca: bool):
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                                data_encipherment=False, key_agreement=False, key_cert_sign=ca,
                                                crl_sign=ca, encipher_only=False, decipher_only=False), critical=True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                  critical=False))
        if not ca:
            builder = (builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                             critical=False)
                       .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = issue("caravanserai test CA", ca_key, "caravanserai test CA", ca_key, True)
    leaf = issue("127.0.0.1", leaf_key, "caravanserai test CA", ca_key, False)
    paths = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    return paths


def test_tls_answers_are_read_over_the_verified_connection_and_an_untrusted_one_is_refused(
        parser, tmp_path, monkeypatch) -> None:
    ca, cert, key = _certificates(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    served = _serve(context)
    base, srv = next(served)
    try:
        untrusted = Wire(base, {}, 5.0)
        with pytest.raises(WireError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusted.request("GET", base + "/chunked")
        untrusted.close()
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # what ssl.create_default_context() trusts too
        wire = Wire(base, {}, 5.0)
        try:
            assert wire.request("GET", base + "/chunked").content == b"hello chunked world"
            assert wire.request("POST", base + "/echo", json_body=[1], headers={"Idempotency-Key": "k"}).json()["got"] == [1]
            assert wire.request("GET", base + "/until-close").content == b"all of it"
            assert wire.request("GET", base + "/chunked").status_code == 200
        finally:
            wire.close()
        assert srv.connections == 2  # one kept alive until /until-close, then one more (the refused handshake made none)
    finally:
        served.close()
