"""The server's web UI in a real browser (issue 46 item 4): headless Chromium
(Debian's `chromium`) loads the jobs list, the demo job's page, the
diagnosis of a recorded agent spool (and that job's page), a hung job's page
and a flow analysis's job page, driven over the DevTools protocol (a small
client below, standard library only). On each page: the verdict is on top
(within the first 1400 x 900 viewport) and names what it must (the demo:
rank 2 and `injected_slow_rank_work`, without a click; the jobs list: rank 2
as the demo job's status; the hang: the culprit rank; the diagnosis: the
rank and the layer; the flows: the throttled link); nothing scrolls sideways
at 1400 px; Tab reaches links or controls that show a focus ring; text
contrasts with its background by WCAG's 4.5:1 (3:1 for large text).
Screenshots of every page go to $WHYSLOW_ARTIFACTS/ui-screens/ (else
pytest's tmp dir; .ci/run sets it to target/artifacts) with ui-checks.json
(what each check measured) and, with WHYSLOW_UPDATE_SCREENSHOTS=1, to
docs/screens/.

Skips when no chromium is on PATH, unless WHYSLOW_REQUIRE_BROWSER=1 (.ci/run
sets it), then fails."""

import base64
import glob
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conftest import ROOT, whyslow_server_cmd

WIDTH, HEIGHT = 1400, 900
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
DEMO_JOB = "demo-slow-rank"
SPOOL_JOB = "noisy-neighbour"
HANG_JOB = "hung-job"
FLOWS_JOB = "slow-uplink"


# ---------------------------------------------------------------- CDP client


class Cdp:
    """A DevTools-protocol client over one WebSocket (RFC 6455: the
    handshake, masked text frames out, unmasked frames in)."""

    def __init__(self, ws_url, timeout=30):
        u = urllib.parse.urlparse(ws_url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n" % (u.path, u.hostname, u.port, key)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the connection during the handshake")
            head += chunk
        head, self.buf = head.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise ConnectionError("DevTools refused the WebSocket: %r" % head[:200])
        self.next_id = 0
        self.events = []

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send_frame(self, opcode, payload):
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def _message(self):
        data = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            opcode = b0 & 0x0F
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the WebSocket")
            data += payload
            if b0 & 0x80:
                return json.loads(data.decode())

    def call(self, method, **params):
        self.next_id += 1
        mid = self.next_id
        self._send_frame(0x1, json.dumps({"id": mid, "method": method, "params": params}).encode())
        while True:
            m = self._message()
            if m.get("id") == mid:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m.get("result", {})
            if "method" in m:
                self.events.append(m)

    def wait_event(self, method, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e["method"] == method:
                    return self.events.pop(i)
            if time.monotonic() > deadline:
                raise TimeoutError("no %s within %d s" % (method, timeout))
            self.sock.settimeout(max(0.1, deadline - time.monotonic()))
            m = self._message()
            if "method" in m:
                self.events.append(m)

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError("page script failed: %s\n%s" % (r["exceptionDetails"], expr[:500]))
        return r["result"].get("value")

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def _drain(pipe):
    """Reads the rest of a child's stderr away (a full pipe would stall it)."""
    threading.Thread(target=lambda: [None for _ in iter(lambda: pipe.read(1 << 16), b"")], daemon=True).start()


def find_browser():
    for b in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(b):
            return shutil.which(b)
    return None


class Browser:
    """Headless Chromium at WIDTH x HEIGHT, one page driven over CDP."""

    def __init__(self, exe, profile_dir):
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-port=0", "--remote-allow-origins=*",
             "--user-data-dir=%s" % profile_dir, "--window-size=%d,%d" % (WIDTH, HEIGHT),
             "--no-first-run", "--no-default-browser-check", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ws, seen = None, []
        deadline = time.monotonic() + 60
        while ws is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline().decode(errors="replace")
            if not line and self.proc.poll() is not None:
                break
            seen.append(line)
            if "DevTools listening on " in line:
                ws = line.split("DevTools listening on ", 1)[1].strip()
        if ws is None:
            self.quit()
            raise RuntimeError("chromium printed no DevTools address:\n" + "".join(seen)[-3000:])
        _drain(self.proc.stderr)
        port = urllib.parse.urlparse(ws).port
        with urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=30) as r:
            pages = [t for t in json.loads(r.read()) if t.get("type") == "page"]
        assert pages, "chromium has no page target"
        self.cdp = Cdp(pages[0]["webSocketDebuggerUrl"])
        self.cdp.call("Page.enable")
        self.cdp.call("Network.enable")
        self.cdp.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                      deviceScaleFactor=1, mobile=False)
        # A headless page has no OS focus: without this, :focus-visible
        # and document.hasFocus() answer as for a background window.
        self.cdp.call("Emulation.setFocusEmulationEnabled", enabled=True)

    def goto(self, url):
        self.cdp.events.clear()
        r = self.cdp.call("Page.navigate", url=url)
        assert not r.get("errorText"), "%s: %s" % (url, r["errorText"])
        self.cdp.wait_event("Page.loadEventFired", timeout=30)
        # Fonts laid out, one frame drawn.
        self.cdp.eval("document.fonts.ready.then(() => new Promise(r => requestAnimationFrame(() => r(1))))")

    def tab(self):
        for t in ("rawKeyDown", "keyUp"):
            self.cdp.call("Input.dispatchKeyEvent", type=t, key="Tab", code="Tab",
                          windowsVirtualKeyCode=9, nativeVirtualKeyCode=9)

    def screenshot(self, path):
        r = self.cdp.call("Page.captureScreenshot", format="png",
                          clip={"x": 0, "y": 0, "width": WIDTH, "height": HEIGHT, "scale": 1})
        with open(path, "wb") as f:
            f.write(base64.b64decode(r["data"]))

    def quit(self):
        if getattr(self, "cdp", None):
            self.cdp.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)


