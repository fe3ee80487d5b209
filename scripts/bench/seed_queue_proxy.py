# The queue proxy printed in shared/seeds/one-user-at-a-time-vs-a-queue.txt ("one worker, a FIFO, a
# max wait, and a 429 or 503 when the queue is full"), kept as printed except for:
#
# FIX (the smallest that makes it reply): as printed, do_POST returns right after queueing the
# request, so BaseHTTPRequestHandler closes the connection before the worker has answered, the
# client gets an empty reply, and the worker's reply raises on the closed socket (which also kills
# the worker thread, since the 504 in its `except` raises too). Now do_POST waits on an Event that
# the worker sets once it has replied. A handler that waits needs a server that reads other
# connections meanwhile, or the FIFO and its 429 could never be reached, hence ThreadingHTTPServer
# (a thread per connection) in place of HTTPServer. The lines changed are marked `# FIX`.
#
# NOT fixed (printed behaviour): a client that leaves before its answer makes the worker's reply raise,
# its 504 in `except` raises too, and the worker thread dies; every later request then waits forever.
# wrk leaves that way at the end of every run, so scripts/bench.sh starts a fresh proxy for each run.
#
# ADAPTED: the upstream and listen ports come from argv (mock TCP port, own port) instead of the
# printed 8080 / 8081, so the benchmark can pick free ports.
import json, queue, threading, urllib.request
import sys  # ADAPTED
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # FIX: was HTTPServer

work = queue.Queue(maxsize=8)
UPSTREAM = "http://127.0.0.1:%d/v1/chat/completions" % int(sys.argv[1])  # ADAPTED

def worker():
    while True:
        handler, body, replied = work.get()  # FIX: + replied
        try:
            req = urllib.request.Request(
                UPSTREAM, data=body,
                headers={"Content-Type": "application/json"},
            )
            raw = urllib.request.urlopen(req, timeout=180).read()
            handler.reply(200, raw)
        except Exception as exc:
            msg = json.dumps({"error": str(exc)}).encode()
            handler.reply(504, msg)
        finally:
            replied.set()  # FIX
            work.task_done()

class Handler(BaseHTTPRequestHandler):
    def reply(self, code, raw):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        replied = threading.Event()  # FIX
        try:
            work.put_nowait((self, body, replied))  # FIX: + replied
        except queue.Full:
            self.reply(429, b'{"error":"queue full"}')
        else:  # FIX
            replied.wait()  # FIX

threading.Thread(target=worker, daemon=True).start()
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()  # FIX, ADAPTED
