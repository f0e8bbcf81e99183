"""The dashboard (`/ui`) in a real headless browser against real daemons.

Usage: python tests/ui/run.py PATH_TO_AGENTMESH_BINARY ARTIFACT_DIR

Starts three daemons on loopback (B and C joined to A by a bootstrap address, as tests/sdk/run.py
does), registers agents on each (one through the AgentField endpoints on B), opens A's `/ui` in
headless Chromium (Debian's `chromium` and `chromium-driver`, driven by selenium) and checks what an
operator sees: the page, the agent registered on the other node, a health change followed live
without a reload, a filter, a search, an agent's page, the peers with their gossip mesh membership,
and no error in the browser console (a Content-Security-Policy violation is one). Heartbeat
thresholds are set long, so the only health change is the one the test reports; heartbeats every
300 ms carry it across quickly.

Every wait has a deadline. Screenshots go to ARTIFACT_DIR. Prints `N passed, N failed` last and
exits non-zero on any failure.
"""

import base64
import json
import os
import shutil
import sys
import time
import traceback
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from daemons import Daemon, wait_for  # noqa: E402 - the shared driver lives one folder up

UI_DEADLINE_S = 15
DAEMON_FLAGS = ["--heartbeat-interval", "300ms", "--degraded-after", "120s",
                "--inactive-after", "240s", "--evict-after", "600s"]


def request(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def capability(cid, description, tags, properties, required, output=None):
    cap = {"id": cid, "description": description, "tags": tags,
           "input_schema": {"type": "object", "properties": properties, "required": required}}
    if output:
        cap["output_schema"] = {"type": "object", "properties": output}
    return cap


def native_card(agent_id, name, description, port, tags, reasoners, skills):
    return {"agent_id": agent_id, "name": name, "description": description, "version": "1.2.0",
            "base_url": f"http://127.0.0.1:{port}", "tags": tags, "reasoners": reasoners, "skills": skills}


WEATHER = {
    "id": "weather-agent", "base_url": "http://127.0.0.1:8101", "version": "2.3.0",
    "description": "Forecasts and current conditions for any city.", "tags": ["weather"],
    "reasoners": [capability(
        "forecast", "Forecasts rain, wind and temperature for a city over the next days.", ["weather", "forecast"],
        {"city": {"type": "string", "description": "City name"},
         "days": {"type": "integer", "description": "Days ahead", "default": 3, "maximum": 10}},
        ["city"], {"summary": {"type": "string"}, "rain_mm": {"type": "number"}})],
    "skills": [capability("current_conditions", "Reads the current weather at a station.", ["weather"],
                          {"station": {"type": "string"}}, ["station"])],
}

OTHERS = {
    "a": [native_card("summarizer", "Summarizer", "Condenses long documents.", 8102, ["text"],
                      [capability("summarize", "Summarises a document into a few paragraphs.", ["text", "nlp"],
                                  {"text": {"type": "string"}, "words": {"type": "integer"}}, ["text"],
                                  {"summary": {"type": "string"}})],
                      [capability("extract_keywords", "Lists the key phrases of a text.", ["text"],
                                  {"text": {"type": "string"}}, ["text"])])],
    "c": [native_card("translator", "Translator", "Translates between 40 languages.", 8103, ["text", "language"],
                      [capability("translate", "Translates text into a target language.", ["language", "nlp"],
                                  {"text": {"type": "string"}, "target_language": {"type": "string"}},
                                  ["text", "target_language"], {"translation": {"type": "string"}})],
                      [capability("detect_language", "Tells which language a text is in.", ["language"],
                                  {"text": {"type": "string"}}, ["text"])]),
          native_card("code-reviewer", "Code reviewer", "Reviews diffs and runs linters.", 8104, ["code"],
                      [capability("review_diff", "Reviews a unified diff and comments on risks.", ["code", "review"],
                                  {"diff": {"type": "string"}}, ["diff"], {"comments": {"type": "array"}})],
                      [capability("lint", "Runs the linters of a repository.", ["code"],
                                  {"path": {"type": "string"}}, ["path"])])],
}


class Run:
    def __init__(self, artifacts):
        self.driver = None
        self.artifacts = artifacts
        self.passed = 0
        self.failed = 0

    def check(self, name, fn):
        print(f"-- {name}", flush=True)
        try:
            fn()
            self.passed += 1
            print("   ok", flush=True)
        except Exception:  # noqa: BLE001 - every failure is reported and counted
            self.failed += 1
            traceback.print_exc()
            try:
                self.shot(f"failed-{name.replace(' ', '-')}")
            except Exception as e:  # noqa: BLE001 - a browser that cannot take it still lets the next checks run
                print(f"   (no screenshot: {e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            print(f"   FAILED: {name}", flush=True)

    def shot(self, name):
        """The whole page, as tall as its content (Chromium's own capture, past the window if need be)."""
        if self.driver is None:
            return None
        path = os.path.join(self.artifacts, f"{name}.png")
        width, height = self.driver.execute_script(
            "const r = document.body.getBoundingClientRect();"
            "return [document.documentElement.clientWidth, Math.ceil(r.height)];")
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}})
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        return path

    def wait(self, what, condition, deadline_s=UI_DEADLINE_S):
        return WebDriverWait(self.driver, deadline_s, poll_frequency=0.1,
                             ignored_exceptions=[NoSuchElementException, StaleElementReferenceException]).until(
            lambda d: condition(d), message=f"timed out waiting for {what}")


