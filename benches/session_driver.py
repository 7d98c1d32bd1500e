#!/usr/bin/env python3
"""Closed-loop local driver of the host script's session arm, without SSH.

    benches/session_driver.py N TOTAL [SHELL]

Runs `remote-scripts/cairn.sh` in session mode under SHELL (default dash) and keeps N dispatches
of `true` in flight (each caller sends its next one when the previous one has ended) until TOTAL
have ended; prints dispatches per second and this driver's own CPU per dispatch. The marker home
is `$CAIRN_DRIVER_HOME/.cairn` (default `/tmp/cairn-driver`), which is never deleted here: on ext4
without a journal, deleting thousands of files slows every file creation that follows for a
minute or more (benches/RESULTS.md), so give each run a fresh directory and remove them later.
The commands run under the login shell `$SHELL` (set it to /bin/dash to compare with
`benches/floor.sh` under the same shell).
"""
import os
import subprocess
import sys
import time
import uuid

n, total = int(sys.argv[1]), int(sys.argv[2])
sh = sys.argv[3] if len(sys.argv) > 3 else "dash"
here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, "..", "remote-scripts", "cairn.sh")).read()
nonce = "0123456789abcdef0123456789abcdef"
mark = f"@@cairn-{nonce}@@ ".encode()
home = os.environ.get("CAIRN_DRIVER_HOME", "/tmp/cairn-driver")
os.makedirs(home, exist_ok=True)
env = dict(os.environ, HOME=home)
p = subprocess.Popen(
    [sh, "-c", 'eval "$1"', "cairn", src, "session", ".cairn", nonce],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    env=env,
    bufsize=0,
)
out = open(p.stdout.fileno(), "rb", buffering=65536, closefd=False)
digest = "0" * 64
sent = 0


def send(k):
    """k requests for `true` (one line each, the last newline added: u=1), then "g"."""
    global sent
    buf = b""
    for _ in range(k):
        buf += f"d d{uuid.uuid4().hex} 4 {digest} 0 1 1\ntrue\ne\n".encode()
        sent += 1
    p.stdin.write(buf + b"g\n")


def lines():
    while True:
        line = out.readline()
        if not line:
            sys.exit(f"the session ended after {done} of {total}")
        if line.startswith(mark):
            yield line[len(mark):].split()


done = ok = 0
it = lines()
# warm-up: the marker home and the session's first batch
send(1)
for w in it:
    if len(w) == 2 and w[1] == b"end":
        break
sent = 0
t0 = time.time()
send(min(n, total))
for w in it:
    if len(w) >= 3 and w[1] == b"done" and b"status=0" in w:
        ok += 1
    if len(w) == 2 and w[1] == b"end":
        done += 1
        if done == total:
            break
        if sent < total:
            send(1)
t1 = time.time()
p.stdin.close()
p.wait()
tm = os.times()
print(
    f"{sh}: {n} in flight, {total} dispatches, {total / (t1 - t0):.0f}/s, "
    f"{ok} with status 0, driver CPU {(tm.user + tm.system) * 1000 / total:.2f} ms each"
)
sys.exit(0 if ok == total else 1)
