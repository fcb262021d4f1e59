"""A small HTTP proxy between the S3 client and the server that injects faults.

The fault file holds one line, "MODE COUNT [SKIP]": the next COUNT requests
the mode applies to get it, after the first SKIP of them pass untouched (the
counts are decremented here; an empty file: no faults).
Modes:
  slowdown      every request: 503 SlowDown, not forwarded
  slowdown_put  PUT requests only (multipart parts fail, create/abort pass)
  reset         every request: the connection is reset (RST), no answer
  stall         every request: no answer for 4 s, then the connection closes
  truncate      GETs with a body: the full Content-Length, half the body, close
  badlen        GETs with a body: one byte short, with a matching Content-Length
  trickle       GETs with a body: the full Content-Length, then the body at
                about 20 bytes a second (above any stall limit)
  badetag       PUTs: the server's answer with a wrong ETag (32 zeros)
  oddetag       PUTs: the server's answer with an ETag that is not hex
  badetag_kms   PUTs: a wrong ETag, the answer naming SSE-KMS encryption
  badetag_kmsid PUTs: a wrong ETag, the answer naming only a KMS key id
  badcrc        PUTs: the server's answer states a wrong CRC32 checksum
  baddigest     PUTs: 400 BadDigest (the server's checksum of the body did
                not match), not forwarded
  lostanswer    PUTs: forwarded (the write lands), then the connection is
                reset: the answer is lost
  notimpl_cond  PUTs with If-Match or If-None-Match: 501 NotImplemented (a
                store without conditional writes), not forwarded
Listings (GET ?list-type=2 and ?uploads), answered 200 with a matching
Content-Length but a hostile body:
  list_cut      the body cut before its first entry (half of it without one)
  list_notrunc  the IsTruncated element left out
  list_foreign  the first Key outside the prefix asked for ("zz-elsewhere/")
  list_loop     ListObjectsV2: the page said truncated, its next token
                "dcp-loop"; a request sending that token gets the same page
                again (from the proxy, not forwarded)
  complete_cut  CompleteMultipartUpload (POST ?uploadId=): forwarded (the
                object is made), its answer cut to half
"""
import re
import http.client
import http.server
import socket
import struct
import threading
import time

_lock = threading.Lock()


_LIST_MODES = ("list_cut", "list_notrunc", "list_foreign", "list_loop")
_loop_page = {}  # list_loop: the page served again


def _is_list(method, target):
    q = target.partition("?")[2]
    return method == "GET" and ("list-type=2" in q or re.search(r"(^|&)uploads=", q) is not None)


def _take(path, method, has_body, cond=False, target=""):
    with _lock:
        try:
            with open(path) as f:
                parts = f.read().split()
        except OSError:
            return None
        if len(parts) not in (2, 3) or int(parts[1]) <= 0:
            return None
        mode, n = parts[0], int(parts[1])
        skip = int(parts[2]) if len(parts) == 3 else 0
        applies = {"slowdown": True, "reset": True, "stall": True,
                   "slowdown_put": method == "PUT", "badetag": method == "PUT",
                   "oddetag": method == "PUT", "badcrc": method == "PUT",
                   "badetag_kms": method == "PUT",
                   "badetag_kmsid": method == "PUT",
                   "baddigest": method == "PUT",
                   "lostanswer": method == "PUT",
                   "notimpl_cond": method == "PUT" and cond,
                   "truncate": method == "GET", "badlen": method == "GET",
                   "trickle": method == "GET",
                   "complete_cut": method == "POST" and "uploadId=" in target,
                   **{m: _is_list(method, target) for m in _LIST_MODES}}.get(mode, False)
        if not applies:
            return None
        if skip > 0:
            with open(path, "w") as f:
                f.write(f"{mode} {n} {skip - 1}\n")
            return None
        with open(path, "w") as f:
            f.write(f"{mode} {n - 1}\n")
        return mode