def listed(driver, table="agents"):
    """The agent ids of a table's rows, read in one step (the page may re-render between two)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((tr) => tr.dataset.agent);",
        f"#{table} tbody tr")


def row_health(driver, agent_id):
    return driver.execute_script(
        "const tr = document.querySelector(`#agents tbody tr[data-agent='${arguments[0]}']`);"
        "return tr ? tr.querySelector('.badge').textContent : null;", agent_id)


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1440,1040", "--lang=en-US"]:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(UI_DEADLINE_S)
    return driver


def main(binary, artifacts):
    os.makedirs(artifacts, exist_ok=True)
    research = os.path.join(ROOT, "config", "cards", "research-agent.json")
    a = Daemon(binary, "a", DAEMON_FLAGS, cards=[research])
    daemons = [a]
    run = Run(artifacts)
    try:
        b = Daemon(binary, "b", DAEMON_FLAGS, bootstrap=a.dial_addr())
        daemons.append(b)
        c = Daemon(binary, "c", DAEMON_FLAGS, bootstrap=a.dial_addr())
        daemons.append(c)
        for node, cards in [(a, OTHERS["a"]), (c, OTHERS["c"])]:
            for card in cards:
                request("POST", f"{node.api}/api/v1/agents", card)
        request("POST", f"{b.api}/api/v1/nodes/register", WEATHER)
        wait_for("every agent on A", lambda: request("GET", f"{a.api}/api/v1/agents")["total"] == 5)

        run.driver = browser()
        run.check("the page loads", lambda: page_loads(run, a))
        run.check("it shows the agent registered on the other node", lambda: remote_agent(run, b))
        run.check("it follows a health change live, without a reload", lambda: live_health(run, b))
        run.check("a busy agent shows it, and the lifecycle filter finds it", lambda: lifecycle(run, b))
        run.check("a filter narrows the list", lambda: filter_narrows(run))
        run.check("search finds a capability", lambda: search(run))
        run.check("an agent's page shows its card, schemas and A2A card", lambda: agent_page(run))
        run.check("the peers show their gossip mesh membership", lambda: peers(run, b, c))
        run.check("heartbeat ages stay fresh while the page stays open", lambda: fresh_ages(run))
        run.check("the browser console has no error", lambda: console_clean(run))
    except Exception:  # noqa: BLE001 - a failed set-up counts too
        traceback.print_exc()
        run.failed += 1
    finally:
        if run.driver is not None:
            run.driver.quit()
        for d in daemons:
            d.stop()
    if run.failed:
        print(f"daemon logs: {', '.join(d.dir for d in daemons)}")
    else:
        for d in daemons:
            shutil.rmtree(d.dir, ignore_errors=True)
    print(f"{run.passed} passed, {run.failed} failed")
    return 1 if run.failed else 0


def page_loads(run, a):
    run.driver.get(f"{a.api}/ui")
    assert run.driver.title == "agentmesh", run.driver.title
    run.wait("the watch stream", lambda d: d.find_element(By.ID, "live").get_attribute("data-state") == "live")
    run.wait("this node's PeerId", lambda d: d.find_element(By.ID, "node").get_attribute("data-peer") == a.peer_id)
    run.wait("the agents", lambda d: len(listed(d)) == 5)
    # A marker that a reload would wipe, checked after the live change.
    run.driver.execute_script("window.__agentmeshTest = 'same page';")


def remote_agent(run, b):
    run.wait("weather-agent", lambda d: row_health(d, "weather-agent") == "active")
    publisher, text = run.driver.execute_script(
        "const tr = document.querySelector(\"#agents tbody tr[data-agent='weather-agent']\");"
        "return [tr.dataset.publisher, tr.innerText];")
    assert publisher == b.peer_id, publisher
    assert "this node" not in text, text
    assert "1 reasoner, 1 skill" in text and "forecast, current_conditions" in text, text
    run.shot("dashboard")


def live_health(run, b):
    request("POST", f"{b.api}/api/v1/nodes/weather-agent/heartbeat", {"status": "degraded"})
    run.wait("weather-agent degraded", lambda d: row_health(d, "weather-agent") == "degraded")
    run.wait("the change in the live list", lambda d: d.find_elements(
        By.CSS_SELECTOR, "#changes li[data-kind='health_changed'][data-agent='weather-agent']"))
    run.wait("the degraded count", lambda d: d.find_element(By.CSS_SELECTOR, "[data-tile='degraded'] .value").text == "1")
    assert run.driver.execute_script("return window.__agentmeshTest") == "same page", "the page was reloaded"
    run.shot("live-degraded")
    request("POST", f"{b.api}/api/v1/nodes/weather-agent/heartbeat", {"status": "ready"})
    run.wait("weather-agent active again", lambda d: row_health(d, "weather-agent") == "active")
    assert run.driver.execute_script("return window.__agentmeshTest") == "same page", "the page was reloaded"


def lifecycle(run, b):
    shown = ("const t = document.querySelector(\"#agents tbody tr[data-agent='weather-agent'] .lifecycle\");"
             "return t ? t.dataset.lifecycle : 'ready';")
    request("POST", f"{b.api}/api/v1/nodes/weather-agent/heartbeat", {"status": "busy"})
    run.wait("weather-agent busy in its row", lambda d: d.execute_script(shown) == "busy")
    form = run.driver.find_element(By.ID, "filters")
    form.find_element(By.CSS_SELECTOR, "select[name='lifecycle'] option[value='busy']").click()
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    run.wait("only the busy agent", lambda d: listed(d) == ["weather-agent"])
    assert "lifecycle=busy" in run.driver.current_url, run.driver.current_url
    run.shot("lifecycle-busy")
    request("POST", f"{b.api}/api/v1/nodes/weather-agent/heartbeat", {"status": "ready"})
    home(run)
    run.wait("every agent again", lambda d: len(listed(d)) == 5)
    run.wait("weather-agent ready again", lambda d: d.execute_script(shown) == "ready")


def home(run):
    """Back to the unfiltered list the way a person goes there: the brand link (`#/`). A WebDriver
    navigation to a URL that differs only in its fragment can leave ChromeDriver waiting on a load
    that never comes, and its next command then times out in the renderer."""
    run.driver.find_element(By.CSS_SELECTOR, "header a.brand").click()
    run.wait("the list route", lambda d: d.execute_script("return location.hash") in ("#/", ""))


def submit_filters(run, **values):
    form = run.driver.find_element(By.ID, "filters")
    for name in ["q", "reasoner", "skill", "tags"]:
        field = form.find_element(By.NAME, name)
        field.clear()
        if values.get(name):
            field.send_keys(values[name])
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def filter_narrows(run):
    assert len(listed(run.driver)) == 5
    submit_filters(run, tags="weather")
    run.wait("only weather-agent", lambda d: listed(d) == ["weather-agent"])
    summary = run.driver.find_element(By.ID, "summary").text
    assert summary.startswith("1–1 of 1 agent ·"), summary
    assert "tags=weather" in run.driver.current_url, run.driver.current_url
    submit_filters(run, tags="nlp,code")
    run.wait("the agents with a capability tagged nlp or code",
             lambda d: listed(d) == ["code-reviewer", "summarizer", "translator"])
    run.shot("filtered")


def search(run):
    submit_filters(run, q="will it rain tomorrow")
    run.wait("search results", lambda d: listed(d, "results"))
    assert listed(run.driver, "results")[0] == "weather-agent", listed(run.driver, "results")
    first = run.driver.execute_script("return document.querySelector('#results tbody tr').innerText;")
    assert "forecast" in first, first
    run.shot("search")


def agent_page(run):
    home(run)
    run.wait("the list", lambda d: len(listed(d)) == 5)
    run.driver.find_element(By.LINK_TEXT, "weather-agent").click()
    run.wait("weather-agent's page", lambda d: d.find_elements(By.CSS_SELECTOR, "#agent[data-agent='weather-agent']"))
    page = run.driver.find_element(By.ID, "main")
    params = page.find_element(By.CSS_SELECTOR, "[data-capability='forecast'] table[data-schema='input']")
    assert "city" in params.text and "days" in params.text, params.text
    output = page.find_element(By.CSS_SELECTOR, "[data-capability='forecast'] table[data-schema='output']")
    assert "rain_mm" in output.text, output.text
    run.shot("agent")
    a2a = page.find_element(By.ID, "a2a-card")
    a2a.find_element(By.TAG_NAME, "summary").click()
    body = a2a.find_element(By.TAG_NAME, "pre").text
    assert '"signatures"' in body and '"forecast"' in body, body[:300]


def peers(run, b, c):
    home(run)

    def both_in_mesh(d):
        for peer in (b.peer_id, c.peer_id):
            cells = d.find_elements(By.CSS_SELECTOR, f"#peer-table tr[data-peer='{peer}'] .topic.in")
            if len(cells) != 2:
                return False
        return all(d.find_elements(By.CSS_SELECTOR, f"#topology g.peer.mesh-all[data-peer='{p}']")
                   for p in (b.peer_id, c.peer_id))

    run.wait("both peers in the gossip mesh of both topics", both_in_mesh, deadline_s=30)
    text = run.driver.find_element(By.ID, "peer-table").text
    assert "127.0.0.1" in text and " ms" in text, text


def fresh_ages(run):
    """The agents that heartbeat (all but weather-agent, whose heartbeats the test sends) show a recent
    heartbeat long after the page read them: the page keeps reading their times."""
    opened = time.monotonic()

    def ages(d):
        texts = d.execute_script(
            "return [...document.querySelectorAll('#agents tbody tr')]"
            ".filter((tr) => tr.dataset.agent !== 'weather-agent')"
            ".map((tr) => tr.querySelector('.age').textContent);")
        return [0 if t == "just now" else int(t.split()[0]) if t.endswith(" s ago") else 999 for t in texts]

    run.wait("recent heartbeat ages 8 s after the page read them",
             lambda d: time.monotonic() - opened >= 8 and len(ages(d)) == 4 and max(ages(d)) <= 3)


def console_clean(run):
    errors = [e for e in run.driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
