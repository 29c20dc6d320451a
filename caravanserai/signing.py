"""A signing identity per person (Ed25519), and the keys this person trusts, as Jupyter trusts notebooks.

Whatever a reader could execute or render as active content (a pickled value, a recorded launch
command, a re-shown rich output bundle) is signed with its writer's key when written, and used
only when the signature verifies against the reader's own key or a key the reader trusts (or the
store is trusted explicitly, ``runs.trust``). File modes cannot tell an author from a colleague
whose store was unpacked under the same OS user; a key the colleague does not hold can.

- The key: ``$CARAVANSERAI_KEY_FILE``, else ``$XDG_DATA_HOME/caravanserai/signing_key`` (else
  ``~/.local/share/caravanserai/signing_key``), a PKCS#8 PEM file created on first use with mode
  0600 in a 0700 directory. A key file others can read is refused, as ssh refuses one.
- Trusted keys: ``caravanserai trust --key`` writes ``trusted_keys`` next to the default key (one
  ``ed25519:… name`` per line); ``CARAVANSERAI_TRUSTED_KEYS`` adds a comma-separated list.
- A public key is written ``ed25519:`` + its 32 bytes in unpadded URL-safe base64.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import KeyFileInvalid, PublicKeyInvalid

__all__ = ["KEY_ENV", "TRUSTED_KEYS_ENV", "Identity", "add_trusted_key", "data_dir", "identity", "item_message",
           "key_path", "line_signature", "line_signer", "parse_public_key", "sha256", "short", "trusted_keys",
           "verify"]

KEY_ENV = "CARAVANSERAI_KEY_FILE"
TRUSTED_KEYS_ENV = "CARAVANSERAI_TRUSTED_KEYS"
RETIRED_ENV = "CARAVANSERAI_SIGNING_KEY"
PREFIX = "ed25519:"
_PUBLIC = re.compile(r"ed25519:[A-Za-z0-9_-]{43}")
_CACHE: dict[tuple[str, int, int], Identity] = {}
_warned_retired = False
_warned_unsigned = False
_KEYS_CACHE: list = []  # [(file, its mtime, the env variable, own key), keys]: judge asks once per item


def data_dir() -> Path:
    """This person's caravanserai data directory (``$XDG_DATA_HOME/caravanserai`` or ``~/.local/share/caravanserai``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "caravanserai"


def key_path() -> Path:
    """Where this person's private key is (``CARAVANSERAI_KEY_FILE`` or ``data_dir()/signing_key``)."""
    named = os.environ.get(KEY_ENV)
    return Path(os.path.expanduser(named)) if named else data_dir() / "signing_key"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def short(public: str) -> str:
    """A public key as people read it: ``ed25519:AbCdEfGh…`` (anything else read from a store: its repr, cut)."""
    return public[: len(PREFIX) + 8] + "…" if isinstance(public, str) and _PUBLIC.fullmatch(public) else repr(public)[:40]


@dataclass(frozen=True)
class Identity:
    """This person's key pair: ``sign`` bytes; ``public`` is what others put in their trusted keys."""

    path: Path
    public: str
    _private: object

    def sign(self, message: bytes) -> str:
        return _b64(self._private.sign(message))  # type: ignore[attr-defined]


def identity(*, create: bool = True) -> Identity:
    """This person's identity, its key created on first use (KeyFileInvalid if the file is unusable or
    others can read it: checked at every call, since a key that leaked must stop signing at once)."""
    path = key_path()
    try:
        info = path.stat()
    except FileNotFoundError:
        if not create:
            raise KeyFileInvalid(f"you have no signing key yet ({path})", path=str(path)) from None
        _create(path)
        info = _stat(path)
    except OSError as exc:
        raise KeyFileInvalid(f"cannot read your signing key {path} ({exc.strerror or exc}); fix its permissions or set "
                             f"{KEY_ENV} to another file", path=str(path)) from None
    if info.st_mode & 0o077:
        raise KeyFileInvalid(f"your signing key {path} can be read by others (mode {info.st_mode & 0o777:o}): run "
                             f"chmod 600 {path}", path=str(path))
    stamp = (str(path), info.st_ino, info.st_mtime_ns)
    found = _CACHE.get(stamp)
    if found is None:
        found = _CACHE[stamp] = _load(path)
    _warn_retired()
    return found