# ------------------------------------------------------ checks in the page

# Runs in the page: what the checks need, measured by the browser itself.
MEASURE_JS = r"""
(() => {
  const srgb = c => { c /= 255; return c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); };
  const lum = ([r, g, b]) => 0.2126 * srgb(r) + 0.7152 * srgb(g) + 0.0722 * srgb(b);
  const rgba = s => { const m = s.match(/[\d.]+/g).map(Number); return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
  // The colour behind an element: its own background or its nearest
  // ancestor's that is not transparent, over white (blended by alpha).
  const behind = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let out = [255, 255, 255];
    for (const c of layers.reverse()) out = out.map((v, i) => v * (1 - c[3]) + c[i] * c[3]);
    return out;
  };
  const contrast = el => {
    const fg = rgba(getComputedStyle(el).color), bg = behind(el);
    const f = fg.slice(0, 3).map((v, i) => v * fg[3] + bg[i] * (1 - fg[3]));
    const [a, b] = [lum(f), lum(bg)].sort((x, y) => y - x);
    return (a + 0.05) / (b + 0.05);
  };
  const large = el => { const s = getComputedStyle(el); const px = parseFloat(s.fontSize);
    return px >= 24 || (px >= 18.66 && parseInt(s.fontWeight) >= 700); };
  const describe = el => el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\s+/).join('.') : '')
    + ' "' + (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 50) + '"';
  const visible = el => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
  // Every element with text of its own (outside SVG plots, which colour
  // text with fill): its contrast against what is behind it.
  const low = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest('svg') || !visible(el)) continue;
    if (el.closest('details:not([open])') && el.tagName !== 'SUMMARY' && !el.closest('summary')) continue;
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own) continue;
    const c = contrast(el), need = large(el) ? 3 : 4.5;
    if (c < need) low.push(describe(el) + ': ' + c.toFixed(2) + ' < ' + need);
  }
  const doc = document.documentElement;
  // What sticks out on the right, when something does.
  // (the innermost elements whose box or content reaches past the right
  // edge: a wide table, a long line in a <pre>).
  let wide = [];
  if (doc.scrollWidth > doc.clientWidth) {
    const cw = doc.clientWidth;
    const past = [...document.body.querySelectorAll('*')].filter(el => {
      if (el.closest('svg') && el.tagName.toLowerCase() !== 'svg') return false;
      const r = el.getBoundingClientRect();
      return r.right > cw + 1 || (r.left + el.scrollWidth > cw + 1 && getComputedStyle(el).overflowX === 'visible');
    });
    wide = past.filter(el => !past.some(o => o !== el && el.contains(o)))
      .map(el => describe(el) + ' reaches ' + Math.round(el.getBoundingClientRect().left + Math.max(el.scrollWidth, el.getBoundingClientRect().width)) + ' px');
  }
  const main = document.querySelector('main') || document.body;
  return {
    title: document.title,
    text: document.body.innerText,
    scrollWidth: doc.scrollWidth, clientWidth: doc.clientWidth, innerWidth: window.innerWidth,
    wide: wide.slice(0, 8),
    bodyContrast: contrast(document.body), mainContrast: contrast(main),
    lowContrast: low.slice(0, 12),
  };
})()
"""

