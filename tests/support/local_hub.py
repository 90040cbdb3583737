"""A tiny, offline stand-in for the Hugging Face Hub that serves one kernel repository.

Why: the loader tests must prove that ``kernels.get_kernel`` / ``get_locked_kernel`` / ``kernels lock`` /
``hf download`` work against *this* bundle's ``build/torch-cuda`` the way they will on the real Hub,
with no internet. ``huggingface_hub`` talks plain HTTP to ``HF_ENDPOINT``, so a stdlib ``http.server``
on 127.0.0.1 that answers the handful of endpoints the loader uses is enough.

The repository is modelled on what kernel-builder publishes: a git-like history of immutable
commits (40-hex sha1 ids computed from the content, git blob ids as ETags), branches (``main`` with the
card, ``v1`` with ``build/``) and tags (``v1.0.0``). Endpoints answered (everything else is 404):

    GET  /api/organizations/<org>/overview            {"trustedKernelPublisher": bool}
    GET  /api/kernels/<org>/<name>/refs                branches / tags / converts
    GET  /api/kernels/<org>/<name>/revision/<rev>      repo info with the resolved "sha"
    GET  /api/kernels/<org>/<name>/tree/<rev>[/<dir>]  listing; ?recursive=true lists the subtree
    HEAD/GET /kernels/<org>/<name>/resolve/<rev>/<path>  file bytes + X-Repo-Commit, ETag, Content-Length

Every request is recorded (``hub.requests``) so tests can assert, e.g., that an offline load made none.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["KernelRepo", "LocalHub", "git_blob_id", "read_tree", "repo_from_variant"]


def git_blob_id(data: bytes) -> str:
    """The id git (and the Hub, as the ETag of a non-LFS file) gives a file's content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def read_tree(root: Path, prefix: str = "") -> dict[str, bytes]:
    """``{prefix + posix path: bytes}`` for the files under ``root``, without bytecode caches."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc":
            files[prefix + rel.as_posix()] = path.read_bytes()
    return files


@dataclass
class KernelRepo:
    """An immutable-commit repository: ``commits[sha] = {path: bytes}``, refs name commits."""

    repo_id: str
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def commit(self, files: dict[str, bytes], message: str, parent: str | None = None) -> str:
        """Store ``files`` as a commit; its id is a sha1 over the tree, parent and message (git-like)."""
        tree = hashlib.sha1()
        for path, data in sorted(files.items()):
            tree.update(f"{path}\0{git_blob_id(data)}\n".encode())
        sha = hashlib.sha1(f"tree {tree.hexdigest()}\nparent {parent or ''}\n\n{message}".encode()).hexdigest()
        self.commits[sha] = dict(files)
        return sha

    def resolve(self, revision: str) -> str | None:
        """Branch, tag or full commit id -> commit id (``None`` if unknown), like the Hub."""
        if revision in self.commits:
            return revision
        return self.branches.get(revision) or self.tags.get(revision)


def repo_from_variant(repo_id: str, variant_dir: Path, card: str = "# flash-attn-4-sm120\n") -> KernelRepo:
    """The layout kernel-builder uploads: the card on ``main``; ``build/`` + card on ``v1`` (tag v1.0.0).

    ``variant_dir`` is a ``build/torch-cuda`` directory; it is published under that name.
    """
    repo = KernelRepo(repo_id)
    card_files = {"README.md": card.encode()}
    main = repo.commit(card_files, "Add kernel card")
    build = repo.commit(
        {**card_files, **read_tree(variant_dir, prefix=f"build/{variant_dir.name}/")}, "Upload build", parent=main
    )
    repo.branches.update(main=main, v1=build)
    repo.tags["v1.0.0"] = build
    return repo


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 with an explicit Content-Length on every answer, so clients can keep connections alive.
    protocol_version = "HTTP/1.1"
    hub: "LocalHub"  # set on the per-server subclass

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - signature fixed by the base class
        pass  # requests are recorded in hub.requests instead of spamming stderr

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    # -- routing ---------------------------------------------------------------------------------

    def _dispatch(self, head: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        self.hub.requests.append(f"{self.command} {self.path}")
        repo = self.hub.repo
        api_prefix = f"/api/kernels/{repo.repo_id}/"
        file_prefix = f"/kernels/{repo.repo_id}/resolve/"
        org = repo.repo_id.split("/", 1)[0]

        if path == f"/api/organizations/{org}/overview":
            return self._json({"name": org, "fullname": org, "trustedKernelPublisher": self.hub.trusted}, head)
        if path == f"/api/kernels/{repo.repo_id}/refs":
            return self._json(self._refs(), head)
        if path.startswith(api_prefix + "revision/"):
            return self._revision_info(path[len(api_prefix + "revision/"):], head)
        if path.startswith(api_prefix + "tree/"):
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            return self._tree(path[len(api_prefix + "tree/"):], recursive, head)
        if path.startswith(file_prefix):
            return self._file(path[len(file_prefix):], head)
        return self._error(404, "RepoNotFound", f"no route for {path}", head)

    # -- endpoints -------------------------------------------------------------------------------

    def _refs(self) -> dict:
        repo = self.hub.repo

        def ref(kind: str, name: str, sha: str) -> dict:
            return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": sha}

        return {
            "branches": [ref("heads", n, s) for n, s in sorted(repo.branches.items())],
            "tags": [ref("tags", n, s) for n, s in sorted(repo.tags.items())],
            "converts": [],
        }

    def _revision_info(self, revision: str, head: bool) -> None:
        sha = self.hub.repo.resolve(revision)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"invalid revision {revision!r}", head)
        files = self.hub.repo.commits[sha]
        info = {
            "id": self.hub.repo.repo_id,
            "author": self.hub.repo.repo_id.split("/", 1)[0],
            "sha": sha,
            "private": False,
            "siblings": [{"rfilename": p} for p in sorted(files)],
        }
        return self._json(info, head)

    def _split_revision(self, rest: str) -> tuple[str | None, str]:
        """``<rev>/<path>`` -> (commit id, path). Revisions here never contain '/'."""
        revision, _, sub = rest.partition("/")
        return self.hub.repo.resolve(revision), sub.strip("/")

    def _tree(self, rest: str, recursive: bool, head: bool) -> None:
        sha, base = self._split_revision(rest)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"invalid revision in {rest!r}", head)
        files = self.hub.repo.commits[sha]
        prefix = f"{base}/" if base else ""
        below = {p[len(prefix):]: p for p in files if p.startswith(prefix)}
        if not below:
            return self._error(404, "EntryNotFound", f"{base!r} does not exist at {sha}", head)
        entries: dict[str, dict] = {}
        for rel, full in sorted(below.items()):
            parts = rel.split("/")
            # Directories on the way (all of them when recursive, the first level otherwise).
            depth = len(parts) - 1 if recursive else min(1, len(parts) - 1)
            for i in range(1, depth + 1):
                d = prefix + "/".join(parts[:i])
                tree_oid = hashlib.sha1(d.encode()).hexdigest()  # any stable id; clients only display it
                entries.setdefault(d, {"type": "directory", "oid": tree_oid, "size": 0, "path": d})
            if recursive or len(parts) == 1:
                data = files[full]
                entries[full] = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": full}
        return self._json(list(entries.values()), head)

    def _file(self, rest: str, head: bool) -> None:
        sha, path = self._split_revision(rest)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"invalid revision in {rest!r}", head)
        data = self.hub.repo.commits[sha].get(path)
        if data is None:
            return self._error(404, "EntryNotFound", f"{path!r} does not exist at {sha}", head)
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{git_blob_id(data)}"',
            "Content-Type": "application/octet-stream",
        }
        return self._send(200, data, headers, head)

    # -- responses -------------------------------------------------------------------------------

    def _json(self, obj, head: bool) -> None:
        self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, head)

    def _error(self, status: int, code: str, message: str, head: bool) -> None:
        body = json.dumps({"error": message}).encode()
        # huggingface_hub maps X-Error-Code to RevisionNotFoundError / EntryNotFoundError / ...
        self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}, head)

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


class LocalHub:
    """Serve ``repo`` on ``http://127.0.0.1:<free port>`` from a daemon thread (use as a context manager)."""

    def __init__(self, repo: KernelRepo, *, trusted: bool = True):
        self.repo = repo
        self.trusted = trusted
        self.requests: list[str] = []
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-hub", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "LocalHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
