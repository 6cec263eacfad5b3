"""Google-shaped servers for the peer tests, on 127.0.0.1, in-process (threads):

- `TokenServer`: the OAuth2 token endpoint of a service account (JWT-bearer grant). It checks the assertion's RS256
  signature against the key pair it generated, and issues tokens that expire after `ttl` seconds.
- `Proxy`: a checking reverse proxy. In front of the Iceberg REST catalog server it plays BigLake: it demands a valid,
  unexpired bearer token and the `x-goog-user-project` header, and vends short-lived storage tokens in load-table
  responses when asked (`X-Iceberg-Access-Delegation: vended-credentials`). In front of the GCS emulator it demands a
  valid token too (the emulator itself checks none), so a client that misses a refresh fails.
- Fault injection: `Proxy.inject(method, path_regex, action, times)` answers 503, drops the connection before or after
  forwarding, stalls, or answers 504 and forwards the request later (`forward_delay`) — to prove that runs finish
  correctly or fail cleanly.

Nothing here talks to a Google endpoint: clients are given these URLs explicitly.
"""
import base64
import http.client
import json
import re
import secrets
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from conftest import free_port

JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"


def _b64d(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


class _Server:
    def __init__(self, handler_cls):
        self.port = free_port()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler_cls)
        self.httpd.daemon_threads = True
        self.httpd.owner = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Tokens:
    """Every token issued, by kind ("google": ADC of the service account; "storage": vended), with its expiry."""

    def __init__(self):
        self.lock = threading.Lock()
        self.issued = {}

    def issue(self, kind, ttl):
        tok = f"{kind}-{secrets.token_hex(12)}"
        exp = time.time() + ttl
        with self.lock:
            self.issued[tok] = (kind, exp)
        return tok, exp

    def check(self, header, kinds):
        """None when valid, else the reason it is not."""
        if not header or not header.startswith("Bearer "):
            return "missing"
        with self.lock:
            entry = self.issued.get(header[len("Bearer "):])
        if entry is None:
            return "unknown"
        kind, exp = entry
        if kind not in kinds:
            return f"wrong kind {kind}"
        if time.time() >= exp:
            return "expired"
        return None

    def count(self, kind):
        with self.lock:
            return sum(1 for k, _ in self.issued.values() if k == kind)


class _TokenHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        srv = self.server.owner
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        form = dict(urllib.parse.parse_qsl(body))
        err = srv.verify(form)
        if err:
            return self._send(400, {"error": "invalid_grant", "error_description": err})
        tok, _ = srv.tokens.issue("google", srv.ttl)
        self._send(200, {"access_token": tok, "expires_in": srv.ttl, "token_type": "Bearer"})

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class TokenServer(_Server):
    def __init__(self, tokens, ttl, project="cdc-test"):
        self.tokens, self.ttl, self.project = tokens, ttl, project
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        super().__init__(_TokenHandler)

    @property
    def token_uri(self):
        return f"{self.url}/token"

    def key_file(self, path):
        pem = self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
        info = {
            "type": "service_account", "project_id": self.project, "private_key_id": "k1", "private_key": pem,
            "client_email": f"cdc@{self.project}.iam.gserviceaccount.com", "client_id": "1", "token_uri": self.token_uri,
        }
        with open(path, "w") as f:
            json.dump(info, f)
        return path

    def verify(self, form):
        if form.get("grant_type") != JWT_GRANT:
            return f"grant_type {form.get('grant_type')}"
        try:
            head, claims, sig = form["assertion"].split(".")
            self.key.public_key().verify(_b64d(sig), f"{head}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256())
            c = json.loads(_b64d(claims))
        except Exception as e:  # noqa: BLE001 - any malformed assertion is refused
            return f"bad assertion: {e}"
        if c.get("aud") != self.token_uri or c.get("exp", 0) < time.time():
            return "wrong audience or expired assertion"
        return None


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        self._proxy()

    def do_HEAD(self):
        self._proxy()

    def do_POST(self):
        self._proxy()

    def do_PUT(self):
        self._proxy()

    def do_DELETE(self):
        self._proxy()

    def do_PATCH(self):
        self._proxy()

    def _body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                n = int(self.rfile.readline().strip().split(b";")[0], 16)
                if n == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(n)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))

    def _reply(self, code, data=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _drop(self):
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _proxy(self):
        p = self.server.owner
        body = self._body()
        p.record(self.command, self.path)
        action = p.fault_for(self.command, self.path)
        if action == "503":
            return self._reply(503, b'{"error":{"message":"injected","type":"ServiceUnavailable","code":503}}')
        if action == "drop":
            return self._drop()
        if action == "stall":
            time.sleep(p.stall_seconds)
            return self._drop()
        refusal = p.refuse(self.headers)
        if refusal:
            p.refusals.append((self.command, self.path, refusal))
            code = 403 if refusal.startswith("project") else 401
            return self._reply(code, json.dumps({"error": {"message": refusal, "type": "NotAuthorized", "code": code}}).encode())
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "authorization", "connection", "transfer-encoding", "content-length")}
        if body or self.command in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        if action == "504_forward_later":
            # a gateway that times out while the server still works on the request: it lands after the client gave up
            threading.Thread(target=_forward, args=(p.upstream_port, self.command, self.path, body, headers, p.forward_delay), daemon=True).start()
            return self._reply(504, b'{"error":{"message":"injected gateway timeout","type":"GatewayTimeout","code":504}}')
        status, rheaders, data = _forward(p.upstream_port, self.command, self.path, body, headers)
        if action == "drop_after":
            return self._drop()
        if action == "503_after":
            return self._reply(503, b'{"error":{"message":"injected after forwarding","type":"ServiceUnavailable","code":503}}')
        data = p.rewrite(self.command, self.path, self.headers, status, data)
        self._reply(status, data, rheaders)


