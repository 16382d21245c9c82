"""Downloads without the internet: a loopback server answering the Hub endpoints huggingface-hub uses
(``/api/models/REPO/tree/REV`` and ``HEAD``/``GET /REPO/resolve/REV/FILE`` with ``Range``), a pre-populated
Hugging Face cache for the offline path, and interrupted downloads."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from test_models_validation import write_tiny_gguf

from chatphase import cli
from chatphase.errors import ChatPhaseError, ModelError
from chatphase.models import hub
from chatphase.models.resolve import list_models, resolve_model

REPO = "test-org/tiny-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Files of one repo served like the Hub. ``mode``: ``ok``; ``drop_once`` (first GET of each file sends
    half the body and closes, so the client must resume with Range); ``stall`` (sends half and hangs);
    ``error`` (GET answers 500)."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.mode = "ok"
        self.requests: list[tuple[str, str, str | None]] = []
        self.dropped: set[str] = set()
        self.release = threading.Event()
        hub_ = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub_.handle(self, head=True)

            def do_GET(self):
                hub_.handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()

    def handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append((h.command, path, h.headers.get("Range")))
        tree = f"/api/models/{REPO}/tree/"
        resolve = f"/{REPO}/resolve/"
        if path.startswith(tree):
            body = json.dumps(
                [
                    {"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for n, b in self.files.items()
                ]
            ).encode()
            return self.reply(h, 200, body, {"Content-Type": "application/json"}, head)
        if not path.startswith(resolve):
            return self.reply(h, 404, b"{}", {"X-Error-Code": "RepoNotFound"}, head)
        name = path[len(resolve) :].split("/", 1)[1]
        data = self.files.get(name)
        if data is None:
            return self.reply(h, 404, b"{}", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}, head)
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"', "Accept-Ranges": "bytes"}
        if head:
            return self.reply(h, 200, data, headers, head=True)
        if self.mode == "error":
            return self.reply(h, 500, b"boom", {}, head)
        start = int(h.headers["Range"].split("=")[1].split("-")[0]) if h.headers.get("Range") else 0
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        cut = (self.mode == "drop_once" and name not in self.dropped) or self.mode == "stall"
        if not cut:
            return self.reply(h, 206 if start else 200, body, headers, head)
        self.dropped.add(name)
        h.send_response(200)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body[: len(body) // 2])
        h.wfile.flush()
        if self.mode == "stall":
            self.release.wait(30)
        h.close_connection = True

    @staticmethod
    def reply(h, status: int, body: bytes, headers: dict, head: bool) -> None:
        h.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            h.send_header(k, v)
        h.end_headers()
        if not head:
            h.wfile.write(body)


@pytest.fixture
def repo_files(tmp_path_factory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("repo")
    names = ["tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "mmproj-tiny-F16.gguf"]
    files = {n: write_tiny_gguf(d / n).read_bytes() for n in names}
    for i in (1, 2):
        n = f"F16/tiny-F16-{i:05d}-of-00002.gguf"
        files[n] = write_tiny_gguf(d / n, split=(i, 2)).read_bytes()
    files["README.md"] = b"# tiny\n"
    return files


@pytest.fixture
def online(monkeypatch, tmp_path, repo_files):
    """A fake Hub at HF_ENDPOINT, an empty HF cache and models dir, offline mode off."""
    import huggingface_hub.constants as hc

    server = FakeHub(repo_files)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("CHATPHASE_MODELS_DIR", str(tmp_path / "models"))
    yield server
    server.close()


def gguf_files(root: Path) -> list[str]:
    """Files that look like models: ``*.gguf`` outside hidden folders."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.gguf")
        if not any(part.startswith(".") for part in p.relative_to(root).parts)
    )


def test_quant_names_and_choices():
    assert hub.quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert hub.quant_of("qwen2.5-0.5b-instruct-q4_k_m.gguf") == "Q4_K_M"
    assert hub.quant_of("Q4_K_M/M-Q4_K_M-00001-of-00002.gguf") == "Q4_K_M"
    assert hub.quant_of("m-UD-IQ2_XXS.gguf") == "UD-IQ2_XXS"
    assert hub.quant_of("llama-2-7b.gguf") is None
    choices = hub.gguf_choices(
        ["a-Q8_0.gguf", "mmproj-F16.gguf", "s/a-F16-00002-of-00002.gguf", "s/a-F16-00001-of-00002.gguf", "x.md"]
    )
    assert [(c.files, c.quant) for c in choices] == [
        (("a-Q8_0.gguf",), "Q8_0"),
        (("s/a-F16-00001-of-00002.gguf", "s/a-F16-00002-of-00002.gguf"), "F16"),
    ]
    with pytest.raises(ModelError, match="no Q2_K GGUF; quants: F16, Q8_0"):
        hub.choose(choices, "o/r", quant="Q2_K")
    with pytest.raises(ModelError, match="choose with --quant or --file"):
        hub.choose(choices, "o/r")
    assert hub.parse_repo_spec("o/r:q8_0").quant == "q8_0" and hub.parse_repo_spec("o/r:a.gguf").filename == "a.gguf"
    assert hub.parse_repo_spec("models/x.gguf") is None


