"""Drives slotgate's console in headless Chromium (Debian's, through Playwright's Python package)
for the tests in tests/tests/console/. One JSON argument says what to do:

  {"url": "http://127.0.0.1:PORT", "chromium": "/usr/bin/chromium", "scenario": "admin" | "read",
   "token": "...", "wrong_token": "...", "forbidden": ["...", ...], "screenshots": DIR | null,
   "running": N, "waiting": M}

The admin scenario signs in, says `ready` on stdout and waits for `go` on stdin (the test then
starts a burst), reads the live view while the burst runs, creates, rotates and revokes a key,
reads the quotas, and downloads the usage CSV. The read scenario signs in with the read-only
token and looks for write controls. The open scenario is a slotgate without an admin token. Both check on every page that no string of `forbidden` (the
tokens, key secrets and their digests) is in the page, its inputs, its storage or its URL, and
that the page ran without a script error or a Content-Security-Policy violation.

Prints one JSON object: what each page showed, for the test to compare with the API.
"""

import json
import sys
import time

from playwright.sync_api import sync_playwright

TOKEN_KEY = "slotgate.admin-token"


class Console:
    def __init__(self, page, cfg):
        self.page = page
        self.cfg = cfg
        self.forbidden = list(cfg["forbidden"])
        self.problems = []
        self.urls = []
        page.on("pageerror", lambda e: self.problems.append(f"script error: {e}"))
        page.on("console", self._console)
        page.on("request", lambda r: self.urls.append(r.url))

    def _console(self, msg):
        # A refused fetch (401, 403) is logged by Chromium as a failed load: the page shows it.
        if msg.type == "error" and "Failed to load resource" not in msg.text:
            self.problems.append(f"console error: {msg.text}")
        if "Content Security Policy" in msg.text:
            self.problems.append(f"CSP: {msg.text}")

    def shot(self, name):
        if self.cfg.get("screenshots"):
            self.page.screenshot(path=f"{self.cfg['screenshots']}/{name}.png", full_page=True)

    def go(self, name):
        self.page.click(f"#nav a[data-page={name}]")
        self.page.wait_for_selector(f"#page-{name}:not([hidden])")

    def no_secret(self, where, allow_token_in_session=True):
        """No forbidden string in the page, its inputs, its storage, its URL or any request's."""
        page = self.page
        seen = {
            "html": page.content(),
            "inputs": json.dumps(page.eval_on_selector_all("input, textarea, select", "els => els.map(e => e.value)")),
            "localStorage": json.dumps(page.evaluate("Object.entries(localStorage)")),
            "url": page.url,
            "requests": json.dumps(self.urls),
            "title": page.title(),
        }
        session = page.evaluate("Object.entries(sessionStorage)")
        assert page.evaluate("localStorage.length") == 0, f"{where}: local storage holds {session}"
        for k, v in session:
            assert k == TOKEN_KEY or not allow_token_in_session, f"{where}: session storage holds {k}"
            if k != TOKEN_KEY:
                seen[f"sessionStorage {k}"] = v
            else:
                # Only the token itself, never a secret beside it.
                for s in self.forbidden:
                    assert s == v or s not in v, f"{where}: session storage holds a secret"
        for what, text in seen.items():
            for s in self.forbidden:
                assert s not in text, f"{where}: a secret ({s[:8]}…) is in the page's {what}"

    def sign_in(self, token):
        page = self.page
        page.fill("#token", token)
        page.click("#login-form button[type=submit]")

    def done(self):
        assert not self.problems, "\n".join(self.problems)


def rows(page, selector):
    return page.eval_on_selector_all(
        f"{selector} tbody tr:not(.empty)",
        "trs => trs.map(tr => [...tr.cells].map(td => td.innerText.trim()))",
    )


