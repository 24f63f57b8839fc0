// Drives the monitor's dashboard in Debian's headless Chromium for tests/dashboard.rs.
// Usage: node dashboard.mjs URL SCREENSHOT_PATH
// Prints "LOADED <daemons shown>", "IMAGE <size> <used> <ops/s> <image chart legend...>"
// for the image default/dash (or "NO_IMAGE <why>"), then waits for a line on stdin (the test stopped
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
  // The image served by the test's NBD server: its row with a used size and a rate, and
  // its line on the image charts.
  try {
    await page.waitForFunction(() => {
      const row = document.querySelector('tr[data-image="default/dash"]');
      const legend = document.getElementById("legend-img-iops")?.textContent ?? "";
      return row && row.querySelector("td[data-used]").getAttribute("data-used") !== "" &&
        Number(row.children[4].textContent) > 0 && legend.includes("default/dash");
    }, null, { timeout: 20000 });
    const row = await page.$('tr[data-image="default/dash"]');
    const size = await row.$eval("td[data-size]", (e) => e.getAttribute("data-size"));
    const used = await row.$eval("td[data-used]", (e) => e.getAttribute("data-used"));
    const ops = await row.$eval("td:nth-child(5)", (e) => e.textContent);
    const legend = await page.$$eval("#legend-img-iops span", (s) => s.map((e) => e.textContent));
    console.log(["IMAGE", size, used, ops, ...legend].join(" "));
  } catch (e) {
    console.log("NO_IMAGE " + e);
  }
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
