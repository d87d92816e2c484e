"""The drivers' test upstream on 127.0.0.2 (the fence checks): every GET is answered
200 "upstream says hi\\n" and its path recorded in `hits`. The e2e harness mirrors
127.0.0.2 into the nodes' namespaces, so it serves every front."""

import http.server
import threading

HOST = "127.0.0.2"
hits = []


class _Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        hits.append(self.path)
        body = b"upstream says hi\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def start():
    """Serve it on a free port of 127.0.0.2 (a daemon thread); answer the server
    (`shutdown()` stops it) and its URL."""
    up = http.server.ThreadingHTTPServer((HOST, 0), _Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    return up, f"http://{HOST}:{up.server_address[1]}"
