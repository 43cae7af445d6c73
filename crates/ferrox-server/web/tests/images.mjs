// Images on the chat page in a real headless browser (Debian's chromium, driven by
// playwright-core), against a running `ferrox serve --mmproj` on the synthetic Gemma 3 pair
// of fixtures/vision (f32 cache) whose API key is given:
//
//   node tests/images.mjs URL API_KEY FIXTURES_DIR
//
// Checks: the page learns from /v1/models that the server takes images and shows the attach
// button; the button works from the keyboard (a file chooser opens) and attached images show
// as thumbnails, each with a labelled remove button; paste and drop attach images too; a
// file that is not an image and one too large for the server's default 4 MiB request are
// refused with a message saying so. A message with an image is sent as an `image_url` part
// holding the file's exact bytes in a data: URL, then its text; the reply is llama-server's
// for that image (fixtures/vision/ref/server.json); the sent message shows the image, also
// after a reload; the next message sends the earlier image again with the conversation; a
// request that would exceed 4 MiB is not sent, with a message saying why, and the composer
// keeps its text and images. No script errors, no CSP violations, nothing from other
// origins. Prints one JSON line; exits 1 with the reason on failure.
import { readFileSync } from "node:fs";
import { chromium } from "playwright-core";

const [url, key, fixtures] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const origin = new URL(url).origin;

function fail(reason) {
  console.log(JSON.stringify({ ok: false, reason }));
  process.exit(1);
}

const png = (name) => readFileSync(`${fixtures}/${name}.png`);
const dataUrl = (name) => `data:image/png;base64,${png(name).toString("base64")}`;
const reference = JSON.parse(readFileSync(`${fixtures}/ref/server.json`, "utf8")).answers;
// llama-server leaves out a trailing incomplete UTF-8 sequence at a length cutoff; ferrox
// ends the text with U+FFFD there.
const sameText = (ours, theirs) => ours === theirs || (ours.endsWith("\ufffd") && ours.slice(0, -1) === theirs);