# The verdict: the element the pages mark as such (class `verdict`,
# aria-label "verdict").
VERDICT_JS = r"""
(() => {
  const el = document.querySelector('[aria-label="verdict"], .verdict');
  if (!el) return null;
  const r = el.getBoundingClientRect();
  const srgb = c => { c /= 255; return c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); };
  const lum = a => 0.2126 * srgb(a[0]) + 0.7152 * srgb(a[1]) + 0.0722 * srgb(a[2]);
  const rgb = s => s.match(/[\d.]+/g).map(Number);
  let bg = [255, 255, 255];
  for (let e = el; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor); if ((c.length < 4 || c[3] > 0)) { bg = c; break; } }
  // The verdict's least contrasting text (its own lines and what is inside).
  let worst = 99;
  for (const t of [el, ...el.querySelectorAll('*')]) {
    if (![...t.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
    let b = bg;
    for (let e = t; e && e !== el.parentElement; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor); if (c.length < 4 || c[3] > 0) { b = c; break; } }
    const [x, y] = [lum(rgb(getComputedStyle(t).color)), lum(b)].sort((p, q) => q - p);
    worst = Math.min(worst, (x + 0.05) / (y + 0.05));
  }
  return {top: r.top, bottom: r.bottom, text: el.innerText, contrast: worst};
})()
"""

FOCUS_JS = r"""
(() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  // Inside a frame (a flame graph): the element focused in it, too.
  let inner = el;
  while (inner.tagName === 'IFRAME' && inner.contentDocument && inner.contentDocument.activeElement
         && inner.contentDocument.activeElement !== inner.contentDocument.body)
    inner = inner.contentDocument.activeElement;
  const srgb = c => { c /= 255; return c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); };
  const lum = a => 0.2126 * srgb(a[0]) + 0.7152 * srgb(a[1]) + 0.0722 * srgb(a[2]);
  const rgb = s => s.match(/[\d.]+/g).map(Number);
  const ringOf = e => {
    const s = getComputedStyle(e);
    if (s.boxShadow !== 'none') return {ring: true, how: 'box-shadow ' + s.boxShadow};
    if (s.outlineStyle === 'none' || parseFloat(s.outlineWidth) <= 0) return {ring: false, how: 'outline ' + s.outlineStyle + ' ' + s.outlineWidth};
    // 'auto': the browser's own two-tone ring, visible on light and dark.
    if (s.outlineStyle === 'auto') return {ring: true, how: 'outline auto'};
    // A ring of the page's own: it must stand out from what is behind
    // it by 3:1 (WCAG 1.4.11).
    let bg = [255, 255, 255];
    for (let p = e.parentElement; p; p = p.parentElement) { const c = rgb(getComputedStyle(p).backgroundColor); if (c.length < 4 || c[3] > 0) { bg = c; break; } }
    const [x, y] = [lum(rgb(s.outlineColor)), lum(bg)].sort((p, q) => q - p);
    const c = (x + 0.05) / (y + 0.05);
    return {ring: c >= 3, how: 'outline ' + s.outlineStyle + ' ' + s.outlineWidth + ' ' + s.outlineColor + ' (contrast ' + c.toFixed(2) + ')'};
  };
  const r = ringOf(el), ri = inner === el ? r : ringOf(inner);
  return {tag: el.tagName.toLowerCase(), inner: inner.tagName.toLowerCase(),
          text: (el.innerText || el.value || el.title || '').trim().slice(0, 40),
          href: el.getAttribute('href'), ring: r.ring || ri.ring, how: r.how + (inner === el ? '' : '; inside: ' + ri.how)};
})()
"""


