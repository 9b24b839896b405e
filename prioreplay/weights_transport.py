"""Published weights across nodes: the learner serves ``v-N/`` over HTTP; workers fetch, check, cache.

Without a shared volume a weights URI is a URL. Two halves:

- **Serving** (:func:`serve_published`): the learner's ``PUBLISH_DIR`` read-only over HTTP/1.1
  (the standard library's ``ThreadingHTTPServer``). Only ``GET``/``HEAD`` of a file inside a
  complete published version, ``/v-N/<name>``, is answered, with its ``Content-Length``; names
  are matched against a strict pattern (no ``..``, no hidden or temporary directories, no
  percent-escapes, no directory listings) and resolved inside ``v-N/`` (symbolic links out of it
  are refused). Everything else is 404. No authentication: serve on a trusted network.
- **Fetching** (:class:`WeightsFetcher`): a URI with a scheme other than ``file://`` (``http(s)://``,
  ``s3://``, ``gs://``, ... any fsspec protocol whose package is installed) is read with fsspec
  (https://filesystem-spec.readthedocs.io): the manifest ``prioreplay.json`` first, then exactly
  the files it lists, into ``CACHE/.tmp-v-N-<random>/``, the manifest written last; the copy is
  checked with :func:`prioreplay.checkpoint_reader.verify_weights` (every file's size and CRC-32 or
  sha256, the tensor count) and renamed to ``CACHE/v-N/``. Only the newest ``keep`` versions stay
  in the cache. A local path or ``file://`` URI is returned as is (already local, not copied).

A download that breaks (connection refused or reset, a file the learner pruned or replaced, a
timeout) or does not match the manifest raises :class:`WeightsFetchError`, leaves nothing in the
cache, and changes nothing the worker holds: it keeps generating with its weights and fetches
again at its next lease. Because the manifest is fetched first and every file is checked against
it, a learner restarted mid-download (which republishes ``v-N`` or serves the same files again)
costs one refused attempt, never a mixed version.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prioreplay.checkpoint_reader import (
    MANIFEST,
    WEIGHTS_FORMAT,
    CheckpointError,
    published_versions,
    verify_weights,
    version_dir,
)
from prioreplay.errors import InvalidArgument

log = logging.getLogger(__name__)

#: ``/v-N/name[/name...]``: each name starts with a letter, digit or underscore (no ``.``/``..``,
#: no hidden or ``.tmp-`` directories) and holds only ``[A-Za-z0-9._-]`` (no ``%`` escapes).
_NAME = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_URL_PATH_RE = re.compile(rf"^/v-(\d+)/({_NAME}(?:/{_NAME})*)$")
_FILE_NAME_RE = re.compile(rf"^{_NAME}(?:/{_NAME})*$")
_TMP_PREFIX = ".tmp-v-"
_CHUNK = 1 << 20


class WeightsFetchError(CheckpointError):
    """A remote version could not be fetched whole or did not match its manifest (retryable:
    nothing was cached and the loaded weights stay)."""


# -- URIs ----------------------------------------------------------------------------------------
def is_remote(uri: str) -> bool:
    """True for a URI that must be fetched: a scheme other than ``file://`` (``http://``, ``s3://``...)."""
    return "://" in uri and not uri.startswith("file://")


def published_uri(path: Path, base_url: str | None) -> str:
    """The ``weights_uri`` announced for the published directory ``path`` (``.../v-N``).

    ``base_url`` None: the absolute local path (workers share the volume). Otherwise
    ``<base_url>/v-N/``, the URL at which ``base_url`` serves ``PUBLISH_DIR``
    (e.g. ``http://learner-0.learner:8000`` from :func:`serve_published`, or a bucket the
    publish directory is synchronised to).

    Example: ``published_uri(Path("/ckpt/published/v-3"), "http://h:8000/")`` → ``"http://h:8000/v-3/"``.
    """
    if not base_url:
        return str(Path(path).resolve())
    return f"{base_url.rstrip('/')}/{Path(path).name}/"