def signer() -> Identity | None:
    """``identity()`` for a writer: None (said once on stderr) when the key cannot be made or used, so
    a read-only home or a key others can read does not stop a run; what it writes then is unsigned."""
    global _warned_unsigned
    try:
        return identity()
    except KeyFileInvalid as exc:
        if not _warned_unsigned:
            _warned_unsigned = True
            print(f"[caravanserai] writing unsigned ({exc.message}): your pickled values, launch commands and outputs "
                  "will not load or run for you without trusting the store", file=sys.stderr)
        return None


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except OSError as exc:  # a dangling symlink where the key goes
        raise KeyFileInvalid(f"cannot use {path} as your signing key ({exc.strerror or exc}); remove it or set "
                             f"{KEY_ENV} to another file", path=str(path)) from None


def _create(path: Path) -> None:
    """Write a new private key to ``path`` with mode 0600, atomically: two processes starting at once
    end with one key (the loser of ``os.link`` reads the winner's)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption())
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".signing_key.", dir=path.parent)  # mkstemp: mode 0600
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(pem)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process made it first: use theirs
            except OSError:  # a file system without hard links: create-if-absent another way (O_EXCL)
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                    out.write(pem)
        finally:
            os.unlink(tmp)
    except OSError as exc:
        raise KeyFileInvalid(f"cannot create your signing key at {path} ({exc.strerror or exc}); set {KEY_ENV} to a "
                             "writable file path", path=str(path)) from None


# The PKCS#8 DER of an Ed25519 private key (RFC 8410) before its 32-byte seed: the form _create writes
_PKCS8_ED25519 = bytes.fromhex("302e020100300506032b657004220420")


def _load(path: Path) -> Identity:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileInvalid(f"cannot read your signing key {path} ({exc.strerror or exc}); fix its permissions or set "
                             f"{KEY_ENV} to another file", path=str(path)) from None
    key = _seed_key(data)
    if key is None:  # another PEM form: cryptography's full loader (its import costs ~45 ms, so not first)
        from cryptography.hazmat.primitives import serialization

        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileInvalid(f"{path} is not an Ed25519 private key in PEM form: move it away and a new key is made "
                             f"(or set {KEY_ENV})", path=str(path))
    return Identity(path, PREFIX + _b64(key.public_key().public_bytes_raw()), key)


def _seed_key(pem: bytes) -> Any:
    """The key of a PEM ``PRIVATE KEY`` holding the plain PKCS#8 Ed25519 form, else None."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    lines = pem.strip().splitlines()
    if len(lines) < 3 or lines[0] != b"-----BEGIN PRIVATE KEY-----" or lines[-1] != b"-----END PRIVATE KEY-----":
        return None
    try:
        der = base64.b64decode(b"".join(lines[1:-1]), validate=True)
    except ValueError:
        return None
    if len(der) != 48 or not der.startswith(_PKCS8_ED25519):
        return None
    return Ed25519PrivateKey.from_private_bytes(der[16:])


def _warn_retired() -> None:
    global _warned_retired
    if os.environ.get(RETIRED_ENV) and not _warned_retired:
        _warned_retired = True
        print(f"[caravanserai] {RETIRED_ENV} is retired and ignored: pickles are signed with your own key (caravanserai "
              "key); trust a colleague's with caravanserai trust --key", file=sys.stderr)


