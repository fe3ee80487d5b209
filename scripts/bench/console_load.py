"""The console's load time in headless Chromium, for scripts/bench/console.sh: URL CHROMIUM TOKEN
ROUNDS. Cold: a new context (empty cache), signed in through session storage set before the page
runs, timed from navigation to the live view drawn from /live. Warm: a reload of the same page,
every file revalidated (304). Baselines, in the same rounds: a new context opening /livez (plain
text: what the browser itself costs), and one GET /status from the page (one round trip)."""

import statistics
import sys

from playwright.sync_api import sync_playwright

url, chromium, token, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
DRAWN = "#running"


def ms(xs):
    return f"{statistics.median(xs):7.1f} ms (min {min(xs):.1f}, max {max(xs):.1f})"


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
    cold, warm, status, usage, transferred, blank = [], [], [], [], [], []
    for _ in range(rounds):
        # Baseline: a new context opening a page of plain text (/livez) on the same listener.
        context = browser.new_context()
        page = context.new_page()
        page.goto(url + "/livez", wait_until="load")
        blank.append(page.evaluate("performance.now()"))
        context.close()

        context = browser.new_context()
        context.add_init_script(f"sessionStorage.setItem('slotgate.admin-token', {token!r})")
        page = context.new_page()
        sizes = []
        page.on("response", lambda r: sizes.append(r))
        page.goto(url + "/console/", wait_until="commit")
        page.wait_for_selector(DRAWN)
        cold.append(page.evaluate("performance.now()"))
        transferred.append(sum(int(r.headers.get("content-length", 0)) for r in sizes if "/console/" in r.url))
        page.reload(wait_until="commit")
        page.wait_for_selector(DRAWN)
        warm.append(page.evaluate("performance.now()"))
        status.append(page.evaluate(
            """async (t) => { const s = performance.now();
                 await (await fetch('/status', {headers: {Authorization: 'Bearer ' + t}})).json();
                 return performance.now() - s; }""", token))
        # The chart library as the usage page loads it (a script element), on a cold cache.
        usage.append(page.evaluate(
            """() => new Promise((ok, fail) => { const s = performance.now();
                 const el = document.createElement('script');
                 el.src = 'vendor/uplot/uPlot.iife.min.js';
                 el.onload = () => ok(performance.now() - s); el.onerror = fail;
                 document.head.append(el); })"""))
        context.close()
    browser.close()

print(f"  live view drawn, cold (new context)   {ms(cold)}")
print(f"  live view drawn, warm (reload, 304s)  {ms(warm)}")
print(f"  + the chart library (usage page)      {ms(usage)}")
print(f"  baseline: one GET /status             {ms(status)}")
print(f"  baseline: a new context opening /livez {ms(blank)}")
print(f"  cold - /livez baseline                 {statistics.median(cold) - statistics.median(blank):7.1f} ms")
print(f"  cold / /livez baseline                 {statistics.median(cold) / statistics.median(blank):7.1f}x")
print(f"  console bytes on the cold load        {statistics.median(transferred):7.0f}")
