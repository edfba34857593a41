"""A real headless Chromium for perfgate's page tests (never a DOM stand-in), driven over its DevTools pipe.

Debian's ``chromium`` (``apt-get install -y chromium``) starts headless with ``--remote-debugging-pipe``:
commands go in on file descriptor 3 and answers come out on 4, NUL-terminated JSON (the Chrome DevTools
Protocol), so no port is opened and no driver package is needed. Every request the page makes is seen
(``Network.requestWillBeSent``), and the browser is given a proxy that leads nowhere, so a page that tried
to fetch anything from the network would both show the request and fail to get it. The browser is ended by
its PID, and its profile folder removed.
"""
from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

INSTALL = "apt-get install -y chromium (Debian's package; as root)"
NOWHERE = "127.0.0.1:9"  # the discard port: nothing listens, a request through it fails at once


def executable() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """``open(url)`` -> the requests the page made; ``evaluate(js)`` -> its JSON value; ``close()`` (always)."""

    def __init__(self, *, width: int = 1400, height: int = 1000, timeout_s: float = 30.0):
        path = executable()
        if path is None:
            raise RuntimeError(f"no Chromium found: {INSTALL}")
        self.timeout_s = timeout_s
        self.profile = Path(tempfile.mkdtemp(prefix="perfgate-chromium-"))
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the child sees its ends as fds 3 (commands in) and 4 (answers out)
        argv = [path, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--remote-debugging-pipe", f"--proxy-server={NOWHERE}", "--proxy-bypass-list=<-loopback>",
                f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"]

        def ends() -> None:  # via fds >= 10 first: either end may itself be 3 or 4
            high_r, high_w = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        # close_fds=False: the ends placed in ends() must survive; every other fd of ours is close-on-exec
        self.proc = subprocess.Popen(argv, close_fds=False, preexec_fn=ends, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.session: str | None = None
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Network.enable", "Page.enable", "Runtime.enable"):
            self.call(domain)

    # --- the protocol ---------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise TimeoutError(f"Chromium did not answer in {self.timeout_s:g} s (exit {self.proc.poll()})")
            if not select.select([self._from_browser], [], [], max(deadline - time.monotonic(), 0.0))[0]:
                continue  # nothing yet: the deadline above decides
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium closed its pipe (exit {self.proc.wait(5)})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, event: str) -> dict:
        deadline = time.monotonic() + self.timeout_s
        for i, e in enumerate(self.events):
            if e.get("method") == event:
                return self.events.pop(i)
        while True:
            answer = self._read_message(deadline)
            if answer.get("method") == event:
                return answer
            self.events.append(answer)

    # --- what a test asks -------------------------------------------------------------------------
    def open(self, url: str) -> list[str]:
        """Load ``url`` to its load event; every URL the page requested (the page's own included)."""
        self.events.clear()
        if self.call("Page.navigate", {"url": url}).get("loaderId"):  # none: only the #fragment changed
            self.wait_for("Page.loadEventFired")
        self.evaluate("new Promise(r => setTimeout(r, 200))")  # late requests (fonts, lazy images) show too
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)  # its own session: the browser and its helpers, by the PID we started
            self.proc.wait(10)
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)