def test_pull_by_quant_downloads_into_models_dir(online, tmp_path, capsys, repo_files):
    code = cli.main(["pull", REPO, "--quant", "q8_0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    target = tmp_path / "models" / REPO / "tiny-Q8_0.gguf"
    assert target.read_bytes() == repo_files["tiny-Q8_0.gguf"]
    assert f"--model {REPO}:tiny-Q8_0.gguf" in out and "downloaded" in err
    assert resolve_model(f"{REPO}:Q8_0") == target
    assert any(e.path == str(target) and e.info for e in list_models())
    assert cli.main(["pull", f"{REPO}:Q8_0"]) == 0  # again: nothing fetched
    assert "already present" in capsys.readouterr().err


def test_split_model_comes_down_whole(online, tmp_path):
    result = hub.pull(hub.RepoSpec(REPO, quant="F16"), tmp_path / "models")
    assert [p.name for p in result.files] == ["tiny-F16-00001-of-00002.gguf", "tiny-F16-00002-of-00002.gguf"]
    assert all(p.is_file() for p in result.files)


def test_ambiguous_or_missing_quant_lists_the_choices(online, capsys):
    assert cli.main(["pull", REPO]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "3 GGUF models" in err and "Q4_K_M" in err and "Q8_0" in err
    assert cli.main(["pull", REPO, "--quant", "Q2_K"]) == 2
    assert "no Q2_K GGUF" in capsys.readouterr().err


def test_unknown_repo_is_one_line(online, capsys):
    assert cli.main(["pull", "nobody/nothing", "--quant", "Q4_K_M"]) == 2
    err = capsys.readouterr().err
    assert "repository not found" in err and err.count("\n") == 1


def test_dropped_connection_resumes_with_range(online, tmp_path, repo_files, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "DOWNLOAD_CHUNK_SIZE", 512)  # so the half body received is written before the drop
    online.mode = "drop_once"
    result = hub.pull(hub.RepoSpec(REPO, filename="tiny-Q4_K_M.gguf"), tmp_path / "models")
    assert result.path.read_bytes() == repo_files["tiny-Q4_K_M.gguf"]
    assert any(m == "GET" and r and r.startswith("bytes=") for m, _p, r in online.requests)


def test_failed_download_leaves_nothing_that_looks_like_a_model(online, tmp_path, capsys):
    online.mode = "error"
    assert cli.main(["pull", REPO, "--quant", "Q8_0"]) == 1
    assert "500" in capsys.readouterr().err
    models = tmp_path / "models"
    assert gguf_files(models) == [] and list(models.rglob("*.incomplete")) == []


def test_killed_download_leaves_only_a_hidden_partial_that_is_cleaned(online, tmp_path, repo_files):
    online.mode = "stall"
    models = tmp_path / "models"
    code = f"from chatphase.models import hub; hub.pull(hub.RepoSpec({REPO!r}, quant='Q8_0'), {str(models)!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ})
    deadline = time.monotonic() + 20
    while not list(models.rglob("*.incomplete")) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partials = list(models.rglob("*.incomplete"))
    assert partials and gguf_files(models) == []
    assert all(".cache" in p.parts for p in partials)
    assert hub.remove_stale_partials(models / REPO, older_than_s=0) == partials
    online.mode = "ok"
    assert hub.pull(hub.RepoSpec(REPO, quant="Q8_0"), models).path.read_bytes() == repo_files["tiny-Q8_0.gguf"]


def populate_cache(cache: Path, files: dict[str, bytes]) -> Path:
    """The Hugging Face cache layout: blobs, a snapshot of symlinks, refs/main."""
    root = cache / ("models--" + REPO.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / COMMIT / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return root


@pytest.fixture
def connections(monkeypatch) -> list[object]:
    """Every TCP connection the code under test attempts, recorded and refused at once (as nothing listens
    on 127.0.0.1:9): a check of 'no network' or 'no retry loop' that holds at any machine speed."""
    import socket

    attempts: list[object] = []

    def refuse(self, address):
        attempts.append(address)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


@pytest.fixture
def offline_cache(monkeypatch, tmp_path, repo_files):
    cache = tmp_path / "hf-cache"
    populate_cache(cache, {k: v for k, v in repo_files.items() if "Q4_K_M" in k})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: must not be contacted
    monkeypatch.setenv("CHATPHASE_MODELS_DIR", str(tmp_path / "models"))
    return cache


def test_offline_serves_from_the_hf_cache(offline_cache, tmp_path, capsys, connections):
    assert resolve_model(f"{REPO}:Q4_K_M").name == "tiny-Q4_K_M.gguf"
    listed = [e for e in list_models() if e.source == "hf-cache"]
    assert [e.spec for e in listed] == [f"{REPO}:tiny-Q4_K_M.gguf"] and listed[0].info.quantization == "Q8_0"
    assert cli.main(["pull", REPO, "--quant", "Q4_K_M"]) == 0
    assert "linked from the Hugging Face cache" in capsys.readouterr().err
    link = tmp_path / "models" / REPO / "tiny-Q4_K_M.gguf"
    assert link.is_symlink() and link.resolve().parent.name == "blobs"
    assert len([e for e in list_models() if e.source != "default"]) == 1  # the link and its blob: listed once
    assert cli.main(["pull", REPO, "--quant", "Q8_0"]) == 2
    err = capsys.readouterr().err
    assert "offline" in err and err.count("\n") == 1
    assert connections == []  # offline: the hub is never asked


def test_repo_spec_not_downloaded_offline_says_so_before_offering_a_download(offline_cache):
    """Seen: on a terminal, offline, the user was asked "Download it …? [y/N]" and then told it was offline."""
    asked: list[str] = []
    for kwargs in ({}, {"confirm": lambda q: asked.append(q) or True}, {"pull": True}):
        with pytest.raises(ModelError, match=rf"offline \(HF_HUB_OFFLINE is set\) and {REPO}:Q8_0 is not in "):
            resolve_model(f"{REPO}:Q8_0", **kwargs)
    assert asked == []


def test_repo_spec_not_downloaded_says_how(online, tmp_path):
    with pytest.raises(ModelError, match=f"run `chatphase pull {REPO} --quant Q8_0` first"):
        resolve_model(f"{REPO}:Q8_0")
    asked = []
    with pytest.raises(ModelError, match="run `chatphase pull"):
        resolve_model(f"{REPO}:Q8_0", confirm=lambda q: asked.append(q) or False)
    assert asked and "Download it from Hugging Face" in asked[0]


def test_unreachable_hub_fails_fast(monkeypatch, tmp_path, capsys, connections):
    import huggingface_hub.constants as hc

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    with pytest.raises(ChatPhaseError, match=r"cannot reach http://127\.0\.0\.1:9"):
        hub.pull(hub.RepoSpec(REPO, quant="Q8_0"), tmp_path / "models")
    assert 1 <= len(connections) <= 2, connections  # one try (and one retry at most), not a back-off loop


def test_consent_downloads_a_repo_spec(online, tmp_path, repo_files):
    path = resolve_model(f"{REPO}:Q4_K_M", confirm=lambda question: True)
    assert path == tmp_path / "models" / REPO / "tiny-Q4_K_M.gguf"
    assert path.read_bytes() == repo_files["tiny-Q4_K_M.gguf"]


@pytest.fixture
def online_real(monkeypatch, tmp_path, default_model_path):
    """The fake Hub serving a copy of the bundled default model (a real, loadable GGUF)."""
    import huggingface_hub.constants as hc

    server = FakeHub({"SmolLM2-135M-Instruct.Q4_1.gguf": Path(default_model_path).read_bytes()})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("CHATPHASE_MODELS_DIR", str(tmp_path / "models"))
    yield server
    server.close()


def test_pulled_model_runs_by_repo_spec(online_real, capsys, default_model_info):
    """pull REPO --quant, then `ask --model REPO:QUANT` loads it through llama.cpp and replies."""
    assert cli.main(["pull", REPO, "--quant", "Q4_1"]) == 0
    capsys.readouterr()
    code = cli.main(
        [
            "ask",
            "--model",
            f"{REPO}:Q4_1",
            "--n-ctx",
            "256",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "--json",
            "Say hi",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["model"]["path"].endswith(f"{REPO}/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert result["model"]["kv_bytes_per_token"] == default_model_info.kv_bytes_per_token
    assert result["turns"][0]["metrics"]["decode_tokens"] >= 1


def test_cache_listing_includes_other_revisions_by_path(offline_cache, repo_files):
    root = offline_cache / ("models--" + REPO.replace("/", "--"))
    old = root / "snapshots" / ("f" * 40) / "tiny-Q8_0.gguf"
    old.parent.mkdir(parents=True)
    old.write_bytes(repo_files["tiny-Q8_0.gguf"])
    specs = [e.spec for e in list_models() if e.source == "hf-cache"]
    assert specs == [f"{REPO}:tiny-Q4_K_M.gguf", str(old)]  # main's by REPO:FILE, the Q4_K_M blob listed once
