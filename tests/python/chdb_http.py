"""ClickHouse's HTTP interface, the part whyslow's ClickHouse store uses (the
official Rust client), over ClickHouse's own engine running in-process
(chdb, from PyPI): a POST whose body is one SQL statement answers 200 with
the result in the `default_format` the URL names (RowBinary for the client),
or 500 with the engine's error; a POST whose URL carries `query=INSERT …
FORMAT RowBinary` takes the rows from its body (chunked or not), which the
engine reads as `FROM INFILE`. Data lives
in a chdb session directory, so MergeTree tables, FINAL and TTLs behave as
on a server. The test stand-in for a ClickHouse server; a real one is used
instead when WHYSLOW_CLICKHOUSE_URL is set.

    python chdb_http.py DIR PORT      (port 0: any; prints "listening on http://127.0.0.1:P")
"""

import http.server
import os
import sys
import tempfile
import threading
import urllib.parse

from chdb import session


def main():
    path, port = sys.argv[1], int(sys.argv[2])
    db = session.Session(path)
    lock = threading.Lock()  # one statement at a time: a session is not thread-safe

    class Handler(http.server.BaseHTTPRequestHandler):
        def body(self):
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                return self.rfile.read(int(self.headers.get("Content-Length", "0")))
            out = bytearray()
            while True:
                n = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                out += self.rfile.read(n)
                self.rfile.readline()

        def do_POST(self):
            params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
            data = self.body()
            rows = None
            if "query" in params:
                sql = params["query"]
                if data:
                    fd, rows = tempfile.mkstemp(prefix="rows-", dir=path)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                    head, fmt = sql.rsplit(" FORMAT ", 1)
                    sql = "%s FROM INFILE '%s' FORMAT %s" % (head, rows, fmt)
            else:
                sql = data.decode("utf-8")
            try:
                with lock:
                    out = db.query(sql, params.get("default_format", "TabSeparated"))
                body, code = (out.bytes() if out is not None else b""), 200
            except Exception as e:  # the engine's error, as a server sends it
                body, code = ("Code: 1. DB::Exception: %s" % e).encode(), 500
            finally:
                if rows:
                    os.unlink(rows)
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # ClickHouse answers "Ok." on /ping and /
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"Ok.\n")

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("listening on http://127.0.0.1:%d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