class Failures:
    """Every check's failure, each naming its page and measure; the test
    fails once at the end with all of them."""

    def __init__(self):
        self.items = []

    def check(self, ok, page, measure, detail):
        if not ok:
            self.items.append("%s: %s: %s" % (page, measure, detail))


def check_page(b, fails, name, verdict_must, focus=True):
    """The checks every page gets; `verdict_must`: (what, predicate on the
    verdict's text) pairs, or None when the verdict is checked by the
    caller. Returns the measurements."""
    m = b.cdp.eval(MEASURE_JS)
    v = b.cdp.eval(VERDICT_JS)
    if verdict_must is not None:
        fails.check(v is not None, name, "verdict on top", "no element with class verdict or aria-label verdict")
        if v is not None:
            fails.check(v["top"] < HEIGHT, name, "verdict on top",
                        "its top is %.0f px down, below the first %d px" % (v["top"], HEIGHT))
            for what, ok in verdict_must:
                fails.check(ok(v["text"]), name, "verdict names " + what, repr(v["text"][:400]))
            fails.check(v["contrast"] >= 4.5, name, "contrast of the verdict's text",
                        "%.2f < 4.5" % v["contrast"])
    fails.check(m["scrollWidth"] <= m["clientWidth"], name, "no sideways scroll at %d px" % WIDTH,
                "document is %d px wide in a %d px viewport; sticking out: %s"
                % (m["scrollWidth"], m["clientWidth"], "; ".join(m["wide"]) or "?"))
    fails.check(m["mainContrast"] >= 4.5 and m["bodyContrast"] >= 4.5, name, "contrast of the main text",
                "body %.2f, main %.2f (< 4.5)" % (m["bodyContrast"], m["mainContrast"]))
    fails.check(not m["lowContrast"], name, "contrast of every text (WCAG AA)", "; ".join(m["lowContrast"]))
    if focus:
        # Tab from the top of the page: each stop is a link, button or
        # control, and shows that it has the focus.
        b.cdp.eval("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); 1")
        stops = []
        for _ in range(3):
            b.tab()
            f = b.cdp.eval(FOCUS_JS)
            if f is None:
                continue
            stops.append(f)
            fails.check(f["tag"] in ("a", "button", "input", "select", "textarea", "summary", "iframe"),
                        name, "keyboard focus lands on a control", "Tab focused %s" % f)
            fails.check(f["ring"], name, "keyboard focus is visible",
                        "Tab focused <%s> %r (inside: <%s>) and nothing shows it: %s"
                        % (f["tag"], f["text"], f["inner"], f["how"]))
        fails.check(stops, name, "keyboard focus", "three Tabs focused nothing")
        m["focus"] = stops
    m["verdict"] = v
    return m


# ------------------------------------------------------------- the test


def _api(url, token, method, path, body):
    req = urllib.request.Request(url + path, data=body, method=method,
                                 headers={"Authorization": "Bearer " + token})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _upload(url, token, path, body):
    code, text = _api(url, token, "POST", path, body)
    assert code in (200, 201), "%s: HTTP %d %s" % (path, code, text[:500])


def _run(*args):
    p = subprocess.run(whyslow_server_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=120)
    assert p.returncode == 0, "whyslow %s: %s" % (" ".join(args), p.stderr.decode()[-2000:])
    return p.stdout