def _forward(port, method, path, body, headers, delay=0):
    """Sends the request upstream (after `delay` seconds): (status, headers, body)."""
    time.sleep(delay)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, [(k, v) for k, v in resp.getheaders() if k.lower() not in ("content-length", "transfer-encoding", "connection")], data
    finally:
        conn.close()


class Proxy(_Server):
    """A reverse proxy to 127.0.0.1:`upstream_port` that checks tokens (`kinds`), optionally the
    `x-goog-user-project` header (`project`), vends storage tokens (`vend`: (storage_url, ttl)), and injects faults."""

    def __init__(self, upstream_port, tokens, kinds, project=None, vend=None):
        self.upstream_port, self.tokens, self.kinds, self.project, self.vend = upstream_port, tokens, kinds, project, vend
        self.lock = threading.Lock()
        self.faults = []
        self.requests = []
        self.refusals = []
        self.vended = 0
        self.stall_seconds = 3
        self.forward_delay = 0.5
        super().__init__(_ProxyHandler)

    def record(self, method, path):
        with self.lock:
            self.requests.append((method, path))

    def inject(self, method, path_regex, action, times=1):
        with self.lock:
            self.faults.append([method, re.compile(path_regex), action, times])

    def fault_for(self, method, path):
        with self.lock:
            for f in self.faults:
                if f[3] > 0 and f[0] == method and f[1].search(path):
                    f[3] -= 1
                    return f[2]
        return None

    def pending_faults(self):
        with self.lock:
            return sum(f[3] for f in self.faults)

    def refuse(self, headers):
        why = self.tokens.check(headers.get("Authorization"), self.kinds)
        if why:
            return f"token {why}"
        if self.project and headers.get("x-goog-user-project") != self.project:
            return f"project header {headers.get('x-goog-user-project')!r} (expected {self.project!r})"
        return None

    def rewrite(self, method, path, headers, status, data):
        """Vends a storage token in successful load/create-table responses that asked for one."""
        if not self.vend or status != 200 or "vended-credentials" not in headers.get("X-Iceberg-Access-Delegation", ""):
            return data
        if not re.search(r"/namespaces/[^/]+/tables(/[^/?]+)?$", path.split("?")[0]):
            return data
        storage_url, ttl = self.vend
        body = json.loads(data)
        tok, exp = self.tokens.issue("storage", ttl)
        cfg = body.setdefault("config", {})
        cfg.pop("gcs.no-auth", None)
        cfg.update({"gcs.oauth2.token": tok, "gcs.oauth2.token-expires-at": str(int(exp * 1000)), "gcs.service.path": storage_url})
        with self.lock:
            self.vended += 1
        return json.dumps(body).encode()
