// Drives the monitor's dashboard in Debian's headless Chromium for tests/dashboard.rs.
// Usage: node dashboard.mjs URL SCREENSHOT_PATH
// Prints "LOADED <daemons shown>", then waits for a line on stdin (the test stopped
// osd.2), waits up to 10 s for the page to show osd.2 down, prints "SEEN <ms>" (or
// "NOT_SEEN"), saves a screenshot and prints "PROBLEMS <json>": console errors, page
// errors, failed requests and HTTP errors the page met, then exits.
import { chromium } from "playwright-core";
import readline from "node:readline";

const [url, shot] = process.argv.slice(2);
const problems = [];
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on("console", (m) => { if (m.type() === "error") problems.push("console: " + m.text()); });
  page.on("pageerror", (e) => problems.push("page error: " + e));
  page.on("requestfailed", (r) => problems.push("request failed: " + r.url() + " " + (r.failure()?.errorText ?? "")));
  page.on("response", (r) => { if (r.status() >= 400) problems.push("HTTP " + r.status() + ": " + r.url()); });
  await page.goto(url, { waitUntil: "load" });
  await page.waitForFunction(() => document.getElementById("osd-count")?.textContent !== "", null, { timeout: 15000 });
  console.log("LOADED " + (await page.textContent("#osd-count")));
  const lines = readline.createInterface({ input: process.stdin });
  await new Promise((resolve) => lines.once("line", resolve));
  const start = Date.now();
  try {
    await page.waitForSelector('tr[data-osd="2"][data-up="false"]', { timeout: 10000 });
    console.log("SEEN " + (Date.now() - start));
  } catch {
    console.log("NOT_SEEN");
  }
  console.log("HEALTH " + (await page.textContent("#health")));
  await page.screenshot({ path: shot, fullPage: true });
  console.log("PROBLEMS " + JSON.stringify(problems));
  lines.close();
} finally {
  await browser.close();
}
