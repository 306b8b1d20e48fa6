// The status page of tollgate-proxy's live view in Debian's Chromium, driven by playwright-core
// (no browser download: CHROMIUM names the executable). Run by proxy/tests/proxy/admin.rs:
//
//   CHROMIUM=/usr/bin/chromium ADMIN_URL=http://127.0.0.1:PORT/admin/ SCREENSHOT=out.png \
//     NODE_PATH=DIR/node/node_modules node status_page.js
//
// 1. Opens the page and waits for its first reading; prints {"stage": "loaded", ...}: the
//    status and every card the page shows (key, counts and window levels as displayed).
// 2. Reads one JSON line from standard input: {"expect": [{"key", "count", "text"}, ...]}, waits
//    (up to 15 s) until the page shows each count, lets the bars finish moving, takes a
//    screenshot, and prints {"stage": "updated", "matched": true|false, ...}.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const readline = require("readline");
const { chromium } = require("playwright-core");

const FLAGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

function report(stage) {
  process.stdout.write(JSON.stringify(stage) + "\n");
}

// What the page shows, read from its elements as a person reads them.
async function shown(page) {
  return page.evaluate(() => {
    const cards = [...document.querySelectorAll("article.key")].map((card) => {
      const counts = {};
      for (const dd of card.querySelectorAll("dd[data-count]")) counts[dd.dataset.count] = dd.textContent;
      const levels = {};
      const windows = [];
      for (const row of card.querySelectorAll(".window")) {
        windows.push(row.dataset.currency);
        levels[row.dataset.currency] = row.querySelector(".level .value").textContent;
      }
      return { key: card.dataset.key, counts, levels, windows };
    });
    return { status: document.getElementById("status").textContent, cards };
  });
}

async function main() {
  const userData = fs.mkdtempSync(path.join(os.tmpdir(), "tollgate-chromium-"));
  const context = await chromium.launchPersistentContext(userData, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: FLAGS,
    viewport: { width: 1280, height: 900 },
    deviceScaleFactor: 1,
  });
  try {
    const page = context.pages()[0] || (await context.newPage());
    const errors = [];
    page.on("pageerror", (err) => errors.push(String(err)));
    page.on("console", (msg) => { if (msg.type() === "error") errors.push(msg.text()); });
    await page.goto(process.env.ADMIN_URL, { waitUntil: "load" });
    await page.waitForFunction(
      () => document.getElementById("status").textContent === "live" && document.querySelector("article.key"),
      null,
      { timeout: 15000 },
    );
    report({ stage: "loaded", errors, ...(await shown(page)) });

    const lines = readline.createInterface({ input: process.stdin });
    const line = await new Promise((resolve) => lines.once("line", resolve));
    lines.close();
    const { expect } = JSON.parse(line);
    let matched = true;
    try {
      await page.waitForFunction(
        (expect) => expect.every(({ key, count, text }) => {
          const card = [...document.querySelectorAll("article.key")].find((c) => c.dataset.key === key);
          const dd = card && card.querySelector(`dd[data-count="${count}"]`);
          return dd && dd.textContent === text;
        }),
        expect,
        { timeout: 15000 },
      );
    } catch (err) {
      matched = false;
    }
    // The bars move over 0.9 s after each reading.
    await page.waitForTimeout(1500);
    await page.screenshot({ path: process.env.SCREENSHOT, fullPage: true });
    report({ stage: "updated", matched, errors, ...(await shown(page)) });
  } finally {
    await context.close();
    fs.rmSync(userData, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