def _upload_spool(url, token, job, spool):
    """A recorded node agent's spool, as its uploader sends it: each
    profile, collective batch and OS batch once, empty record files not."""
    n = 0
    for i, f in enumerate(sorted(glob.glob(os.path.join(spool, "**", "*"), recursive=True))):
        name = os.path.basename(f)
        if name.endswith(".pb.gz"):
            what = "profiles"
        elif name.endswith(".collectives.jsonl"):
            what = "collectives"
        elif name.endswith(".os.jsonl"):
            what = "os"
        else:
            continue
        with open(f, "rb") as fh:
            body = fh.read()
        if what != "profiles" and not body.strip():
            continue
        host = os.path.relpath(f, spool).split(os.sep)[0]
        stem = name.split(".")[0]
        _upload(url, token, "/api/v1/jobs/%s/%s/%s@%s" % (job, what, host, stem), body)
        n += 1
    assert n > 100, "the spool %s held only %d files" % (spool, n)


@pytest.fixture
def browser_exe():
    exe = find_browser()
    if exe is None:
        if os.environ.get("WHYSLOW_REQUIRE_BROWSER") == "1":
            pytest.fail("WHYSLOW_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium)")
        pytest.skip("no chromium on PATH (apt-get install chromium; WHYSLOW_REQUIRE_BROWSER=1 makes this fail)")
    return exe


