// caravanserai panels, part 1 of 2 (shell.js, then panels.js: one ES module, joined in that order by
// caravanserai.panels.export.panels_module): the helpers, the Shell every panel shares and its wiring.
//
// The data stays in the kernel. A panel's model holds a small summary and a *window* of rows
// (`rows`, starting at `row_start`); the browser draws a virtual list of `total` rows and asks for
// the window it needs by setting `view_start`/`view_count`. Clicks set traits (`cursor`,
// `sort`, `filters`, ...); Python answers by setting `detail` or new rows. Nothing here fetches
// anything from the network: the panels work offline.

const ROW = 26; // px per row: fixed, so the list can be virtual
const BUFFER = 40; // rows asked for beyond the visible ones
const MAX_HEIGHT = 360; // px: taller runs scroll
const HOLD_MS = 3000; // a row held in place while rows change (holdRow) lets go after this

// ---- small helpers ------------------------------------------------------------------------------
function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// A small, safe Markdown subset for waypoint notes: escaped first, then **bold**, *em*, `code`,
// [links](http...), headings, bullet lists and paragraphs. No raw HTML ever reaches the page.
export function markdown(source) {
  const inline = (text) =>
    escapeHtml(text)
      .replace(/`([^`]+)`/g, "<code>$1</code>")
      .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^*])\*([^*]+)\*/g, "$1<em>$2</em>")
      .replace(/\[([^\]]+)\]\((https?:\/\/[^)\s]+)\)/g, '<a href="$2" target="_blank" rel="noopener">$1</a>');
  const out = [];
  let list = false;
  for (const line of String(source || "").split("\n")) {
    const heading = /^(#{1,4})\s+(.*)$/.exec(line);
    const bullet = /^\s*[-*]\s+(.*)$/.exec(line);
    if (bullet) {
      if (!list) out.push("<ul>");
      list = true;
      out.push(`<li>${inline(bullet[1])}</li>`);
      continue;
    }
    if (list) out.push("</ul>");
    list = false;
    if (heading) out.push(`<h${heading[1].length + 3}>${inline(heading[2])}</h${heading[1].length + 3}>`);
    else if (line.trim()) out.push(`<p>${inline(line)}</p>`);
  }
  if (list) out.push("</ul>");
  return out.join("");
}

function fmtTime(iso) {
  if (!iso) return "";
  const match = /T(\d\d:\d\d:\d\d)(\.\d+)?/.exec(iso);
  return match ? match[1] + (match[2] ? match[2].slice(0, 4) : "") : iso;
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(2)} s`;
  return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
}

// plain dollars, as caravanserai's usd_text writes them: "$0", "$12.34", "$0.015", "$0.00042"
function dollars(usd) {
  const size = Math.abs(Number(usd));
  if (size === 0) return "$0";
  if (size < 1) {
    const text = size.toFixed(Math.min(100, 2 - Math.floor(Math.log10(size))));
    if (Number(text) < 1) return `$${text.replace(/0+$/, "").replace(/\.$/, "")}`;
  }
  return `$${size.toFixed(2)}`;
}

function fmtUsd(usd, priced) {
  if (priced === false || usd === null || usd === undefined) return "unpriced";
  return `${Number(usd) < 0 ? "-" : ""}${dollars(usd)}`;
}

function fmtInt(n) {
  return n === null || n === undefined ? "" : Number(n).toLocaleString("en-US");
}

