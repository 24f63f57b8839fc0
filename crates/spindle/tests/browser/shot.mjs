// Saves a screenshot of a dashboard after it has polled for a while (for docs/).
// Usage: node shot.mjs URL PATH SECONDS
import { chromium } from "playwright-core";
const [url, path, seconds] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
await page.goto(url);
await page.waitForTimeout(Number(seconds) * 1000);
await page.screenshot({ path, fullPage: true });
await browser.close();
