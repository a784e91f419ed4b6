"""Real protocol servers on loopback for the downloader's tests.

* :class:`HubMirror`: the Hugging Face Hub's routes that huggingface_hub's ``snapshot_download`` uses (revision
  info, the file tree, ``resolve`` with HEAD and ranged GET), serving the shipped models as repositories,
  with a bearer token and a one-shot cut-off of a file half way;
* :class:`TarballServer`: HTTPS (a self-signed certificate made with openssl) serving files with ranges,
  ETags and If-Range (aiohttp's ``FileResponse``), with the same cut-off;
* S3 comes from moto's own server (``moto.server.ThreadedMotoServer``), in conftest.py.

Each server runs its own event loop in a thread and records the requests it saw.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import subprocess
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case


@dataclass
class Faults:
    """Requests to fail on purpose: ``cut`` holds paths whose next GET stops after half the bytes."""

    cut: set[str] = field(default_factory=set)


class LoopbackServer:
    """An aiohttp application on 127.0.0.1 in a background thread."""

    def __init__(self, app: web.Application, ssl_context: ssl.SSLContext | None = None) -> None:
        self.app = app
        self.ssl_context = ssl_context
        self.seen: list[Seen] = []
        self.faults = Faults()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.seen.append(Seen(request.method, request.path, {k.lower(): v for k, v in request.headers.items()}))
        return await handler(request)

    def start(self) -> LoopbackServer:
        self.app.middlewares.append(self._record)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def requests_for(self, suffix: str, method: str = "GET") -> list[Seen]:
        return [s for s in self.seen if s.method == method and s.path.endswith(suffix)]


async def serve_file(request: web.Request, path: Path, faults: Faults, headers: dict[str, str]) -> web.StreamResponse:
    """``path`` with ranges and conditional requests; a path in ``faults.cut`` sends half and hangs up once."""
    if request.method == "GET" and request.path in faults.cut and "Range" not in request.headers:
        faults.cut.discard(request.path)
        data = path.read_bytes()
        st = path.stat()
        etag = f'"{st.st_mtime_ns:x}-{st.st_size:x}"'  # what FileResponse sends for the same file
        response = web.StreamResponse(headers={"ETag": etag, **headers, "Content-Length": str(len(data))})
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        transport = request.transport
        assert transport is not None
        transport.close()  # the connection drops mid-body
        return response
    return web.FileResponse(path, headers=headers)


class HubMirror(LoopbackServer):
    """``repos`` maps a repository id (``ORG/NAME``) to a checkpoint directory; ``token`` is required when set."""

    def __init__(self, repos: dict[str, Path], token: str | None = None) -> None:
        self.repos = repos
        self.token = token
        self.commits = {repo: hashlib.sha1(repo.encode()).hexdigest() for repo in repos}
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}/revision/{revision}", self.revision)
        app.router.add_get("/api/models/{org}/{name}/tree/{revision}", self.tree)
        app.router.add_get("/{org}/{name}/resolve/{revision}/{file:.+}", self.resolve)
        super().__init__(app)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _repo(self, request: web.Request) -> str:
        """The repository of ``request``, after the Hub's checks: 401 on a wrong token, 404 when unknown."""
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            raise web.HTTPUnauthorized(
                text='{"error": "Invalid credentials in Authorization header"}',
                content_type="application/json",
            )
        if repo not in self.repos:
            raise web.HTTPNotFound(
                text='{"error": "Repository not found"}',
                content_type="application/json",
                headers={"X-Error-Code": "RepoNotFound"},
            )
        revision = request.match_info["revision"]
        if revision not in ("main", self.commits[repo]):
            raise web.HTTPNotFound(
                text='{"error": "Invalid rev id"}',
                content_type="application/json",
                headers={"X-Error-Code": "RevisionNotFound"},
            )
        return repo

    def _files(self, repo: str) -> list[Path]:
        return sorted(p for p in self.repos[repo].iterdir() if p.is_file())

    async def revision(self, request: web.Request) -> web.Response:
        repo = self._repo(request)
        siblings = [{"rfilename": p.name} for p in self._files(repo)]
        return web.json_response({"id": repo, "modelId": repo, "sha": self.commits[repo], "siblings": siblings})

    async def tree(self, request: web.Request) -> web.Response:
        repo = self._repo(request)
        entries: list[dict[str, Any]] = [
            {"type": "file", "path": p.name, "size": p.stat().st_size, "oid": _blob_id(p)} for p in self._files(repo)
        ]
        return web.json_response(entries)

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        repo = self._repo(request)
        path = self.repos[repo] / request.match_info["file"]
        if not path.is_file() or path.parent != self.repos[repo]:
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound"})
        headers = {"X-Repo-Commit": self.commits[repo], "ETag": f'"{_blob_id(path)}"'}
        return await serve_file(request, path, self.faults, headers)


class TarballServer(LoopbackServer):
    """Serves the files of ``root`` over HTTPS; with ``token`` set, only to ``Authorization: Bearer TOKEN``."""

    def __init__(self, root: Path, cert_dir: Path, token: str | None = None) -> None:
        self.root = root
        self.token = token
        self.ca_file = cert_dir / "cert.pem"
        app = web.Application()
        app.router.add_get("/{file:.+}", self.file)
        super().__init__(app, _self_signed(cert_dir))

    def url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.port}/{name}"

    async def file(self, request: web.Request) -> web.StreamResponse:
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            raise web.HTTPUnauthorized()
        path = self.root / request.match_info["file"]
        if not path.is_file():
            raise web.HTTPNotFound()
        return await serve_file(request, path, self.faults, {})


def _blob_id(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _self_signed(cert_dir: Path) -> ssl.SSLContext:
    """A certificate for 127.0.0.1, made by openssl; clients trust it through its file (``ca_file``)."""
    cert, key = cert_dir / "cert.pem", cert_dir / "key.pem"
    if not cert.exists():
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context
