// The chat page: one conversation kept in the browser (localStorage), replies streamed
// from /v1/chat/completions and rendered as Markdown, a stop button that aborts the stream
// (the server cancels the request when its client goes away), sampling settings. When the
// server takes images (`ferrox serve --mmproj`: /v1/models lists "image" among the model's
// input modalities), images attached to a message (a button, paste or drop) are sent with it
// as `image_url` parts holding data: URLs, and with the rest of the conversation after it.

import "./style.css";
import { marked } from "marked";
import DOMPurify from "dompurify";

type Role = "system" | "user" | "assistant";

interface Message {
  role: Role;
  content: string;
  /** Images sent with the message, as data: URLs. */
  images?: string[];
  /** Images the browser's storage had no room for (gone after a reload). */
  imagesDropped?: number;
  reasoning?: string;
  /** Why the reply ended early: "stopped" by the user, or an error. */
  ended?: string;
}

interface Settings {
  system: string;
  temperature: number;
  topP: number;
  maxTokens: number;
  apiKey: string;
}

const STORE_CHAT = "ferrox.chat";
const STORE_SETTINGS = "ferrox.settings";
/** The largest request body `ferrox serve` takes by default (its --body-limit, 4 MiB). A
 * request carries every image of the conversation, base64-encoded (a third larger). */
const BODY_LIMIT = 4 << 20;
/** Room a request needs besides one image: the text and the settings. */
const BODY_ROOM = 64 << 10;

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const messagesEl = $<HTMLElement>("messages");
const errorEl = $<HTMLElement>("error");
const inputEl = $<HTMLTextAreaElement>("input");
const sendEl = $<HTMLButtonElement>("send");
const stopEl = $<HTMLButtonElement>("stop");
const modelEl = $<HTMLElement>("model");
const settingsEl = $<HTMLElement>("settings");
const attachEl = $<HTMLButtonElement>("attach");
const fileEl = $<HTMLInputElement>("image-file");
const attachmentsEl = $<HTMLUListElement>("attachments");

let chat: Message[] = load<Message[]>(STORE_CHAT, []);
let modelId = "";
let running: AbortController | null = null;
/** Whether the server takes images. */
let vision = false;
/** Images for the next message: data: URLs and the files' names. */
let attached: { url: string; name: string }[] = [];

function load<T>(key: string, fallback: T): T {
  try {
    const raw = localStorage.getItem(key);
    return raw ? (JSON.parse(raw) as T) : fallback;
  } catch {
    return fallback;
  }
}

function save() {
  try {
    localStorage.setItem(STORE_CHAT, JSON.stringify(chat));
  } catch {
    // Over the storage quota (a few MiB): the conversation is kept without its images,
    // which stay in this page until it is left.
    const light = chat.map((m) =>
      m.images?.length ? { ...m, images: undefined, imagesDropped: m.images.length } : m,
    );
    try {
      localStorage.setItem(STORE_CHAT, JSON.stringify(light));
    } catch {
      // Nothing is kept.
    }
  }
}

// --- settings -------------------------------------------------------------------------

const fields = {
  system: $<HTMLTextAreaElement>("system"),
  temperature: $<HTMLInputElement>("temperature"),
  topP: $<HTMLInputElement>("top-p"),
  maxTokens: $<HTMLInputElement>("max-tokens"),
  apiKey: $<HTMLInputElement>("api-key"),
};

function readSettings(): Settings {
  return {
    system: fields.system.value,
    temperature: Number(fields.temperature.value),
    topP: Number(fields.topP.value),
    maxTokens: Math.max(1, Math.floor(Number(fields.maxTokens.value) || 1)),
    apiKey: fields.apiKey.value.trim(),
  };
}

function restoreSettings() {
  const s = load<Partial<Settings>>(STORE_SETTINGS, {});
  if (s.system !== undefined) fields.system.value = s.system;
  if (s.temperature !== undefined) fields.temperature.value = String(s.temperature);
  if (s.topP !== undefined) fields.topP.value = String(s.topP);
  if (s.maxTokens !== undefined) fields.maxTokens.value = String(s.maxTokens);
  if (s.apiKey !== undefined) fields.apiKey.value = s.apiKey;
}

for (const f of Object.values(fields)) {
  f.addEventListener("change", () => localStorage.setItem(STORE_SETTINGS, JSON.stringify(readSettings())));
}

$<HTMLButtonElement>("toggle-settings").addEventListener("click", (e) => {
  settingsEl.hidden = !settingsEl.hidden;
  (e.currentTarget as HTMLElement).setAttribute("aria-expanded", String(!settingsEl.hidden));
});