def parse_public_key(text: str) -> str:
    """``text`` as a public key (``ed25519:`` + 43 characters); PublicKeyInvalid otherwise."""
    key = text.strip()
    if not _PUBLIC.fullmatch(key):
        raise PublicKeyInvalid(f"{key[:60]!r} is not a caravanserai public key (ed25519: and 43 characters, as "
                               "`caravanserai key` prints it)", key=key[:60])
    return key


def verify(public: str, message: bytes, signature: Any) -> bool:
    """True if ``signature`` is ``public``'s signature of ``message`` (False for any malformed part)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not (isinstance(public, str) and _PUBLIC.fullmatch(public) and isinstance(signature, str)
            and len(signature) == 86):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(_unb64(public[len(PREFIX):])).verify(_unb64(signature), message)
    except (InvalidSignature, ValueError):
        return False
    return True


def trusted_keys_path() -> Path:
    return data_dir() / "trusted_keys"


def trusted_keys() -> dict[str, str]:
    """Public key -> a name for it: this person's own key ("yours"), ``trusted_keys`` and ``CARAVANSERAI_TRUSTED_KEYS``."""
    path = trusted_keys_path()
    try:
        info = path.stat()
        stamp: tuple | None = (info.st_ino, info.st_size, info.st_mtime_ns)
    except OSError:
        stamp = None
    try:
        mine = identity(create=False).public  # a reader never makes a key
    except KeyFileInvalid:
        mine = ""
    cache_key = (str(path), stamp, os.environ.get(TRUSTED_KEYS_ENV, ""), mine)
    if _KEYS_CACHE and _KEYS_CACHE[0] == cache_key:
        return _KEYS_CACHE[1]
    keys: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8") if stamp is not None else ""
    except (OSError, UnicodeDecodeError):
        text = ""
    for line in text.splitlines():
        key, _, name = line.strip().partition(" ")
        if _PUBLIC.fullmatch(key):
            keys[key] = name.strip() or short(key)
    for key in cache_key[2].split(","):
        if _PUBLIC.fullmatch(key.strip()):
            keys.setdefault(key.strip(), short(key.strip()))
    if mine:
        keys[mine] = "yours"
    _KEYS_CACHE[:] = [cache_key, keys]
    return keys


def add_trusted_key(key: str, name: str = "") -> Path:
    """Trust ``key`` (named ``name``) from now on; returns the file that holds it."""
    key = parse_public_key(key)
    name = " ".join(name.split()) or short(key)
    path = trusted_keys_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.split(" ", 1)[0] != key]
    except FileNotFoundError:
        lines = []
    lines.append(f"{key} {name}")
    tmp = path.with_name(f".trusted_keys.{os.getpid()}")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def item_message(kind: str, name: str, sha256: str) -> bytes:
    """What an item's signature covers: what it is (``pickle``, ``command``, ``display``), its name and
    its bytes' SHA-256 (hex), so a signature cannot be moved to another kind of item or another variable."""
    return f"caravanserai item v1\n{kind}\n{name}\n{sha256}".encode()


def sha256(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def line_signer() -> Callable[[bytes], str]:
    """Signs a journal line for a store opened with ``?signed=1``: ``ed25519:KEY.SIGNATURE`` (KeyFileInvalid
    without a usable key: a signed journal is asked for explicitly)."""
    me = identity()
    return lambda line: f"{me.public}.{me.sign(line)}"


_LINE_SIG = re.compile(r',"sig":"(ed25519:[A-Za-z0-9_-]{43})\.([A-Za-z0-9_-]{86})"}$')


def line_signature(line: str) -> tuple[str, bool] | None:
    """(the key, whether its signature verifies) for a signed journal line, None for an unsigned one.
    The signature covers the line as it was before ``,"sig":…`` was added, ``prev`` (the chain) included."""
    match = _LINE_SIG.search(line)
    if match is None:
        return None
    body = line[: match.start()] + "}"
    return match.group(1), verify(match.group(1), body.encode("utf-8"), match.group(2))