def wait_rows(page, selector, n, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while True:
        got = rows(page, selector)
        if len(got) >= n:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{selector}: {len(got)} rows, not {n}, after {timeout_s}s: {got}")
        page.wait_for_timeout(100)


def login_page(c, cfg):
    page = c.page
    page.goto(cfg["url"] + "/")
    assert page.url.endswith("/console/"), f"/ did not lead to the console: {page.url}"
    page.wait_for_selector("#login:not([hidden])")
    assert not page.is_visible("#nav"), "the pages' links show before signing in"
    c.shot("login")
    c.sign_in(cfg["wrong_token"])
    page.wait_for_selector("#login-error:not([hidden])")
    wrong = page.inner_text("#login-error")
    assert page.input_value("#token") == "", "the token field kept what was typed"
    c.sign_in(cfg["token"])
    page.wait_for_selector("#nav:not([hidden])")
    assert page.input_value("#token") == "", "the token field kept the token"
    return wrong


def admin(c, cfg):
    page = c.page
    out = {"wrong_token_message": login_page(c, cfg), "who": page.inner_text("#who")}
    c.no_secret("live, signed in")

    # The burst: the test starts it, then the view must show who runs and who waits.
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    running = wait_rows(page, "#running", cfg["running"])
    waiting = wait_rows(page, "#waiting", cfg["waiting"])
    c.shot("live")
    out["live"] = {"running": running, "waiting": waiting, "headers": page.eval_on_selector_all(
        "#waiting thead th", "ths => ths.map(th => th.innerText.trim())")}
    c.no_secret("live")
    # The burst ends before the ledger is read: the CSV then holds all of it.
    page.wait_for_selector("#running tbody tr.empty", timeout=60000)
    page.wait_for_selector("#waiting tbody tr.empty")

    # Keys: a refused creation is shown, then one made, rotated and revoked.
    c.go("keys")
    page.wait_for_selector("#keys")
    page.fill("#new-tenant", "anonymous")
    page.click("#create-key button[type=submit]")
    page.wait_for_selector("#keys-status.error")
    out["create_error"] = page.inner_text("#keys-status")
    page.fill("#new-tenant", "dave")
    page.fill("#new-team", "research")
    page.click("#create-key button[type=submit]")
    page.wait_for_selector("#secret-box")
    secret = page.inner_text("#secret")
    key_id = page.get_attribute("#keys tbody tr[data-key]:has-text('dave')", "data-key")
    page.click("#dismiss-secret")
    page.wait_for_selector("#secret-box", state="detached")
    c.forbidden.append(secret)
    c.no_secret("keys, after the secret was dismissed")

    # Rotated with an hour's grace for the old secret, as chosen on the page.
    page.select_option("#rotate-grace", "1h")
    page.click(f"button.act-rotate[data-key='{key_id}']")
    page.click(f"button.act-rotate[data-key='{key_id}']")
    page.wait_for_selector("#secret-box")
    rotated = page.inner_text("#secret")
    page.wait_for_selector("#keys-status:has-text('rotated')")
    out["rotate_status"] = page.inner_text("#keys-status")
    assert rotated != secret
    # Away and back, then a reload: the box is gone without being dismissed.
    c.go("live")
    c.forbidden.append(rotated)
    c.no_secret("live, after leaving a shown secret")
    c.go("keys")
    page.wait_for_selector("#keys")
    page.reload()
    page.wait_for_selector("#keys")
    assert page.query_selector("#secret-box") is None, "the secret is shown again after a reload"
    c.no_secret("keys, after a reload")

    page.click(f"button.act-revoke[data-key='{key_id}']")
    page.click(f"button.act-revoke[data-key='{key_id}']")
    page.wait_for_selector(f"#keys tr[data-key='{key_id}'][data-state=revoked]")
    out["keys_status"] = page.inner_text("#keys-status")
    out["keys"] = rows(page, "#keys")
    c.shot("keys")
    c.no_secret("keys")
    out["key"] = {"id": key_id, "secret": secret, "rotated": rotated}

    c.go("quotas")
    page.wait_for_selector("#quotas-tenant")
    out["quotas"] = {
        scope: rows(page, f"#quotas-{scope}") for scope in ("tenant", "team", "key", "other")
        if page.query_selector(f"#quotas-{scope}")
    }
    c.shot("quotas")
    c.no_secret("quotas")

    c.go("usage")
    page.wait_for_selector("#usage-chart canvas")
    page.wait_for_selector("#usage-rows")
    out["usage"] = {"rows": rows(page, "#usage-rows"), "tenants": rows(page, "#usage-tenants"),
                    "legend": page.eval_on_selector_all(".u-legend .u-label", "ls => ls.map(l => l.innerText)")}
    with page.expect_download() as dl:
        page.click("#usage-csv")
    path = dl.value.path()
    with open(path, encoding="utf-8") as f:
        out["usage"]["csv"] = f.read()
    out["usage"]["csv_name"] = dl.value.suggested_filename
    page.wait_for_selector("#usage-csv-status:has-text('rows saved')")
    c.shot("usage")
    c.no_secret("usage")
    return out


def read_only(c, cfg):
    page = c.page
    out = {"wrong_token_message": login_page(c, cfg), "who": page.inner_text("#who")}
    page.wait_for_selector("#running")
    c.no_secret("live")
    c.go("keys")
    page.wait_for_selector("#keys-read-only")
    out["keys_notice"] = page.inner_text("#keys-read-only")
    out["write_controls"] = page.eval_on_selector_all(
        "#create-key, button.act-rotate, button.act-revoke, #keys", "els => els.map(e => e.id || e.className)")
    c.shot("keys-read-only")
    c.no_secret("keys")
    # The API refuses a change anyway, whatever a page would send.
    out["post_keys_status"] = page.evaluate(
        """async () => (await fetch('/keys', {method: 'POST', headers: {
             'Authorization': 'Bearer ' + sessionStorage.getItem('slotgate.admin-token'),
             'Content-Type': 'application/json'}, body: JSON.stringify({tenant: 'mallory'})})).status""")
    c.go("quotas")
    page.wait_for_selector("#page-quotas h1")
    c.no_secret("quotas")
    c.go("usage")
    page.wait_for_selector("#usage-rows")
    with page.expect_download() as dl:
        page.click("#usage-csv")
    out["csv_lines"] = len(open(dl.value.path(), encoding="utf-8").read().strip().splitlines())
    c.no_secret("usage")
    page.click("#logout")
    page.wait_for_selector("#login:not([hidden])")
    out["after_logout_session"] = page.evaluate("Object.keys(sessionStorage)")
    c.no_secret("signed out")
    return out


def open_listener(c, cfg):
    """No admin token configured: no form, every page, a warning saying so."""
    page = c.page
    page.goto(cfg["url"] + "/")
    page.wait_for_selector("#nav:not([hidden])")
    assert not page.is_visible("#login"), "a sign-in form where no token is configured"
    out = {"who": page.inner_text("#who")}
    page.wait_for_selector("#running")
    c.go("keys")
    page.wait_for_selector("#create-key")
    out["keys"] = rows(page, "#keys")
    c.no_secret("keys")
    return out


def main():
    cfg = json.loads(sys.argv[1])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=cfg["chromium"], headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(20000)
        c = Console(page, cfg)
        out = {"admin": admin, "read": read_only, "open": open_listener}[cfg["scenario"]](c, cfg)
        c.done()
        out["requests"] = len(c.urls)
        browser.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
