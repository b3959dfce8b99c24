"""A whole object read through boto3 whose connection closes early (a clean close, as a server
that restarts gives): botocore checks a body's length in its own ``read`` only, so a read as the
bytes arrive took the close for the object's end, and a shard read whole (a cache's download,
a shard without an index) came out short without a word."""

from __future__ import annotations

import socket
from pathlib import Path

from pipeline.storage import open_stream
from tests.storage.conftest import upload_folder
from tests.storage.servers import FaultProxy, make_bucket, port_of

SHARD = "part-000001.tar"
SENT = 20_000  # bytes of the body sent before the close


class ClosesOneWholeBodyEarly(FaultProxy):
    """Forwards every request; of the first answer to a GET without a Range, sends its head and
    ``SENT`` bytes of its body, then closes the connection cleanly."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port, {})
        self.closed_one = False

    def _pump(self, upstream: socket.socket, client: socket.socket, fault: str) -> None:
        head = self.heads[-1]
        if self.closed_one or not head.startswith(b"GET /") or b"\r\nrange:" in head.lower():
            return super()._pump(upstream, client, fault)
        self.closed_one = True
        answer = b""
        while len(answer.partition(b"\r\n\r\n")[2]) < SENT and (data := upstream.recv(65536)):
            answer += data
        answer_head, _, body = answer.partition(b"\r\n\r\n")
        client.sendall(answer_head + b"\r\n\r\n" + body[:SENT])
        client.shutdown(socket.SHUT_RDWR)


def test_a_whole_object_whose_connection_closes_early_is_resumed_not_cut_short(s3_env: str, web_root: Path,
                                                                               monkeypatch, fast_retries) -> None:
    make_bucket("closed")
    upload_folder(web_root / "data", "closed", "train")
    monkeypatch.setenv("PIPELINE_S3_PRESIGNED", "0")  # boto3's own requests: the presigned ones are urllib3's, which check
    proxy = ClosesOneWholeBodyEarly(port_of(s3_env))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        whole = (web_root / "data" / SHARD).read_bytes()
        assert len(whole) > 2 * SENT
        with open_stream(f"s3://closed/train/{SHARD}") as stream:
            assert stream.read() == whole
        gets = [head.lower() for head in proxy.heads if head.startswith(b"GET /closed/")]
        assert len(gets) == 2 and b"\r\nrange: bytes=20000-" in gets[1]
    finally:
        proxy.close()