// ---- the shell every panel shares: header, error line, virtual list, detail pane ------------------
class Shell {
  constructor(model, el, { columns, renderRow, header, toolbar }) {
    this.model = model;
    this.renderRow = renderRow;
    this.header = header;
    this.root = h("div", { class: "cvs-panel" });
    this.headerEl = h("div", { class: "cvs-header" });
    this.errorEl = h("div", { class: "cvs-error", role: "alert" });
    this.toolbarEl = h("div", { class: "cvs-toolbar" });
    this.columnsEl = columns ? h("div", { class: "cvs-columns" }) : null;
    this.scroller = h("div", { class: "cvs-scroller", tabindex: "0" });
    this.spacer = h("div", { class: "cvs-spacer" });
    this.body = h("div", { class: "cvs-rows" });
    this.detailEl = h("div", { class: "cvs-detail" });
    this.scroller.append(this.spacer, this.body);
    this.root.append(this.headerEl, this.errorEl, this.toolbarEl);
    if (this.columnsEl) this.root.append(this.columnsEl);
    this.root.append(this.scroller, this.detailEl);
    el.append(this.root);
    this.listeners = []; // [event, fn] registered through listen(): removed when the view goes
    if (toolbar) toolbar(this.toolbarEl, this);
    if (columns) columns(this.columnsEl, this);
    this.pending = null;
    this.saved = false; // drawn from the notebook's saved widget state (savedPicture)
    this.hold = null; // [row, px from the top]: a row the reader acted on, kept in place while rows change
    // whether new rows should scroll into view: decided by where the reader left the list, not
    // re-measured when rows arrive (the list may already have grown under the reader by then)
    this.following = true;
    this.scroller.addEventListener("scroll", () => { this.following = this.atEnd(); this.draw(); });
  }

  visibleRange() {
    const height = this.scroller.clientHeight || 400;
    const first = Math.max(0, Math.floor(this.scroller.scrollTop / ROW));
    const count = Math.ceil(height / ROW) + 1;
    return [first, count];
  }

  request(first, count) {
    const start = Math.max(0, first - BUFFER);
    const want = count + 2 * BUFFER;
    const have = this.model.get("row_start");
    const rows = this.model.get("rows") || [];
    const total = this.model.get("total");
    const end = Math.min(total, first + count);
    if (first >= have && end <= have + rows.length) return; // the window already covers it
    if (this.pending && this.pending[0] === start) return;
    this.pending = [start, want];
    this.model.set("view_start", start);
    this.model.set("view_count", want);
    this.model.save_changes();
  }

  draw() {
    const total = this.model.get("total") || 0;
    this.spacer.style.height = `${total * ROW}px`;
    this.scroller.style.height = `${Math.min(MAX_HEIGHT, Math.max(1, total) * ROW + 2)}px`;
    this.root.dataset.total = String(total);
    const [first, count] = this.visibleRange();
    this.request(first, count);
    const start = this.model.get("row_start") || 0;
    const rows = this.model.get("rows") || [];
    const selected = this.model.get("cursor");
    this.body.replaceChildren();
    this.body.style.transform = `translateY(${first * ROW}px)`;
    for (let i = first; i < Math.min(total, first + count); i++) {
      const row = rows[i - start];
      const node = row ? this.renderRow(row, i) : h("div", { class: "cvs-row cvs-loading", text: "…" });
      node.style.height = `${ROW}px`;
      node.dataset.index = String(i);
      if (i === selected) node.classList.add("cvs-selected");
      if (row) {
        node.addEventListener("click", (event) => this.onClick(i, row, event));
      }
      this.body.append(node);
    }
  }

  onClick(index, row, event) {
    this.model.set("cursor", index);
    this.model.save_changes();
    this.draw();
  }

  drawHeader() {
    const error = this.model.get("error");
    this.headerEl.replaceChildren(...[...this.header(this.model), statusBadge(this.model, this.saved, error)].filter(Boolean));
    this.errorEl.textContent = error || "";
    this.errorEl.style.display = error ? "block" : "none";
    // nothing could be read: the error line alone, not an empty list with zero counts
    this.root.classList.toggle("cvs-broken", Boolean(error) && !(this.model.get("total") > 0));
    this.root.classList.toggle("cvs-saved-view", Boolean(this.saved));
  }

  drawDetail(render) {
    const detail = this.model.get("detail") || {};
    this.detailEl.replaceChildren(...(Object.keys(detail).length ? render(detail) : []));
    this.detailEl.style.display = Object.keys(detail).length ? "block" : "none";
  }

  listen(event, fn) {
    this.model.on(event, fn);
    this.listeners.push([event, fn]);
  }

  unlisten() {
    for (const [event, fn] of this.listeners) this.model.off(event, fn);
    this.listeners = [];
  }

