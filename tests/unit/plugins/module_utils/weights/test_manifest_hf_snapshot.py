# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model_weights hub downloader, run for real against a local stand-in hub.

The real hub is out of reach here, so a small HTTP server on 127.0.0.1 answers
the three requests huggingface_hub's snapshot_download makes (tree listing,
HEAD and GET of /resolve/) and the real library, unpatched, downloads from it
(the downloader's --endpoint, the role's model_weights_hub_endpoint). What this proves: the cache layout, the token on stdin (sent as a
bearer token, never printed), the space check before anything is written,
resuming a partial download across runs, and that a re-run of a pinned,
complete snapshot makes no request at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("huggingface_hub")

ROOT = Path(__file__).resolve().parents[5]
SCRIPT = ROOT / "roles" / "model_weights" / "files" / "hf_snapshot.py"
REPO = "org/name"
REV = "5eed0c0ffee0000000000000000000000000000a"
TOKEN = "hf_0123456789secret"


def _load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_snapshot", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeHub:
    """Answers tree listing, HEAD and GET (with Range) like the hub's HTTP API."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self.cut_once: set[str] = set()  # send half of these once, then close the connection
        self.broken: set[str] = set()  # fail every GET of these
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.answer(body_wanted=False)

            def do_GET(self):
                self.answer(body_wanted=True)

            def empty(self, code: int, error: str) -> None:
                self.send_response(code)
                self.send_header("X-Error-Code", error)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def answer(self, body_wanted: bool) -> None:
                hub.requests.append(
                    (
                        self.command,
                        self.path,
                        self.headers.get("Range"),
                        self.headers.get("Authorization"),
                    )
                )
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self.empty(401, "GatedRepo")
                path = self.path.split("?")[0]
                if path == f"/api/models/{REPO}/tree/{REV}":
                    body = json.dumps(
                        [
                            {
                                "type": "file",
                                "path": name,
                                "size": len(data),
                                "oid": hashlib.sha1(data).hexdigest(),
                                "lfs": {
                                    "oid": hashlib.sha256(data).hexdigest(),
                                    "size": len(data),
                                    "pointerSize": 134,
                                },
                            }
                            for name, data in sorted(hub.files.items())
                        ]
                    ).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return None
                match = re.match(rf"^/{REPO}/resolve/{REV}/(.+)$", path)
                if not match or match.group(1) not in hub.files:
                    return self.empty(404, "EntryNotFound")
                name = match.group(1)
                data = hub.files[name]
                if name in hub.broken and body_wanted:
                    return self.empty(503, "Unavailable")
                start = (
                    int(re.match(r"bytes=(\d+)-", self.headers["Range"]).group(1))
                    if self.headers.get("Range")
                    else 0
                )
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", REV)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if not body_wanted:
                    return None
                if name in hub.cut_once and not start:
                    hub.cut_once.discard(name)
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return None
                self.wfile.write(data[start:])
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hub():
    files = {
        "config.json": b'{"model_type": "llama"}\n',
        "model.safetensors": os.urandom(2_500_000),
    }
    server = FakeHub(files)
    yield server
    server.server.shutdown()
    server.server.server_close()


def download(hub, cache: Path, *extra: str, token: str | None = TOKEN, offline: bool = False):
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(cache.parent / "home"),
        "HF_HOME": str(cache.parent / "hf-home"),
        # belt and braces: nothing in these tests may reach out past the stand-in hub
        "HF_ENDPOINT": hub.url,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_ETAG_TIMEOUT": "5",
        "HF_HUB_DOWNLOAD_TIMEOUT": "5",
        "NO_PROXY": "127.0.0.1",
    }
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    argv = [
        sys.executable,
        str(SCRIPT),
        "--repo-id",
        REPO,
        "--revision",
        REV,
        "--cache-dir",
        str(cache),
        "--endpoint",
        hub.url,
        *extra,
    ]
    if token is not None:
        argv.append("--token-stdin")
    proc = subprocess.run(
        argv, input=token or "", capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert TOKEN not in proc.stdout and TOKEN not in proc.stderr
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1]), proc


def snapshot_dir(cache: Path) -> Path:
    return cache / "models--org--name" / "snapshots" / REV


def test_download_into_cache_layout_then_rerun_makes_no_request(hub, tmp_path):
    cache = tmp_path / "hub"
    log = tmp_path / "progress.log"
    rc, result, _ = download(hub, cache, "--progress-log", str(log), "--progress-interval", "0.05")
    assert rc == 0, result
    assert result["path"] == str(snapshot_dir(cache))
    assert result["changed"] is True and result["downloaded_files"] == 2
    for name, data in hub.files.items():
        assert (snapshot_dir(cache) / name).read_bytes() == data
        assert (
            snapshot_dir(cache) / name
        ).is_symlink()  # into blobs/, as vLLM's HF_HUB_OFFLINE reads it
    assert all(auth == f"Bearer {TOKEN}" for *_, auth in hub.requests)
    assert log.read_text().rstrip().endswith("done")
    assert "100.0%" in log.read_text().splitlines()[-1]

    hub.requests.clear()
    rc, again, _ = download(hub, cache)
    assert rc == 0 and again["changed"] is False and again["downloaded_files"] == 0
    assert hub.requests == []  # pinned commit + cached tree: nothing asked of the hub

    rc, offline, _ = download(hub, cache, offline=True)
    assert rc == 0 and offline["path"] == str(snapshot_dir(cache))


def test_space_is_checked_before_anything_is_written(hub, tmp_path):
    cache = tmp_path / "hub"
    rc, result, _ = download(hub, cache, "--reserve-bytes", str(10**18))
    assert rc == 3
    assert "model_weights_hub_cache" in result["msg"] and "free" in result["msg"]
    assert result["needed_bytes"] == sum(len(d) for d in hub.files.values())
    assert not cache.exists()
    assert not any(r[0] == "GET" and "/resolve/" in r[1] for r in hub.requests)


def test_wrong_token_fails_with_a_message_and_no_token(hub, tmp_path):
    rc, result, proc = download(hub, tmp_path / "hub", token="hf_wrong_token_value")
    assert rc == 2
    assert "failed" in result["msg"]
    assert "hf_wrong_token_value" not in proc.stdout


def test_interrupted_file_resumes_with_a_range_request(hub, tmp_path):
    cache = tmp_path / "hub"
    # larger than huggingface_hub's 10 MiB read chunk, so part of it is on disk when the link drops
    hub.files["model.safetensors"] = os.urandom(24 * 1024 * 1024)
    hub.cut_once.add("model.safetensors")
    rc, result, _ = download(hub, cache)
    assert rc == 0, result
    gets = [r[2] for r in hub.requests if r[0] == "GET" and r[1].endswith("model.safetensors")]
    assert gets[0] is None and len(gets) == 2
    resumed_at = int(re.match(r"bytes=(\d+)-$", gets[1]).group(1))
    assert 0 < resumed_at <= len(hub.files["model.safetensors"]) // 2
    assert (snapshot_dir(cache) / "model.safetensors").read_bytes() == hub.files[
        "model.safetensors"
    ]


def test_failed_run_keeps_finished_files_for_the_next(hub, tmp_path):
    cache = tmp_path / "hub"
    hub.broken.add("model.safetensors")
    rc, result, _ = download(hub, cache)
    assert (rc == 2 and "model.safetensors" in result["msg"]) or "503" in result["msg"], result
    assert (snapshot_dir(cache) / "config.json").read_bytes() == hub.files["config.json"]

    hub.broken.clear()
    hub.requests.clear()
    rc, result, _ = download(hub, cache)
    assert rc == 0 and result["downloaded_files"] == 1, result
    fetched = [
        r[1].rsplit("/", 1)[-1] for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]
    ]
    assert fetched == ["model.safetensors"]


@pytest.mark.parametrize(
    ("free", "reserve", "short"),
    [(10_000, 0, False), (10_000, 7_001, True), (2_999, 0, True)],
)
def test_plan_space(free, reserve, short):
    files = [
        SimpleNamespace(file_size=2_000, will_download=True),
        SimpleNamespace(file_size=1_000, will_download=True),
        SimpleNamespace(file_size=9_999_999, will_download=False),  # cached already
        SimpleNamespace(file_size=None, will_download=True),
    ]
    plan = _load_script().plan_space(files, free, reserve, "/srv/models/hub")
    assert plan["needed_bytes"] == 3_000
    assert ("msg" in plan) is short


def test_progress_line_units_and_rate():
    line = _load_script().format_progress(512 * 1024**2, 2 * 1024**3, 10.0, (256 * 1024**2, 5.0))
    assert line.endswith("0.50/2.00 GiB  25.0% 51.2 MiB/s")
