"""lily_test.py — shared pieces of the Python parts of tests/test_*.sh: the ok/FAIL tally and starting
`lily serve` on a free loopback port. Imported by the scripts (sys.path gets tests/lib)."""
import re
import subprocess
import time


class Tally:
    """ok / FAIL lines and the closing count, as tests/lib/common.sh prints them."""

    def __init__(self):
        self.passes = self.fails = 0

    def check(self, cond, what, detail=""):
        print(("ok   " if cond else "FAIL ") + what + ("" if cond or not detail else "\n" + detail))
        if cond:
            self.passes += 1
        else:
            self.fails += 1

    def finish(self):
        print(f"{self.passes} passed, {self.fails} failed")
        return 1 if self.fails else 0


def start_server(lily, model, log_path, *args):
    """`lily serve -m model --port 0 --threads 1 *args`, stderr to log_path; returns (process, port) once it
    says it is ready (SystemExit with the log after 60 s or when it exits first)."""
    log = open(log_path, "w+")
    proc = subprocess.Popen([lily, "serve", "-m", model, "--port", "0", "--threads", "1", *args],
                            stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        m = re.search(r"ready on http://127\.0\.0\.1:(\d+)", open(log_path).read())
        if m:
            return proc, int(m.group(1))
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("lily serve did not start:\n" + open(log_path).read())
