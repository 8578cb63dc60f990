// chat_page.mjs — the chat page (GET /) in a real browser: Debian's headless Chromium driven
// by playwright-core types a message, sends it, and sees the streamed answer arrive in pieces
// (the text grows while the request runs), then a second turn that is served from the prompt
// cache (the stats line shows cached tokens). Usage: node chat_page.mjs BASE_URL
import { chromium } from "playwright-core";

const base = process.argv[2];
const fail = (msg) => { console.error("FAIL: " + msg); process.exit(1); };
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  // playwright gives the browser a new empty profile directory of its own
});
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(base + "/", { timeout: 30000 });
  await page.waitForFunction(() => document.getElementById("model").textContent !== "…",
                             null, { timeout: 30000 });
  await page.fill("#maxtok", "48");
  await page.fill("#temp", "0");
  await page.fill("#input", "Hello from the browser");
  // record every length the answer bubble shows while it streams: a MutationObserver sees each
  // update as it is made (sampling once a frame missed them when a loaded machine throttled the
  // headless browser's frames: the whole answer landed between two), installed before the send
  await page.evaluate(() => {
    window.__seen = [];
    const record = () => {
      const b = document.querySelector(".msg.assistant, .msg.error");
      if (!b)
        return;
      const n = b.textContent.length, seen = window.__seen;
      if (!seen.length || seen[seen.length - 1] !== n) seen.push(n);
    };
    new MutationObserver(record).observe(document.getElementById("log"),
                                         { childList: true, subtree: true, characterData: true });
  });
  await page.press("#input", "Enter");
  await page.waitForFunction(() => {
    const b = document.querySelector(".msg.assistant, .msg.error");
    return b && b.dataset.state === "done";
  }, null, { timeout: 60000 });
  const failed = await page.$(".msg.error");
  if (failed) fail("the answer: " + await failed.textContent());
  const lengths = await page.evaluate(() => window.__seen);
  const answer = await page.textContent(".msg.assistant");
  if (!answer.length) fail("empty answer");
  if (lengths.filter((n) => n > 0).length < 2) fail("the answer did not stream: " + lengths);
  const user = await page.textContent(".msg.user");
  if (user !== "Hello from the browser") fail("user bubble: " + user);
  // second turn: the page sends the whole conversation; the server reuses the first turn
  await page.fill("#input", "Tell me more");
  await page.press("#input", "Enter");
  await page.waitForFunction(() => document.querySelectorAll(".stats").length === 2, null,
                             { timeout: 60000 });
  const stats = await page.$$eval(".stats", (s) => s.map((x) => x.textContent));
  const cached = Number((stats[1].match(/\((\d+) cached\)/) || [])[1]);
  if (!(cached > 0)) fail("second turn was not served from the cache: " + stats[1]);
  if (errors.length) fail("page errors: " + errors.join("; "));
  console.log("chat_page: ok (" + lengths.length + " updates; " + stats[1] + ")");
} finally {
  await browser.close();
}