def manifest_files(manifest: Any, uri: str) -> list[str]:
    """The relative file names a remote weights manifest lists, each checked to stay inside its
    version directory (a manifest can never make the fetcher write elsewhere).

    Raises:
        WeightsFetchError: not a :data:`~prioreplay.checkpoint_reader.WEIGHTS_FORMAT` manifest, no
            ``model.safetensors`` listed, or a name that is absolute, has ``..``, a hidden part
            or characters outside ``[A-Za-z0-9._-/]``.
    """
    if not isinstance(manifest, dict) or manifest.get("format") != WEIGHTS_FORMAT:
        raise WeightsFetchError(
            f"{uri}: {MANIFEST} is not a {WEIGHTS_FORMAT} manifest (only published versions v-N are fetched over the network)"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or "model.safetensors" not in files:
        raise WeightsFetchError(f"{uri}: the manifest lists no model.safetensors")
    bad = [n for n in files if not isinstance(n, str) or not _FILE_NAME_RE.match(n) or n == MANIFEST]
    if bad:
        raise WeightsFetchError(f"{uri}: the manifest lists unsafe file names {bad[:3]!r}; refused")
    return sorted(files)


# -- serving -------------------------------------------------------------------------------------
class _PublishedFilesHandler(BaseHTTPRequestHandler):
    """GET/HEAD of ``/v-N/<file>`` under ``self.server.root``; 404 for anything else."""

    server: _WeightsHTTPServer
    protocol_version = "HTTP/1.1"
    # headers and body go out in two sends: with Nagle's algorithm the body waits for the client's
    # delayed ACK (~40 ms per file on Linux), which dominated fetching a small version
    disable_nagle_algorithm = True
    server_version = "prioreplay-weights"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._serve(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        path = resolve_published_file(self.server.root, urlsplit(self.path).path)
        try:
            fh = open(path, "rb") if path is not None else None
        except OSError:  # pruned between the check and the open
            fh = None
        if fh is None:
            self.send_error(404, "not a file of a published version")
            return
        with fh:
            size = os.fstat(fh.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            if body:
                self.wfile.flush()
                self.connection.sendfile(fh, count=size)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("weights http: %s " + format, self.address_string(), *args)


class _WeightsHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], root: Path):
        self.root = Path(root)
        super().__init__(address, _PublishedFilesHandler)


def resolve_published_file(root: Path, url_path: str) -> Path | None:
    """The file ``url_path`` (``/v-N/name``, not percent-decoded) names inside a complete published
    version under ``root``, or None when it names anything else (traversal, a temporary or
    incomplete version, a directory, a link out of ``v-N/``, a missing file)."""
    m = _URL_PATH_RE.match(url_path)
    if m is None:
        return None
    vdir = version_dir(root, int(m.group(1)))
    if not (vdir / MANIFEST).is_file():
        return None
    candidate = vdir / m.group(2)
    try:
        real, real_dir = candidate.resolve(strict=True), vdir.resolve(strict=True)
    except OSError:
        return None
    if not real.is_file() or real_dir not in real.parents:
        return None
    return real


def serve_published(root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Serve the published versions under ``root`` read-only over HTTP on a daemon thread.

    Args:
        root: the learner's publish directory (holding ``v-N/``; may not exist yet).
        host: address to bind (``0.0.0.0`` for workers on other nodes).
        port: TCP port (0: an ephemeral one; read it from ``server.server_address[1]``).

    Returns:
        The running server; stop it with ``shutdown()`` then ``server_close()``.

    Raises:
        OSError: the port is taken or the address cannot be bound.
    """
    server = _WeightsHTTPServer((host, int(port)), Path(root))
    threading.Thread(target=server.serve_forever, name="weights-http", daemon=True).start()
    log.info("serving published weights under %s on http://%s:%d/v-N/", root, host, server.server_address[1])
    return server


def advertised_url(host: str, port: int) -> str:
    """``http://<host>:<port>``, with this machine's name in place of a wildcard bind address."""
    import socket

    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.getfqdn()
    return f"http://{host}:{int(port)}"


# -- fetching ------------------------------------------------------------------------------------
class WeightsFetcher:
    """Brings remote published versions into a local cache, checked against their manifest.

    Args:
        cache_dir: where verified versions ``v-N/`` are kept (created on first fetch).
        keep: newest versions kept in the cache (>= 1); older ones are deleted after each fetch.
        timeout_s: bound on connecting and on each read of an HTTP fetch, seconds (> 0).

    Raises:
        InvalidArgument: keep < 1 or timeout_s <= 0.
    """

    def __init__(self, cache_dir: str | os.PathLike, keep: int = 2, timeout_s: float = 60.0):
        if not (isinstance(keep, int) and keep >= 1):
            raise InvalidArgument(f"weights cache keep ({keep}) must be an integer >= 1 versions")
        if not timeout_s > 0:
            raise InvalidArgument(f"weights fetch timeout ({timeout_s}) must be > 0 seconds")
        self.cache_dir = Path(cache_dir)
        self.keep = keep
        self.timeout_s = float(timeout_s)

    def local_uri(self, uri: str, version: int) -> str:
        """``uri`` itself when it is local (a path or ``file://``), else the cached directory of
        :meth:`fetch`. Raises what :meth:`fetch` raises."""
        return str(self.fetch(uri, version)) if is_remote(uri) else uri

    def fetch(self, uri: str, version: int) -> Path:
        """Fetch policy ``version`` from ``uri`` (its manifest first, then the files it lists) into
        the cache, verified; return the cached directory ``CACHE/v-N``. A cached copy whose
        manifest equals the remote one is returned without downloading again.

        Raises:
            WeightsFetchError: unreachable or broken download, a listed file missing remotely
                (pruned) or changed (republished), a manifest of another version or format, or a
                copy that does not match the manifest. Nothing is left in the cache then.
        """
        fs, base = self._filesystem(uri)
        raw = self._read(fs, _join(base, MANIFEST), uri)
        try:
            manifest = json.loads(raw)
        except ValueError as e:
            raise WeightsFetchError(f"{uri}: {MANIFEST} is not JSON ({e})") from None
        names = manifest_files(manifest, uri)
        if manifest.get("version") != version:
            raise WeightsFetchError(f"{uri}: the manifest is of version {manifest.get('version')!r}, the lease names {version}")
        final = version_dir(self.cache_dir, version)
        if self._cached(final, raw):
            return final
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_dir / f"{_TMP_PREFIX}{version}-{uuid.uuid4().hex[:8]}"
        try:
            self._download(fs, base, names, raw, tmp, uri)
            _replace_dir(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.prune()
        return final

    def _download(self, fs: Any, base: str, names: list[str], raw: bytes, tmp: Path, uri: str) -> None:
        """The listed files, then the manifest, into ``tmp``; then the check of the whole copy."""
        for name in names:
            dest = tmp / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                fs.get_file(_join(base, name), str(dest))
            except Exception as e:  # noqa: BLE001 - any transport failure is a refused download
                raise WeightsFetchError(
                    f"{uri}: fetching {name} failed ({type(e).__name__}: {e}); the version is refused, the loaded weights stay"
                ) from None
        (tmp / MANIFEST).write_bytes(raw)
        try:
            verify_weights(tmp)
        except CheckpointError as e:
            raise WeightsFetchError(
                f"{uri}: the download does not match its manifest ({e}); refused, the loaded weights stay"
            ) from None

    def _cached(self, final: Path, raw: bytes) -> bool:
        try:
            if (final / MANIFEST).read_bytes() != raw:
                return False
            verify_weights(final)
        except (OSError, CheckpointError):
            return False
        return True

    def _filesystem(self, uri: str) -> tuple[Any, str]:
        """(fsspec filesystem, path inside it) of ``uri``; HTTP with bounded connect and read."""
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec comes with the worker extra
            raise WeightsFetchError(f"{uri}: remote weights need fsspec: pip install 'prioreplay[worker]'") from None
        options: dict[str, Any] = {}
        if uri.startswith(("http://", "https://")):
            import aiohttp

            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s)
            options["client_kwargs"] = {"timeout": timeout}
        try:
            return fsspec.core.url_to_fs(uri, **options)
        except (ImportError, ValueError) as e:
            raise WeightsFetchError(
                f"{uri}: no filesystem for this URL ({e}); install the fsspec package of its protocol (s3fs, gcsfs, ...)"
            ) from None

    @staticmethod
    def _read(fs: Any, path: str, uri: str) -> bytes:
        try:
            return fs.cat_file(path)
        except Exception as e:  # noqa: BLE001 - any transport failure is a refused download
            raise WeightsFetchError(
                f"{uri}: cannot read {MANIFEST} ({type(e).__name__}: {e}); the loaded weights stay, the next lease retries"
            ) from None

    def prune(self) -> list[Path]:
        """Delete cached versions but the newest ``keep``, and temporary directories older than an
        hour (another process's download in progress is younger). Returns what was deleted."""
        doomed = [p for _, p in published_versions(self.cache_dir)[self.keep :]]
        if self.cache_dir.is_dir():
            doomed += [
                p for p in self.cache_dir.iterdir() if p.name.startswith(_TMP_PREFIX) and time.time() - p.stat().st_mtime > 3600
            ]
        for p in doomed:
            shutil.rmtree(p, ignore_errors=True)
        return doomed


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def _replace_dir(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``, replacing an older copy (moved aside first, then deleted)."""
    if final.exists():
        trash = final.parent / f"{_TMP_PREFIX}{final.name}-old-{uuid.uuid4().hex[:8]}"
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp, final)