const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
try {
  const context = await browser.newContext();
  const offsite = [];
  context.on("request", (r) => {
    const u = new URL(r.url());
    if (["http:", "https:", "ws:", "wss:"].includes(u.protocol) && u.origin !== origin) offsite.push(r.url());
  });
  await context.addInitScript(() => {
    window.__violations = [];
    document.addEventListener("securitypolicyviolation", (e) =>
      window.__violations.push(`${e.effectiveDirective} ${e.blockedURI}`),
    );
  });
  const page = await context.newPage();
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  // File choosers the page opens (listened for from the start: the browser intercepts them
  // only once a listener is there).
  const choosers = [];
  page.on("filechooser", (c) => choosers.push(c));
  // Every chat request the page sends, as JSON.
  const sent = [];
  page.on("request", (r) => {
    if (r.url().endsWith("/v1/chat/completions")) sent.push(r.postDataJSON());
  });
  await page.goto(url);

  // Before the model list is read (it needs the key) the page offers no images.
  if (await page.isVisible("#attach")) fail("the attach button shows before the server said it takes images");
  await page.click("#toggle-settings");
  await page.fill("#api-key", key);
  await page.locator("#api-key").dispatchEvent("change");
  await page.fill("#temperature", "0");
  await page.locator("#temperature").dispatchEvent("change");
  await page.fill("#max-tokens", "16");
  await page.locator("#max-tokens").dispatchEvent("change");
  await page.click("#toggle-settings");
  await page.waitForSelector("#attach", { state: "visible", timeout: 10000 })
    .catch(() => fail("no attach button on a server that takes images"));
  const model = await page.textContent("#model");
  const attachName = await page.locator("#attach").evaluate((b) => ({
    text: b.textContent.trim(),
    description: document.getElementById(b.getAttribute("aria-describedby"))?.textContent ?? "",
  }));
  if (!attachName.text || !attachName.description.includes("4 MiB")) fail(`the attach button is not described: ${JSON.stringify(attachName)}`);
  if ((await page.getAttribute("#input", "aria-label")) !== "Message") fail("the message box has no label");

  const thumbs = () => page.locator("#attachments li").evaluateAll((items) =>
    items.map((li) => ({
      alt: li.querySelector("img")?.alt,
      src: li.querySelector("img")?.getAttribute("src"),
      remove: li.querySelector("button")?.getAttribute("aria-label"),
    })),
  );

  // From the keyboard: focus the button, press Enter, a file chooser opens.
  await page.focus("#attach");
  await page.keyboard.press("Enter");
  for (let i = 0; i < 50 && !choosers.length; i++) await page.waitForTimeout(100);
  const chooser = choosers.shift() ?? fail("Enter on the attach button opened no file chooser");
  if (!chooser.isMultiple()) fail("the file chooser takes one file only");
  await chooser.setFiles(`${fixtures}/rgb64.png`);
  await page.waitForSelector("#attachments li", { timeout: 5000 }).catch(() => fail("no thumbnail after choosing a file"));
  let t = await thumbs();
  if (t.length !== 1 || t[0].alt !== "rgb64.png" || t[0].src !== dataUrl("rgb64") || t[0].remove !== "Remove rgb64.png") {
    fail(`the thumbnail: ${JSON.stringify(t).slice(0, 300)}`);
  }
  if (!(await page.locator("#attachments").getAttribute("aria-label"))) fail("the attachment list has no label");

  // Refused: a file that is not an image, and one too large for a request.
  await page.setInputFiles("#image-file", { name: "notes.txt", mimeType: "text/plain", buffer: Buffer.from("hello") });
  await page.waitForSelector("#error:not([hidden])", { timeout: 5000 }).catch(() => fail("no message for a file that is not an image"));
  const notImage = await page.textContent("#error");
  if (!notImage.includes("notes.txt is not an image")) fail(`the message for a text file: ${notImage}`);
  await page.setInputFiles("#image-file", { name: "huge.png", mimeType: "image/png", buffer: Buffer.alloc(3300 << 10, 7) });
  await page.waitForFunction(() => document.querySelector("#error")?.textContent?.includes("huge.png"), null, { timeout: 5000 })
    .catch(() => fail("no message for an image too large"));
  const tooLarge = await page.textContent("#error");
  if (!tooLarge.includes("too large") || !tooLarge.includes("4 MiB")) fail(`the message for a large image: ${tooLarge}`);
  if ((await thumbs()).length !== 1) fail("a refused file was attached");

  // Paste and drop attach images; the remove buttons take them off, from the keyboard too.
  const transfer = async (kind, name) => {
    await page.evaluate(([kind, name, b64]) => {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const data = new DataTransfer();
      data.items.add(new File([bytes], `${name}.png`, { type: "image/png" }));
      if (kind === "paste") {
        document.querySelector("#input").dispatchEvent(new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true }));
      } else {
        const over = new DragEvent("dragover", { dataTransfer: data, bubbles: true, cancelable: true });
        document.querySelector("#messages").dispatchEvent(over);
        if (!over.defaultPrevented) throw new Error("the page does not take a drop");
        document.querySelector("#messages").dispatchEvent(new DragEvent("drop", { dataTransfer: data, bubbles: true, cancelable: true }));
      }
    }, [kind, name, png(name).toString("base64")]);
  };
  await transfer("paste", "gray48");
  await page.waitForFunction(() => document.querySelectorAll("#attachments li").length === 2, null, { timeout: 5000 })
    .catch(() => fail("a pasted image was not attached"));
  await transfer("drop", "rgba80");
  await page.waitForFunction(() => document.querySelectorAll("#attachments li").length === 3, null, { timeout: 5000 })
    .catch(() => fail("a dropped image was not attached"));
  t = await thumbs();
  if (JSON.stringify(t.map((x) => x.alt)) !== JSON.stringify(["rgb64.png", "gray48.png", "rgba80.png"])) fail(`thumbnails: ${JSON.stringify(t.map((x) => x.alt))}`);
  if (t[1].src !== dataUrl("gray48") || t[2].src !== dataUrl("rgba80")) fail("a pasted or dropped image's bytes changed");
  await page.click('#attachments button[aria-label="Remove gray48.png"]');
  // Focus moves to the next image's remove button; Enter removes that one.
  const focused = await page.evaluate(() => document.activeElement?.getAttribute("aria-label"));
  if (focused !== "Remove rgba80.png") fail(`after a removal the focus is on ${focused}`);
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelectorAll("#attachments li").length === 1, null, { timeout: 5000 });
  t = await thumbs();
  if (t.length !== 1 || t[0].alt !== "rgb64.png") fail(`after removing two: ${JSON.stringify(t.map((x) => x.alt))}`);

  // The message: the image as an image_url part with the file's bytes, then the text.
  await page.fill("#input", "Describe this image.");
  await page.press("#input", "Enter");
  await page.waitForSelector(".message.user .images img");
  await page.waitForFunction(() => document.body.dataset.state === "idle", null, { timeout: 60000 });
  if (await page.isVisible("#error")) fail(`error shown: ${await page.textContent("#error")}`);
  if (sent.length !== 1) fail(`${sent.length} requests sent`);
  const first = sent[0].messages;
  const want = [
    { type: "image_url", image_url: { url: dataUrl("rgb64") } },
    { type: "text", text: "Describe this image." },
  ];
  if (first.length !== 1 || first[0].role !== "user" || JSON.stringify(first[0].content) !== JSON.stringify(want)) {
    fail(`the request's messages: ${JSON.stringify(first).slice(0, 400)}`);
  }
  if ((await thumbs()).length !== 0 || !(await page.locator("#attachments").isHidden())) fail("the composer kept the sent image");
  const stored = () => page.evaluate(() => JSON.parse(localStorage.getItem("ferrox.chat")));
  let chat = await stored();
  const reply = chat[1]?.content ?? "";
  if (!sameText(reply, reference.rgb64.content)) fail(`the reply ${JSON.stringify(reply)} is not llama-server's ${JSON.stringify(reference.rgb64.content)}`);
  const shown = async () => page.locator(".message.user .images img").evaluateAll((imgs) => imgs.map((i) => [i.getAttribute("src"), i.alt]));
  let images = await shown();
  if (images.length !== 1 || images[0][0] !== dataUrl("rgb64") || !images[0][1]) fail(`the sent message shows ${JSON.stringify(images).slice(0, 200)}`);

  // Kept across a reload.
  await page.reload();
  await page.waitForSelector(".message.user .images img");
  images = await shown();
  if (images.length !== 1 || images[0][0] !== dataUrl("rgb64")) fail("the image is gone after a reload");
  await page.waitForSelector("#attach", { state: "visible", timeout: 10000 }).catch(() => fail("no attach button after a reload"));

  // The next message (text only) sends the earlier image again with the conversation.
  await page.fill("#input", "And now?");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelectorAll(".message.assistant").length === 2 && document.body.dataset.state === "idle", null, { timeout: 60000 });
  if (await page.isVisible("#error")) fail(`error shown: ${await page.textContent("#error")}`);
  const second = sent[1]?.messages ?? [];
  if (second.length !== 3 || JSON.stringify(second[0].content) !== JSON.stringify(want) || second[1].role !== "assistant" || second[2].content !== "And now?") {
    fail(`the second request's messages: ${JSON.stringify(second).slice(0, 400)}`);
  }
  chat = await stored();
  if (chat.length !== 4 || !chat[3].content) fail(`the second reply: ${JSON.stringify(chat.slice(2))}`);

  // Two images each under the limit that together make a request over it: not sent, the
  // composer keeps them.
  const big = (n) => ({ name: `big${n}.png`, mimeType: "image/png", buffer: Buffer.alloc(2500 << 10, n) });
  await page.setInputFiles("#image-file", [big(1), big(2)]);
  await page.waitForFunction(() => document.querySelectorAll("#attachments li").length === 2, null, { timeout: 5000 })
    .catch(() => fail("two large images were not attached"));
  if (await page.isVisible("#error")) fail(`an image under the limit was refused: ${await page.textContent("#error")}`);
  await page.fill("#input", "Two large ones.");
  await page.click("#send");
  await page.waitForSelector("#error:not([hidden])", { timeout: 5000 }).catch(() => fail("a request over the limit was not refused"));
  const overLimit = await page.textContent("#error");
  if (!overLimit.includes("4 MiB") || !overLimit.includes("--body-limit")) fail(`the message for a request over the limit: ${overLimit}`);
  await page.waitForTimeout(300);
  if (sent.length !== 2) fail("a request over the limit was sent");
  if ((await thumbs()).length !== 2 || (await page.inputValue("#input")) !== "Two large ones.") fail("the composer lost the refused message");
  if ((await page.locator(".message.user").count()) !== 2) fail("the refused message joined the conversation");

  const violations = await page.evaluate(() => window.__violations);
  if (violations.length) fail(`CSP violations: ${violations.join("; ")}`);
  if (offsite.length) fail(`the page requested other origins: ${JSON.stringify(offsite)}`);
  if (pageErrors.length) fail(`script errors: ${pageErrors.join("; ")}`);
  console.log(JSON.stringify({
    ok: true, model, reply, requests: sent.length, not_image: notImage, too_large: tooLarge, over_limit: overLimit,
  }));
} finally {
  await browser.close();
}
