# The preview tests' server, run inside a container (python3 from the host's /usr):
# static files from /workspace, `/egress?URL` (tries URL through the container's proxy
# and answers what happened), and `/ws`, a WebSocket echo (RFC 6455, stdlib only).
import base64
import hashlib
import http.server
import os
import socketserver
import sys
import urllib.error
import urllib.request

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path.startswith("/egress?"):
            url = self.path.split("?", 1)[1]
            # Through the container's egress proxy always (no_proxy would send a
            # loopback URL straight to the container's own loopback).
            os.environ.pop("NO_PROXY", None)
            os.environ.pop("no_proxy", None)
            proxy = os.environ.get("HTTP_PROXY", "")
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
            try:
                with opener.open(url, timeout=5) as r:
                    body = b"reached %d" % r.status
            except urllib.error.HTTPError as e:
                body = b"blocked %d" % e.code
            except Exception as e:  # noqa: BLE001 - the answer names it
                body = ("error %s %s" % (type(e).__name__, e)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            key = self.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            self.wfile.flush()
            self.echo()
            self.close_connection = True
            return
        super().do_GET()

    def echo(self):
        r, w = self.rfile, self.wfile
        while True:
            head = r.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = int.from_bytes(r.read(2), "big")
            elif n == 127:
                n = int.from_bytes(r.read(8), "big")
            mask = r.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                w.write(b"\x88\x00")
                w.flush()
                return
            size = bytes([n]) if n < 126 else bytes([126]) + n.to_bytes(2, "big")
            w.write(bytes([0x80 | op]) + size + data)
            w.flush()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


os.chdir("/workspace")
Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