def _hostile_body(mode, data):
    """A listing's (or completion's) body made hostile, as the mode says."""
    if mode == "complete_cut":
        return data[: len(data) // 2]
    if mode == "list_cut":
        m = re.search(rb"<(Contents|CommonPrefixes|Upload)>", data)
        return data[: m.start()] if m else data[: len(data) // 2]
    if mode == "list_notrunc":
        return re.sub(rb"<IsTruncated>[^<]*</IsTruncated>", b"", data)
    if mode == "list_foreign":
        return re.sub(rb"<Key>", b"<Key>zz-elsewhere/", data, count=1)
    # list_loop: truncated, its token dcp-loop, kept to be served again
    data = re.sub(rb"<IsTruncated>[^<]*</IsTruncated>",
                  b"<IsTruncated>true</IsTruncated>", data)
    data = re.sub(rb"<NextContinuationToken>[^<]*</NextContinuationToken>", b"", data)
    data = data.replace(b"</ListBucketResult>",
                        b"<NextContinuationToken>dcp-loop</NextContinuationToken>"
                        b"</ListBucketResult>")
    _loop_page["page"] = data
    return data


def start(host, port, up_host, up_port, fault_path):
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _reset(self):
            """The connection reset (RST), no answer."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

        def _any(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            mode = _take(fault_path, self.command, True,
                         "If-Match" in self.headers or "If-None-Match" in self.headers,
                         self.path)
            if mode == "list_loop" and "continuation-token=dcp-loop" in self.path \
                    and "page" in _loop_page:
                self._answer(200, _loop_page["page"])
                return
            errors = {  # answered here, not forwarded
                "notimpl_cond": (501, "NotImplemented", "A header you provided "
                                 "implies functionality that is not implemented"),
                "baddigest": (400, "BadDigest", "The CRC32 you specified did not "
                              "match the calculated checksum."),
                "slowdown": (503, "SlowDown", "Reduce"),
                "slowdown_put": (503, "SlowDown", "Reduce")}
            if mode in errors:
                status, code, text = errors[mode]
                msg = f"<Error><Code>{code}</Code><Message>{text}</Message></Error>".encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
            if mode == "reset":
                self._reset()
                return
            if mode == "stall":
                time.sleep(4)
                self.close_connection = True
                return
            c = http.client.HTTPConnection(up_host, up_port, timeout=30)
            hdrs = {k: v for k, v in self.headers.items()}
            c.request(self.command, self.path, body=body if n else None, headers=hdrs)
            r = c.getresponse()
            data = r.read() if self.command != "HEAD" else b""
            rh = r.getheaders()
            c.close()
            if mode in ("truncate", "badlen", "trickle") and len(data) < 2:
                mode = None
            if mode == "lostanswer":
                self._reset()
                return
            if mode in _LIST_MODES or mode == "complete_cut":
                data = _hostile_body(mode, data)
            self.send_response(r.status)
            for k, v in rh:
                kl = k.lower()
                if kl in ("content-length", "transfer-encoding", "connection", "date", "server"):
                    continue
                if kl == "etag" and (mode or "").startswith("badetag"):
                    v = '"00000000000000000000000000000000"'
                if kl == "etag" and mode == "oddetag":
                    v = '"</ETag><Part>0000000000000000000000"'
                if kl == "x-amz-checksum-crc32" and mode == "badcrc":
                    continue
                self.send_header(k, v)
            if mode == "badcrc":
                self.send_header("x-amz-checksum-crc32", "AAAAAA==")
            if mode == "badetag_kms":
                self.send_header("x-amz-server-side-encryption", "aws:kms")
            if mode == "badetag_kmsid":
                self.send_header("x-amz-server-side-encryption-aws-kms-key-id",
                                 "k1")
            if self.command == "HEAD":
                self.send_header("Content-Length", r.getheader("Content-Length", "0"))
                self.end_headers()
                return
            if mode == "badlen":
                data = data[:-1]
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if mode == "trickle":
                for i in range(0, len(data), 4):
                    self.wfile.write(data[i:i + 4])
                    self.wfile.flush()
                    time.sleep(0.2)
                return
            if mode == "truncate":
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(data)

        def _answer(self, status, body):
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _safe(self):
            try:
                self._any()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _safe

    srv = http.server.ThreadingHTTPServer((host, port), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv
