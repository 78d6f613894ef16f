"""Running the proxy: `serve` (blocking, for the CLI) and `ProxyServer` (in a thread, for Python)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from claw_proxy._hygiene import (
    ACCEPT_BATCH,
    guarded_protocol,
    install_log_limits,
    raise_fd_limit,
)
from claw_proxy.config import ProxyConfig
from claw_proxy.errors import ConfigError
from claw_proxy.records import Policy
from claw_proxy.server import Proxy


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening); a port in use is a `ConfigError`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # accepted connections inherit it (with proto 0, a response's header and body writes meet
    # Nagle and the client's delayed ACK: 40 ms a request)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def uvicorn_config(proxy: Proxy, log_level: str = "warning") -> uvicorn.Config:
    """uvicorn settings with the proxy's connection limits: header timeout, connection cap
    (lowered to fit the open-file limit), keep-alive timeout, rate-limited logs."""
    c = proxy.config
    cfg = uvicorn.Config(
        proxy.app,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=5,
        backlog=ACCEPT_BATCH,  # asyncio accepts this many at once before any is seen
        http=guarded_protocol(c.header_timeout, raise_fd_limit(c.max_connections)),
    )
    install_log_limits()  # after uvicorn configured its loggers
    return cfg


def serve(
    config: ProxyConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "warning",
    announce=None,
) -> None:
    """Serve until interrupted (uvicorn, one process). The port is bound, the model loaded and
    the engines' preflight checks run (e.g. a vLLM whose logprobs mode does not fit
    `--sampling` stops the start) before `announce(url)` is called and serving starts."""
    import asyncio

    sock = bind(host, port)
    try:
        proxy = Proxy(config)
        for engine in proxy.engines.values():
            asyncio.run(engine.preflight())
        server = uvicorn.Server(uvicorn_config(proxy, log_level))
    except BaseException:
        sock.close()
        raise
    if announce is not None:
        announce(f"http://{host}:{sock.getsockname()[1]}")
    settle_gc()
    server.run(sockets=[sock])


def settle_gc() -> None:
    """Keep the garbage collector's pauses out of the answers' tails: what start-up made (the
    imported libraries, the tokenizer, the model: ~220K objects) is moved out of the collector's
    reach with `gc.freeze()`, so a full collection no longer walks it (unfrozen, full
    collections under load took up to 37 ms), and the youngest generation is collected every
    7,000 net allocations instead of 700 (reference counting frees nearly all of a request's
    objects; a young collection stays around a millisecond, where 50,000 could let the middle
    generation grow to a million objects)."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(7_000, 10, 10)


class ProxyServer:
    """The proxy on a free loopback port in a background thread.

    Example::

        with ProxyServer(ProxyConfig(engine="transformers:tiny", secret="s", record="calls.jsonl")) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key=mint_token("s1", "s"))
    """

    def __init__(
        self, config: ProxyConfig, host: str = "127.0.0.1", port: int = 0, transport=None
    ) -> None:
        self.config = config
        self.proxy = Proxy(config, transport=transport)
        self._sock = bind(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        self._server = uvicorn.Server(uvicorn_config(self.proxy))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL without the `/v1` suffix (Anthropic clients); OpenAI clients add `/v1`."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> ProxyServer:
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._sock]},
            name="claw-proxy-server",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError("the proxy server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=30)
            self._thread = None
        self._sock.close()

    def load_state(self, policy: dict, tensors, lora_scaling: float | None = None) -> dict:
        """The same-process shortcut for weights in memory: a learner in this process hands
        the policy's tensors over directly ({HF name: tensor}; with `lora_scaling`, a LoRA
        adapter's tensors under PEFT's names, merged), no process group and no files. Only the
        in-process transformers engine takes them; returns the version it now serves."""
        engine = self.proxy.policy_engine
        if not hasattr(engine, "load_state"):
            raise ConfigError(
                f"engine {engine.spec} takes no weights in this process: publish them over a "
                "process group (a claw.policy/v1 record with transfer)"
            )
        engine.load_state(Policy.from_dict(policy, "load_state policy"), tensors, lora_scaling)
        return dict(engine.policy)

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_in_thread(config: ProxyConfig, **kwargs) -> ProxyServer:
    """Start a `ProxyServer` and return it (call `.stop()` when done)."""
    return ProxyServer(config, **kwargs).start()
