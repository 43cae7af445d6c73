// The chat page in a real headless browser (Debian's chromium, driven by playwright-core),
// against a running `ferrox serve` whose API key is given:
//
//   node tests/browser.mjs URL API_KEY
//
// Checks: the page loads from the server and names the model; a message streams a reply;
// the conversation survives a reload; Stop interrupts a long reply; a server error (a wrong
// key) shows as an error. Prints one JSON line; exits 1 with the reason on failure.
import { chromium } from "playwright-core";

const [url, key] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";

function fail(reason) {
  console.log(JSON.stringify({ ok: false, reason }));
  process.exit(1);
}

const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage();
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  const response = await page.goto(url);
  if (response?.status() !== 200) fail(`GET / answered ${response?.status()}`);
  if (!(await page.title()).includes("Ferrox")) fail(`title: ${await page.title()}`);

  // The key goes into the settings; the model's name then shows.
  await page.click("#toggle-settings");
  await page.fill("#api-key", key);
  await page.locator("#api-key").dispatchEvent("change");
  await page.fill("#temperature", "0");
  await page.locator("#temperature").dispatchEvent("change");
  await page.fill("#max-tokens", "24");
  await page.locator("#max-tokens").dispatchEvent("change");
  await page.waitForFunction(() => document.querySelector("#model")?.textContent?.endsWith(".gguf"), null, {
    timeout: 10000,
  }).catch(() => fail(`model name not shown: ${page.locator("#model").textContent()}`));
  const model = await page.textContent("#model");

  // A message streams a reply: the Stop button shows while it streams, the reply fills in.
  await page.fill("#input", "Tell me about the sea.");
  await page.click("#send");
  await page.waitForSelector(".message.user");
  await page.waitForFunction(() => document.body.dataset.state === "idle", null, { timeout: 60000 });
  const reply = (await page.textContent(".message.assistant .content"))?.trim() ?? "";
  if (!reply) fail("no reply text");
  if (await page.isVisible("#error")) fail(`error shown: ${await page.textContent("#error")}`);

  // The conversation is kept in the browser.
  await page.reload();
  await page.waitForSelector(".message.assistant");
  const kept = (await page.textContent(".message.assistant .content"))?.trim();
  if (kept !== reply) fail(`after a reload the reply reads ${JSON.stringify(kept)}`);

  // Stop interrupts a long reply.
  await page.click("#toggle-settings");
  await page.fill("#max-tokens", "2000");
  await page.locator("#max-tokens").dispatchEvent("change");
  await page.fill("#input", "Write a very long story about a lighthouse.");
  await page.click("#send");
  await page.waitForFunction(
    () => (document.querySelectorAll(".message.assistant .content")[1]?.textContent ?? "").length > 20,
    null,
    { timeout: 60000 },
  );
  const stoppedAt = Date.now();
  await page.click("#stop");
  await page.waitForFunction(() => document.body.dataset.state === "idle", null, { timeout: 5000 })
    .catch(() => fail("Stop did not end the stream within 5 s"));
  const ended = await page.textContent(".message.assistant:nth-of-type(4) .ended").catch(() => null);
  if (!ended?.includes("stopped")) fail(`the stopped reply is not marked: ${ended}`);
  const stopMs = Date.now() - stoppedAt;

  // A server error shows as an error.
  await page.fill("#api-key", "wrong-key");
  await page.locator("#api-key").dispatchEvent("change");
  await page.fill("#input", "Hello?");
  await page.click("#send");
  await page.waitForSelector("#error:not([hidden])", { timeout: 10000 })
    .catch(() => fail("no error shown for a wrong key"));
  const error = await page.textContent("#error");
  if (!error.includes("401")) fail(`error text: ${error}`);
  if (pageErrors.length) fail(`script errors: ${pageErrors.join("; ")}`);
  console.log(JSON.stringify({ ok: true, model, reply_chars: reply.length, stop_ms: stopMs, error }));
} finally {
  await browser.close();
}
