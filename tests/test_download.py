"""fetch(): complete partial files, refused resumes and checksum handling, on a local server."""

import hashlib
import http.server
import threading

import pytest

from fedsl.core.errors import DataError
from fedsl.sources.download import fetch

BODY = bytes(range(256)) * 40


class _RefusesRanges(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.headers.get("Range"):
            self.send_response(416)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusesRanges)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/file.bin"
    srv.shutdown()


MD5 = "md5:" + hashlib.md5(BODY).hexdigest()


def test_complete_part_file_is_finished_when_server_answers_416(server, tmp_path):
    dest = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes(BODY)  # killed after the last byte, before the rename
    assert fetch(server, dest, MD5).read_bytes() == BODY
    assert not (tmp_path / "file.bin.part").exists()


def test_corrupt_part_file_is_removed_when_server_answers_416(server, tmp_path):
    dest = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes(b"x" * len(BODY))
    with pytest.raises(DataError, match="refused to resume"):
        fetch(server, dest, MD5)
    assert not (tmp_path / "file.bin.part").exists()
    assert fetch(server, dest, MD5).read_bytes() == BODY  # the next try starts over


def test_existing_file_with_wrong_checksum_is_reported(tmp_path):
    dest = tmp_path / "file.bin"
    dest.write_bytes(b"not it")
    with pytest.raises(DataError, match="wrong checksum"):
        fetch("http://127.0.0.1:9/never-contacted", dest, MD5)