// --- rendering ------------------------------------------------------------------------

// Model output is untrusted (a prompt can make it say anything): nothing in it may make the
// browser fetch from elsewhere, which would carry conversation text to any host (an image
// whose URL holds it, say). DOMPurify parses in an inert document, where nothing loads; what
// it returns holds no element that fetches on its own. The page's Content-Security-Policy
// (web.rs) is the second wall.

/** Tags that load something (or submit somewhere) by themselves. */
const FORBID_TAGS = [
  "style", "link", "meta", "base", "audio", "video", "source", "track", "picture",
  "iframe", "frame", "frameset", "object", "embed", "form", "button", "select", "textarea",
];
/** Attributes that load something: CSS (url()), candidate image lists, posters, form targets. */
const FORBID_ATTR = [
  "style", "srcset", "sizes", "poster", "background", "action", "formaction", "ping",
  "lowsrc", "dynsrc", "longdesc",
];

/** Whether an image URL loads nothing from another origin: data:, or this page's origin. */
function localImage(src: string): boolean {
  try {
    const url = new URL(src, document.baseURI);
    return url.protocol === "data:" || url.origin === location.origin;
  } catch {
    return false;
  }
}

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (!(node instanceof Element)) return;
  const tag = node.tagName;
  if (tag === "IMG") {
    const src = node.getAttribute("src");
    if (src !== null && !localImage(src)) {
      // A remote image becomes a link to it, never fetched unless followed.
      const link = node.ownerDocument.createElement("a");
      link.className = "remote-image";
      link.href = src;
      link.title = `image not loaded: ${src}`;
      link.textContent = node.getAttribute("alt")?.trim() || src;
      node.replaceWith(link);
      setLinkTarget(link);
    }
    return;
  }
  // Only local images keep a src (an <input type="image"> would fetch its own).
  node.removeAttribute("src");
  if (tag === "INPUT" && node.getAttribute("type") !== "checkbox") {
    node.remove(); // marked writes only the disabled checkboxes of task lists
    return;
  }
  if (tag === "A" && node.hasAttribute("href")) setLinkTarget(node);
});

/** Links in replies open in a new tab and tell the other site nothing of this page. */
function setLinkTarget(link: Element) {
  link.setAttribute("target", "_blank");
  link.setAttribute("rel", "noopener noreferrer nofollow");
}

function markdown(text: string): string {
  const html = marked.parse(text, { async: false, gfm: true, breaks: true }) as string;
  return DOMPurify.sanitize(html, {
    USE_PROFILES: { html: true }, // no SVG or MathML: their <image>, <use>, <feImage> fetch
    FORBID_TAGS,
    FORBID_ATTR,
  });
}

function messageElement(m: Message): HTMLElement {
  const el = document.createElement("article");
  el.className = `message ${m.role}`;
  fill(el, m);
  return el;
}

function fill(el: HTMLElement, m: Message) {
  el.replaceChildren();
  if (m.reasoning) {
    const details = document.createElement("details");
    details.className = "reasoning";
    const summary = document.createElement("summary");
    summary.textContent = "Reasoning";
    const body = document.createElement("div");
    body.textContent = m.reasoning;
    details.append(summary, body);
    el.append(details);
  }
  const images = (m.images ?? []).filter(isImageData);
  if (images.length) {
    const list = document.createElement("div");
    list.className = "images";
    images.forEach((url, i) => {
      const img = document.createElement("img");
      img.src = url;
      img.alt = `image ${i + 1} of ${images.length}`;
      list.append(img);
    });
    el.append(list);
  }
  if (m.imagesDropped) {
    const note = document.createElement("div");
    note.className = "ended";
    note.textContent = `(${plural(m.imagesDropped, "image")} not kept: the browser's storage had no room)`;
    el.append(note);
  }
  const body = document.createElement("div");
  body.className = "content";
  if (m.role === "assistant") {
    body.innerHTML = markdown(m.content);
    for (const pre of body.querySelectorAll("pre")) addCopyButton(pre);
  } else {
    body.textContent = m.content;
  }
  el.append(body);
  if (m.ended) {
    const note = document.createElement("div");
    note.className = "ended";
    note.textContent = m.ended;
    el.append(note);
  }
}

/** Whether a stored image is one this page made: a data: URL of an image. */
function isImageData(url: unknown): url is string {
  return typeof url === "string" && url.startsWith("data:image/");
}

function plural(n: number, what: string): string {
  return `${n} ${what}${n === 1 ? "" : "s"}`;
}

