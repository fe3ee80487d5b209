"""An upstream that never answers: listens on the Unix socket given as argv[1] and never accepts.

The kernel completes connections into the listen backlog, so the sender's request is written and
then waits forever. scripts/bench.sh puts it behind the mock's hold.sock to keep slotgate's only
slot busy during the fast-429 run.
"""
import os
import signal
import socket
import sys

path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(128)
os.chmod(path, 0o666)  # nginx's workers may run as another user
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