  // Keep row ``index`` where the reader sees it while the rows change under it (a fold flipped, a
  // shared run of steps unfolded): restored by keepHeld() when the new rows arrive.
  holdRow(index) {
    const at = index ?? this.visibleRange()[0];
    this.hold = [at, at * ROW - this.scroller.scrollTop];
    this.holdUntil = Date.now() + HOLD_MS;
    this.following = false;
  }

  keepHeld() {
    if (this.hold && Date.now() > this.holdUntil) this.hold = null; // the change it waited for never came
    if (!this.hold) return false;
    const [index, offset] = this.hold;
    this.scroller.scrollTop = Math.max(0, index * ROW - offset);
    return true;
  }

  scrollToEnd() {
    this.following = true;
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  atEnd() {
    return this.scroller.scrollTop + this.scroller.clientHeight >= this.scroller.scrollHeight - ROW * 2;
  }
}

function badge(text, kind) {
  return h("span", { class: `cvs-badge cvs-${kind}`, text });
}

const SAVED_HINT = "a picture saved with the notebook: no kernel holds this panel; run its cell again to open it live";

// "live" while a kernel polls the panel; "saved" for a view drawn from the notebook's saved widget
// state; nothing in an error state (a live badge beside an error reads as "all is well")
const GONE_HINT = "the kernel that held this panel is gone (restarted or shut down): run its cell again to open it live";

function statusBadge(model, saved, error) {
  if (saved === "gone") return h("span", { class: "cvs-badge cvs-saved", text: "not live", title: GONE_HINT });
  if (saved) return h("span", { class: "cvs-badge cvs-saved", text: "saved", title: SAVED_HINT });
  if (error || !model.get("live")) return null;
  return badge("live", "live");
}

// Whether this view was drawn from widget state saved with the notebook (no kernel behind the model):
// the widget manager's model for our id has no live comm. Resolves false where that cannot be told.
async function savedPicture(model) {
  const id = model.get("self_id");
  const manager = model.widget_manager;
  if (!id || !manager || typeof manager.get_model !== "function") return false;
  try {
    const backbone = await manager.get_model(id);
    return Boolean(backbone) && backbone.comm_live === false;
  } catch (_) {
    return false;
  }
}

function pre(title, text) {
  return h("div", { class: "cvs-block" }, h("div", { class: "cvs-block-title", text: title }), h("pre", { text }));
}

const HEARTBEAT_MS = 30000; // widgets/panel.py stops polling after STALE_SECONDS without a word

// ---- wiring a panel to its model -----------------------------------------------------------------
function wire(model, shell, renderDetail) {
  // the spacer grows in draw(), so a held row is put back after it (a scrollTop beyond it is clamped)
  const redraw = () => {
    shell.pending = null;
    shell.draw();
    if (shell.keepHeld()) { shell.hold = null; shell.draw(); }
  };
  const onTotal = () => {
    const follow = model.get("follow") && shell.following && !shell.hold;
    shell.drawHeader();
    shell.draw();
    if (shell.keepHeld()) shell.draw();
    else if (follow) shell.scrollToEnd();
  };
  // a kernel restart or shutdown later: the panel stops claiming to be live
  const onComm = () => savedPicture(model).then((gone) => { if (gone && !shell.saved) { shell.saved = "gone"; shell.drawHeader(); } });
  const handlers = [
    ["change:rows", redraw], ["change:row_start", redraw], ["change:total", onTotal],
    ["change:summary", () => shell.drawHeader()], ["change:error", () => shell.drawHeader()], ["change:live", () => shell.drawHeader()],
    ["change:selected_seqs", () => shell.drawHeader()],
    ["change:detail", () => shell.drawDetail(renderDetail)], ["change:cursor", () => shell.draw()],
    ["comm_live_update", () => onComm()],
  ];
  for (const [event, fn] of handlers) model.on(event, fn);
  shell.drawHeader();
  shell.drawDetail(renderDetail);
  savedPicture(model).then((saved) => { if (saved) { shell.saved = "saved"; shell.drawHeader(); } });
  requestAnimationFrame(() => {
    if (model.get("start_at_end")) shell.scrollToEnd();
    shell.draw();
    shell.following = shell.atEnd();
    shell.root.dataset.painted = "1";
  });
  return () => { for (const [event, fn] of handlers) model.off(event, fn); shell.unlisten(); };
}