function addCopyButton(pre: HTMLElement) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = "Copy";
  button.addEventListener("click", () => {
    void navigator.clipboard?.writeText(pre.querySelector("code")?.textContent ?? pre.textContent ?? "");
  });
  pre.append(button);
}

function renderAll() {
  messagesEl.replaceChildren(...chat.filter((m) => m.role !== "system").map(messageElement));
  messagesEl.scrollTop = messagesEl.scrollHeight;
}

function showError(text: string | null) {
  errorEl.hidden = text === null;
  errorEl.textContent = text ?? "";
}

function setRunning(controller: AbortController | null) {
  running = controller;
  sendEl.hidden = controller !== null;
  stopEl.hidden = controller === null;
  document.body.dataset.state = controller ? "streaming" : "idle";
}

// --- the server -----------------------------------------------------------------------

function headers(settings: Settings): Record<string, string> {
  const h: Record<string, string> = { "Content-Type": "application/json" };
  if (settings.apiKey) h.Authorization = `Bearer ${settings.apiKey}`;
  return h;
}

async function errorMessage(response: Response): Promise<string> {
  try {
    const body = await response.json();
    return `${response.status}: ${body?.error?.message ?? JSON.stringify(body)}`;
  } catch {
    return `${response.status}: ${response.statusText}`;
  }
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers(readSettings()) });
    if (!response.ok) {
      modelEl.textContent = "(model list needs the API key: see Settings)";
      return;
    }
    const body = await response.json();
    const model = body?.data?.[0];
    modelId = model?.id ?? "";
    modelEl.textContent = modelId;
    // llama-server's field: ["text", "image"] when the server has a vision projector.
    const inputs = model?.architecture?.input_modalities;
    setVision(Array.isArray(inputs) && inputs.includes("image"));
  } catch {
    modelEl.textContent = "(server unreachable)";
  }
}

/** The chat request for a conversation (failed empty replies left out): a message with
 * images sends them first, as `image_url` parts, then its text. */
function requestBody(conversation: Message[], settings: Settings): string {
  const history = conversation.filter((m) => !(m.role === "assistant" && m.content === "" && m.ended));
  const messages = [
    ...(settings.system ? [{ role: "system", content: settings.system }] : []),
    ...history.map(({ role, content, images }) => ({
      role,
      content: images?.length
        ? [
            ...images.map((url) => ({ type: "image_url", image_url: { url } })),
            ...(content ? [{ type: "text", text: content }] : []),
          ]
        : content,
    })),
  ];
  return JSON.stringify({
    model: modelId || undefined,
    messages,
    stream: true,
    temperature: settings.temperature,
    top_p: settings.topP,
    max_tokens: settings.maxTokens,
  });
}

function mib(bytes: number): string {
  return `${(bytes / (1 << 20)).toFixed(1)} MiB`;
}

/** Streams one reply into `reply`, re-rendering `el` as deltas arrive. */
async function stream(reply: Message, el: HTMLElement, controller: AbortController) {
  const settings = readSettings();
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(settings),
    signal: controller.signal,
    body: requestBody(chat.slice(0, -1), settings),
  });
  if (!response.ok || !response.body) {
    throw new Error(await errorMessage(response));
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let scheduled = false;
  const redraw = () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      fill(el, reply);
      messagesEl.scrollTop = messagesEl.scrollHeight;
    });
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let newline: number;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, newline).trim();
      buffer = buffer.slice(newline + 1);
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new Error(event.error.message ?? JSON.stringify(event.error));
      const delta = event.choices?.[0]?.delta ?? {};
      if (typeof delta.content === "string") reply.content += delta.content;
      if (typeof delta.reasoning_content === "string") {
        reply.reasoning = (reply.reasoning ?? "") + delta.reasoning_content;
      }
      const finish = event.choices?.[0]?.finish_reason;
      if (finish === "length") reply.ended = "(stopped at the token limit)";
      redraw();
    }
  }
}

/** Sends a message; false (with the reason shown) when the request would be larger than
 * the server takes by default, and nothing is sent. */
function send(text: string, images: string[]): boolean {
  const message: Message = { role: "user", content: text, ...(images.length ? { images } : {}) };
  const size = new Blob([requestBody([...chat, message], readSettings())]).size;
  if (size > BODY_LIMIT && chat.concat(message).some((m) => m.images?.length)) {
    showError(
      `This message would make a request of ${mib(size)}: ferrox serve takes at most 4 MiB by default ` +
        "(--body-limit), and every image of the conversation is sent again with each message. " +
        "Remove an image, or start a new chat.",
    );
    return false;
  }
  void streamReply(message);
  return true;
}