def test_ui_pages_put_the_verdict_on_top_in_a_browser(tmp_path, browser_exe):
    t0 = time.monotonic()
    data = str(tmp_path / "data")
    token = _run("server", "token", "create", "--data", data, "--tenant", "demo").decode().strip().splitlines()[-1]
    srv = subprocess.Popen(whyslow_server_cmd("server", "--data", data, "--listen", "127.0.0.1:0"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    b = None
    try:
        line = srv.stderr.readline().decode()
        assert "http://" in line, line
        url = "http://" + line.split("http://")[1].split()[0]
        _drain(srv.stderr)

        # The demo job: the shipped example's four fingerprints (rank 2
        # runs injected_slow_rank_work), as its ranks upload them.
        fps = str(tmp_path / "fps")
        _run("analyze", os.path.join(ROOT, "examples", "data", "slow-rank-cpu-gloo"),
             "--format", "json", "--fingerprints-out", fps)
        for f in sorted(glob.glob(os.path.join(fps, "*.fingerprint.json"))):
            with open(f, "rb") as fh:
                _upload(url, token, "/api/v1/jobs/%s/sessions/s1/fingerprints" % DEMO_JOB, fh.read())
        # The recorded agents' spool: a busy neighbour on rank 2's host.
        _upload_spool(url, token, SPOOL_JOB, os.path.join(FIXTURES, "diagnose", "noisy-neighbour", "agent"))
        # A hang: rank 2 sleeps in Python, its peers wait in a collective.
        hang = _run("hang", os.path.join(FIXTURES, "hang", "sleep"), "--format", "json")
        culprit = json.loads(hang)["culprits"][0]["rank"]
        _upload(url, token, "/api/v1/jobs/%s/hangs/h1" % HANG_JOB, hang)
        # A flow analysis: the testbed's throttled uplink.
        cap = os.path.join(FIXTURES, "flows", "testbed-slow-uplink-150mbit")
        flows = _run("flows", "analyze", "--format", "json", "--topology",
                     os.path.join(cap, "topology.json"), os.path.join(cap, "flows.csv.gz"))
        assert json.loads(flows)["findings"], "the capture's flow analysis has no finding"
        _upload(url, token, "/api/v1/jobs/%s/flows/n0@w1" % FLOWS_JOB, flows)
        t_upload = time.monotonic() - t0

        out = os.path.join(os.environ.get("WHYSLOW_ARTIFACTS") or str(tmp_path), "ui-screens")
        os.makedirs(out, exist_ok=True)
        docs = os.path.join(ROOT, "docs", "screens") if os.environ.get("WHYSLOW_UPDATE_SCREENSHOTS") == "1" else None
        b = Browser(browser_exe, tempfile.mkdtemp(dir=str(tmp_path), prefix="chromium-"))
        b.cdp.call("Network.setCookie", name="whyslow_token", value=token, url=url + "/ui/",
                   path="/ui", httpOnly=True, sameSite="Strict")
        fails = Failures()
        seen = {}

        def visit(name, path, shot, verdict_must, focus=True, docs_too=True):
            b.goto(url + path)
            here = b.cdp.eval("location.pathname")
            assert here == path.split("?")[0], "%s: %s ended on %s (not signed in?)" % (name, path, here)
            seen[name] = check_page(b, fails, name, verdict_must, focus)
            b.cdp.eval("window.scrollTo(0, 0); document.activeElement && document.activeElement.blur(); 1")
            b.screenshot(os.path.join(out, shot))
            if docs and docs_too:
                os.makedirs(docs, exist_ok=True)
                b.screenshot(os.path.join(docs, shot))

        rank2 = lambda t: "rank 2" in t.lower()  # noqa: E731

        # The jobs list before any job page was opened: the demo job's
        # status (the verdict of its latest session) names rank 2.
        def demo_row():
            return b.cdp.eval(r"""(() => {
              const a = document.querySelector('a[href="/ui/jobs/%s"]');
              const tr = a && a.closest('tr');
              if (!tr) return null;
              const r = tr.getBoundingClientRect();
              return {top: r.top, cells: [...tr.cells].map(c => c.innerText)};
            })()""" % DEMO_JOB)

        visit("jobs list", "/ui/", "jobs.png", None)
        row = demo_row()
        fails.check(row is not None, "jobs list", "the demo job's row", "no link to /ui/jobs/%s" % DEMO_JOB)
        if row:
            status = row["cells"][1] if len(row["cells"]) > 1 else ""
            fails.check(row["top"] < HEIGHT, "jobs list", "the demo job's status on top",
                        "its row is %.0f px down" % row["top"])
            fails.check(rank2(status) and "injected_slow_rank_work" in status, "jobs list",
                        "the demo job's status names rank 2 and injected_slow_rank_work", repr(status))

        visit("demo job page", "/ui/jobs/%s" % DEMO_JOB, "job.png",
              [("rank 2", rank2), ("injected_slow_rank_work", lambda t: "injected_slow_rank_work" in t)])
        visit("diagnosis page", "/ui/jobs/%s/diagnosis.html" % SPOOL_JOB, "diagnosis.png",
              [("rank 2", rank2), ("the layer (os)", lambda t: "Layer: os" in t)])
        back = b.cdp.eval("!!document.querySelector('nav a[href=\"/ui/jobs/%s\"]')" % SPOOL_JOB)
        fails.check(back, "diagnosis page", "a link back to its job", "no nav link to /ui/jobs/%s" % SPOOL_JOB)
        # The spool job's own page: the same verdict on top, its flame
        # graphs below (an artifact, not in the docs).
        visit("spool job page", "/ui/jobs/%s" % SPOOL_JOB, "spool-job.png",
              [("rank 2", rank2), ("the layer (os)", lambda t: "layer: os" in t)], docs_too=False)
        visit("hang job page", "/ui/jobs/%s" % HANG_JOB, "hang.png",
              [("a hang", lambda t: "hang" in t.lower()),
               ("the culprit rank %d" % culprit, lambda t: ("rank %d" % culprit) in t.lower())])
        # The throttled link: the testbed shaped leaf0's uplink to the spine.
        visit("flows job page", "/ui/jobs/%s" % FLOWS_JOB, "flows.png",
              [("the throttled link leaf0<->spine", lambda t: "leaf0<->spine" in t)])
        # Once every job page was opened, each job has its status: the
        # list again, as the docs show it.
        visit("jobs list (all judged)", "/ui/", "jobs.png", None, focus=False)
        row = demo_row()
        fails.check(row and rank2(row["cells"][1]), "jobs list (all judged)", "the demo job's status names rank 2",
                    repr(row))

        report = {k: {"verdict": (v["verdict"] or {}).get("text", "")[:300], "focus": v.get("focus"),
                      "scrollWidth": v["scrollWidth"], "clientWidth": v["clientWidth"]}
                  for k, v in seen.items()}
        with open(os.path.join(out, "ui-checks.json"), "w") as f:
            json.dump({"failures": fails.items, "pages": report,
                       "upload_s": round(t_upload, 1), "total_s": round(time.monotonic() - t0, 1)}, f, indent=1)
        assert not fails.items, "the web UI in Chromium (screenshots in %s):\n  " % out + "\n  ".join(fails.items)
    finally:
        if b is not None:
            b.quit()
        srv.terminate()
        srv.wait(timeout=30)