async function streamReply(message: Message) {
  showError(null);
  chat.push(message);
  const reply: Message = { role: "assistant", content: "" };
  chat.push(reply);
  save();
  renderAll();
  const el = messagesEl.lastElementChild as HTMLElement;
  const controller = new AbortController();
  setRunning(controller);
  try {
    await stream(reply, el, controller);
  } catch (e) {
    if (controller.signal.aborted) {
      reply.ended = "(stopped)";
    } else {
      reply.ended = "(failed)";
      showError(e instanceof Error ? e.message : String(e));
    }
  } finally {
    setRunning(null);
    fill(el, reply);
    save();
  }
}

$<HTMLFormElement>("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = inputEl.value.trim();
  if ((!text && !attached.length) || running) return;
  if (!send(text, attached.map((a) => a.url))) return;
  inputEl.value = "";
  attached = [];
  renderAttachments();
});

// --- images ---------------------------------------------------------------------------

function setVision(on: boolean) {
  vision = on;
  attachEl.hidden = !on;
  if (!on && attached.length) {
    attached = [];
    renderAttachments();
  }
}

function renderAttachments() {
  attachmentsEl.hidden = attached.length === 0;
  attachmentsEl.replaceChildren(
    ...attached.map((a, i) => {
      const item = document.createElement("li");
      item.className = "thumb";
      const img = document.createElement("img");
      img.src = a.url;
      img.alt = a.name;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "remove";
      remove.textContent = "×";
      remove.setAttribute("aria-label", `Remove ${a.name}`);
      remove.title = `Remove ${a.name}`;
      remove.addEventListener("click", () => {
        attached.splice(i, 1);
        renderAttachments();
        // Focus stays in the list (the next image's button), else goes to the message.
        const buttons = attachmentsEl.querySelectorAll<HTMLButtonElement>("button.remove");
        (buttons[Math.min(i, buttons.length - 1)] ?? inputEl).focus();
      });
      item.append(img, remove);
      return item;
    }),
  );
}

function readDataUrl(file: File): Promise<string> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

/** Attaches image files to the next message; a file that is not an image, or too large
 * for a request, is refused with the reason. */
async function attach(files: Iterable<File>) {
  if (!vision) return;
  const problems: string[] = [];
  for (const file of files) {
    const name = file.name || "pasted image";
    if (!file.type.startsWith("image/")) {
      problems.push(`${name} is not an image.`);
      continue;
    }
    // Base64 takes 4 bytes for every 3.
    const encoded = Math.ceil(file.size / 3) * 4;
    if (encoded + BODY_ROOM > BODY_LIMIT) {
      problems.push(
        `${name} is too large: ${mib(file.size)}, ${mib(encoded)} as base64, and ferrox serve takes ` +
          "requests of at most 4 MiB by default (--body-limit). Use a smaller image.",
      );
      continue;
    }
    try {
      attached.push({ url: await readDataUrl(file), name });
    } catch {
      problems.push(`${name} could not be read.`);
    }
  }
  renderAttachments();
  showError(problems.length ? problems.join(" ") : null);
}

attachEl.addEventListener("click", () => fileEl.click());
fileEl.addEventListener("change", () => {
  void attach(Array.from(fileEl.files ?? []));
  fileEl.value = "";
});

function imageFiles(data: DataTransfer | null): File[] {
  return Array.from(data?.files ?? []).filter((f) => f.type.startsWith("image/"));
}

inputEl.addEventListener("paste", (e) => {
  const files = imageFiles(e.clipboardData);
  if (!vision || !files.length) return;
  e.preventDefault();
  void attach(files);
});

// Files dropped anywhere on the page are attached (rather than opened by the browser).
document.addEventListener("dragover", (e) => {
  if (!vision || !e.dataTransfer?.types.includes("Files")) return;
  e.preventDefault();
  e.dataTransfer.dropEffect = "copy";
  document.body.classList.add("dropping");
});
document.addEventListener("dragleave", (e) => {
  if (e.relatedTarget === null) document.body.classList.remove("dropping");
});
document.addEventListener("drop", (e) => {
  document.body.classList.remove("dropping");
  if (!vision || !e.dataTransfer?.types.includes("Files")) return;
  e.preventDefault();
  void attach(Array.from(e.dataTransfer.files));
});

inputEl.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $<HTMLFormElement>("composer").requestSubmit();
  }
});

stopEl.addEventListener("click", () => running?.abort());

$<HTMLButtonElement>("new-chat").addEventListener("click", () => {
  running?.abort();
  chat = [];
  save();
  showError(null);
  renderAll();
});

restoreSettings();
setRunning(null);
renderAll();
void loadModel();
fields.apiKey.addEventListener("change", () => void loadModel());
