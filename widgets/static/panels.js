// caravanserai panels: one dependency-free ES module for every panel (anywidget front end).
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

// ---- Timeline -------------------------------------------------------------------------------------
const ENDINGS = {
  completed: "completed",
  failed: "failed",
  interrupted: "interrupted",
  killed: "killed (no end recorded: a crash, kill -9 or kernel restart)",
  open: "running, or killed and not resumed yet",
  imported: "imported from caravanserai 0.2.0",
  log: "— (a DurableAgent checkpoint log: each commit below is durable)",
};

function timelineHeader(model) {
  const s = model.get("summary") || {};
  const parts = [
    h("span", { class: "cvs-title", text: s.run_id || model.get("title") || "" }),
    s.status ? badge(s.status, s.status) : null,
    h("span", { class: "cvs-stat", text: `${s.attempts ?? 0} attempt(s)` }),
    h("span", { class: "cvs-stat", text: `${fmtInt(s.waypoints ?? 0)} waypoint(s)` }),
    h("span", { class: "cvs-stat", text: s.calls ? `${s.calls_text || `${fmtInt(s.calls)} calls`}, ${fmtInt(s.tokens ?? 0)} tokens` : "no calls" }),
    s.calls ? h("span", { class: "cvs-stat", text: `${s.usd_text ?? fmtUsd(s.usd, true)} (inferred)` }) : null,
  ];
  if (s.replayed) parts.push(h("span", { class: "cvs-stat", text: `${fmtInt(s.replayed)} replayed free` }));
  if (s.steps) parts.push(h("span", { class: "cvs-stat", text: `${fmtInt(s.steps_done ?? 0)}/${fmtInt(s.steps)} agent steps done` }));
  if (s.parent) parts.push(h("span", { class: "cvs-stat", text: `forked from ${s.parent}` }));
  return parts;
}

function timelineRow(row, index) {
  const when = h("span", { class: "cvs-time", text: fmtTime(row.at) });
  switch (row.kind) {
    case "attempt":
      return h("div", { class: `cvs-row cvs-attempt cvs-end-${row.end}` },
        h("span", { class: "cvs-icon", text: "▎" }),
        h("span", { class: "cvs-label", text: `attempt ${row.number}` }), when,
        h("span", { class: "cvs-text", text: `${row.how || (row.number > 1 ? "resumed" : "started")}${row.pid ? ` · pid ${row.pid}` : ""}${row.host ? ` on ${row.host}` : ""} · ended: ${ENDINGS[row.end] || row.end}${row.message ? ` · ${row.message}` : ""}` }));
    case "copied":
      return h("div", { class: "cvs-row cvs-copied" },
        h("span", { class: "cvs-icon", text: "↳" }),
        h("span", { class: "cvs-label", text: `from ${row.parent}` }), when,
        h("span", { class: "cvs-text", text: `waypoints ${row.first ?? "–"}–${row.last ?? "–"} copied when this fork was made (the parent's work and times)${row.edited.length ? ` · edited: ${row.edited.join(", ")}` : ""}${row.code_changed ? " · cell code changed" : ""}` }),
        badge("fork", "state"));
    case "waypoint": {
      const note = h("span", { class: "cvs-text cvs-md" });
      note.innerHTML = markdown(String(row.note || "").split("\n")[0]);
      return h("div", { class: "cvs-row cvs-waypoint" },
        h("span", { class: "cvs-icon", text: "◆" }),
        h("span", { class: "cvs-label", text: `waypoint ${row.n}` }), when, note,
        row.has_state ? badge("state", "state") : null);
    }
    case "loop":
      return h("div", { class: "cvs-row cvs-loop" },
        h("span", { class: "cvs-icon", text: "⟳" }),
        h("span", { class: "cvs-label", text: `loop ${row.loop}` }), when,
        h("span", { class: "cvs-text", text: `${fmtInt(row.commits)} commit(s) folded · items done ${fmtInt(row.first_done)}→${fmtInt(row.last_done)} · ${row.note || ""}` }));
    case "call": {
      const width = Math.max(2, Math.round(100 * (row.bar || 0)));
      const settled = row.kind_of === "tool" ? "ran" : "paid";
      const state = row.status === "settled" ? badge(settled, "paid") : badge(row.status, row.status);
      const later = row.replayed_in && row.replayed_in.length
        ? h("span", { class: "cvs-later", text: `↺ attempt ${row.replayed_in.join(", ")}`, title: "answered from the journal in these attempts, free" }) : null;
      return h("div", { class: `cvs-row cvs-call cvs-${row.status}` },
        h("span", { class: "cvs-icon", text: row.kind_of === "tool" ? "⚙" : "●" }),
        h("span", { class: "cvs-label", text: row.kind_of === "tool" ? `tool ${row.tool}` : `${row.model || "model"}` }), when,
        h("span", { class: "cvs-bar" }, h("span", { class: "cvs-bar-fill", style: `width:${width}%` })),
        h("span", { class: "cvs-num", text: fmtDuration(row.duration_s) }),
        row.kind_of === "tool" ? h("span", { class: "cvs-num", text: row.effect || "" })
          : h("span", { class: "cvs-num", text: `${fmtInt(row.tokens)} tok` }),
        row.kind_of === "tool" ? null : h("span", { class: "cvs-num", text: fmtUsd(row.usd, row.priced) }),
        state, later);
    }
    case "replay":
      return h("div", { class: "cvs-row cvs-call cvs-replay" },
        h("span", { class: "cvs-icon", text: "↺" }),
        h("span", { class: "cvs-label", text: row.kind_of === "tool" ? `tool ${row.tool}` : `${row.model || "model"}` }), when,
        h("span", { class: "cvs-text cvs-fg2", text: `answered from the journal · paid in attempt ${row.paid_in} (seq ${row.paid_seq})` }),
        row.kind_of === "tool" ? null : h("span", { class: "cvs-num", text: `${fmtInt(row.tokens)} tok` }),
        badge("replayed · free", "replayed"));
    case "commit":
      return h("div", { class: `cvs-row cvs-commit${row.fork ? " cvs-fork-commit" : ""}` },
        h("span", { class: "cvs-icon", text: row.fork ? "↳" : "■" }),
        h("span", { class: "cvs-label", text: row.fork ? `fork at step ${row.fork_step}` : row.step ? `step ${row.step} committed` : "checkpoint" }), when,
        h("span", { class: "cvs-text", text: `checkpoint ${row.checkpoint} · ${fmtInt(row.steps_done)}/${fmtInt(row.steps)} steps done${row.fork ? ` · ${row.fork}` : ""}${row.computed ? ` · ${fmtInt(row.computed)} computed here` : ""}` }),
        row.tokens !== null && row.tokens !== undefined ? h("span", { class: "cvs-num", text: `${fmtInt(row.tokens)} tok` }) : null,
        row.fork ? badge("fork", "state") : null);
    default:
      return h("div", { class: `cvs-row cvs-event cvs-${row.kind}` },
        h("span", { class: "cvs-icon", text: row.kind === "completed" ? "✔" : row.kind === "failed" ? "✖" : "·" }),
        h("span", { class: "cvs-label", text: row.kind }), when, h("span", { class: "cvs-text", text: row.text || "" }));
  }
}

function timelineDetail(detail) {
  const parts = [h("div", { class: "cvs-block-title", text: detail.title || "" })];
  if (detail.note !== undefined) {
    const note = h("div", { class: "cvs-note cvs-md" });
    note.innerHTML = markdown(detail.note);
    parts.push(note);
  }
  if (detail.state !== undefined) parts.push(pre("state", detail.state));
  if (detail.variables !== undefined) parts.push(pre("variables", detail.variables));
  if (detail.code !== undefined) parts.push(pre("cell code changed", detail.code));
  if (detail.event !== undefined) parts.push(pre("event", detail.event));
  if (detail.result !== undefined) parts.push(pre("result", detail.result));
  if (detail.call !== undefined) parts.push(pre("the call it answers", detail.call));
  return parts;
}

function mountTimeline(model, el) {
  const shell = new Shell(model, el, {
    header: timelineHeader,
    renderRow: timelineRow,
    toolbar: (bar) => {
      const fold = h("label", { class: "cvs-check" },
        h("input", { type: "checkbox", onchange: (e) => { shell.holdRow(); model.set("fold", e.target.checked); model.save_changes(); } }),
        " fold loop progress");
      fold.querySelector("input").checked = model.get("fold");
      const end = h("button", { class: "cvs-button", text: "⇣ end", onclick: () => shell.scrollToEnd() });
      bar.append(fold, end);
    },
  });
  return wire(model, shell, timelineDetail);
}

// ---- JournalTable ---------------------------------------------------------------------------------
const JOURNAL_COLUMNS = [["seq", "seq"], ["at", "time"], ["type", "type"], ["attempt", "attempt"], ["call_id", "call"], ["summary", "summary"]];

function journalRow(row) {
  return h("div", { class: `cvs-row cvs-grid${row.selected ? " cvs-picked" : ""}` },
    ...JOURNAL_COLUMNS.map(([key]) => h("span", { class: `cvs-cell cvs-col-${key}`, text: key === "at" ? fmtTime(row[key]) : row[key] ?? "" })));
}

function mountJournal(model, el) {
  const shell = new Shell(model, el, {
    header: (m) => {
      const s = m.get("summary") || {};
      return [h("span", { class: "cvs-title", text: s.run_id || "" }),
        h("span", { class: "cvs-stat", text: `${fmtInt(m.get("total"))} of ${fmtInt(s.events)} event(s)` }),
        h("span", { class: "cvs-stat", text: `${fmtInt((m.get("selected_seqs") || []).length)} selected` })];
    },
    renderRow: journalRow,
    columns: (bar, shell) => {
      const draw = () => {
        const [sorted, ascending] = model.get("sort") || ["seq", true];
        bar.replaceChildren(...JOURNAL_COLUMNS.map(([key, label]) => h("span", {
          class: `cvs-cell cvs-col-${key} cvs-sortable${key === sorted ? " cvs-sorted" : ""}`,
          text: key === sorted ? `${label} ${ascending ? "▲" : "▼"}` : label,
          title: key === sorted ? `sorted ${ascending ? "ascending" : "descending"}: click to reverse` : `sort by ${label}`,
          "aria-sort": key === sorted ? (ascending ? "ascending" : "descending") : "none",
          onclick: () => {
            model.set("sort", [key, key === sorted ? !ascending : true]);
            model.save_changes();
          },
        })));
      };
      draw();
      shell.listen("change:sort", draw);
    },
    toolbar: (bar) => {
      const filters = () => model.get("filters") || {};
      const set = (key, value) => { model.set("filters", { ...filters(), [key]: value }); model.save_changes(); };
      const types = h("select", { class: "cvs-input", onchange: (e) => set("type", e.target.value) },
        h("option", { value: "", text: "every type" }), ...(model.get("types") || []).map((t) => h("option", { value: t, text: t })));
      const attempts = h("select", { class: "cvs-input", onchange: (e) => set("attempt", e.target.value ? Number(e.target.value) : null) },
        h("option", { value: "", text: "every attempt" }), ...(model.get("attempt_numbers") || []).map((n) => h("option", { value: String(n), text: `attempt ${n}` })));
      const text = h("input", { class: "cvs-input", type: "search", placeholder: "text…", oninput: (e) => set("text", e.target.value) });
      const since = h("input", { class: "cvs-input", type: "text", placeholder: "from (ISO time)", onchange: (e) => set("since", e.target.value) });
      const until = h("input", { class: "cvs-input", type: "text", placeholder: "to (ISO time)", onchange: (e) => set("until", e.target.value) });
      bar.append(types, attempts, text, since, until);
    },
  });
  shell.onClick = (index, row, event) => {
    const picked = new Set(model.get("selected_seqs") || []);
    if (!(event.ctrlKey || event.metaKey || event.shiftKey)) picked.clear();
    if (picked.has(row.seq)) picked.delete(row.seq); else picked.add(row.seq);
    model.set("selected_seqs", [...picked]);
    model.set("cursor", index);
    model.save_changes();
  };
  return wire(model, shell, timelineDetail);
}

// ---- Runs -----------------------------------------------------------------------------------------
const RUN_COLUMNS = [["run_id", "run"], ["status", "status"], ["attempts", "attempts"], ["waypoints", "waypoints"], ["calls", "calls"], ["usd", "cost"], ["updated_at", "last update"], ["parent", "parent"]];

function runsRow(row) {
  const status = h("span", { class: "cvs-cell cvs-col-status", title: row.error || "" }, badge(row.status || "", row.status || ""));
  if (row.status === "damaged") { // nothing to count: the error, whole, in the row's own line after the status
    return h("div", { class: "cvs-row cvs-grid cvs-runs" }, h("span", { class: "cvs-cell cvs-col-run_id", text: row.run_id }), status,
      h("span", { class: "cvs-cell cvs-row-error", text: row.error || "damaged", title: row.error || "" }));
  }
  return h("div", { class: "cvs-row cvs-grid cvs-runs" },
    ...RUN_COLUMNS.map(([key]) => {
      if (key === "status") return status;
      const value = key === "usd" ? (row.usd_text ?? `${fmtUsd(row.usd, true)}${row.unpriced ? " + unpriced" : ""}`)
        : key === "updated_at" ? fmtTime(row[key]) : row[key] ?? "";
      return h("span", { class: `cvs-cell cvs-col-${key}`, text: value, title: key === "calls" ? row.calls_text || "" : key === "run_id" ? row.run_id : "" });
    }));
}

function mountRuns(model, el) {
  const shell = new Shell(model, el, {
    header: (m) => {
      const s = m.get("summary") || {};
      return [h("span", { class: "cvs-title", text: s.store || "" }), h("span", { class: "cvs-stat", text: `${fmtInt(m.get("total"))} run(s)` })];
    },
    renderRow: runsRow,
    columns: (bar) => RUN_COLUMNS.forEach(([key, label]) => bar.append(h("span", { class: `cvs-cell cvs-col-${key}`, text: label }))),
    toolbar: (bar, shell) => {
      const button = h("button", { class: "cvs-button cvs-chart-button", title: "attempts and cost per run listed",
        onclick: () => model.send({ action: "chart" }) });
      const label = () => { button.textContent = model.get("chart") ? "▾ hide chart" : "▸ chart"; };
      label();
      shell.listen("change:chart", label);
      bar.append(button, h("span", { class: "cvs-stat", text: "click a run to open its timeline below" }));
    },
  });
  // the chart is SVG this package drew (widgets/charts.py themed_svg), in the theme's colours
  const chart = h("div", { class: "cvs-chart" });
  shell.root.append(chart);
  const drawChart = () => {
    chart.innerHTML = model.get("chart") || "";
    chart.style.display = model.get("chart") ? "block" : "none";
  };
  drawChart();
  shell.listen("change:chart", drawChart);
  return wire(model, shell, (detail) => [h("div", { class: "cvs-block-title", text: detail.title || "" })]);
}

// ---- Compare ------------------------------------------------------------------------------------
function diffSpans(ops) {
  return (ops || []).map(([op, text]) => (op === "=" ? document.createTextNode(text)
    : h(op === "+" ? "ins" : "del", { class: op === "+" ? "cvs-ins" : "cvs-del", text })));
}

function fmtDelta(value, kind) {
  if (value === null || value === undefined) return "";
  const size = Math.abs(value);
  if (size === 0 || (kind === "s" && size < 0.0005)) return ""; // under what fmtDuration shows
  const sign = value > 0 ? "+" : "-"; // as `caravanserai diff` writes a change
  if (kind === "tokens") return `${sign}${fmtInt(size)} tok`;
  if (kind === "usd") return `${sign}${dollars(size)}`;
  return `${sign}${fmtDuration(size)}`;
}

function figures(cell) {
  const parts = [];
  // a step without model calls (a notebook loop, a checkpoint) has no figures worth a "0 tok · 0 ms"
  if (cell.tokens) parts.push(`${fmtInt(cell.tokens)} tok`);
  if (cell.latency_s >= 0.0005) parts.push(fmtDuration(cell.latency_s));
  if (cell.usd !== null && cell.usd !== undefined && cell.usd !== 0) parts.push(fmtUsd(cell.usd, true));
  const deltas = [fmtDelta(cell.d_tokens, "tokens"), fmtDelta(cell.d_latency_s, "s"), fmtDelta(cell.d_usd, "usd")].filter(Boolean);
  return [parts.join(" · "), deltas.join(" ")];
}

function compareHeader(model) {
  const s = model.get("summary") || {};
  const runs = s.runs || [];
  const labels = (s.labels || []).filter((label, i) => label !== runs[i]);
  const parts = [h("span", { class: "cvs-title", text: runs.join(" vs "), title: (s.labels || runs).join(" vs ") }),
    labels.length ? h("span", { class: "cvs-stat", text: labels.join(", ") }) : null,
    h("span", { class: "cvs-stat", text: `${fmtInt(s.steps ?? 0)} step(s)` }),
    h("span", { class: "cvs-stat", text: `shared prefix ${fmtInt(s.shared_prefix ?? 0)}` }),
    s.first_divergence ? badge(`first divergence: step ${s.first_divergence}`, "divergence") : badge("no divergence", "completed"),
    h("span", { class: "cvs-stat", text: `${fmtInt(s.different ?? 0)} differ` })];
  for (const total of (s.totals || []).slice(1)) {
    const deltas = [fmtDelta(total.d_tokens, "tokens"), fmtDelta(total.d_latency_s, "s"), fmtDelta(total.d_usd, "usd")].filter(Boolean);
    if (deltas.length) parts.push(h("span", { class: "cvs-stat", text: `${total.run}: ${deltas.join(", ")} vs ${runs[0]}` }));
  }
  return parts;
}

function compareRow(row) {
  if (row.kind === "shared") {
    return h("div", { class: "cvs-row cvs-shared" }, h("span", { class: "cvs-icon", text: "≡" }),
      h("span", { class: "cvs-text", text: `steps ${row.first}–${row.last} are identical in every timeline · folded (click to unfold)` }));
  }
  const cells = row.cells.map((cell) => {
    if (cell.missing) return h("span", { class: "cvs-cmp-cell cvs-missing", text: "— no such step —" });
    const [figs, deltas] = figures(cell);
    // a notebook step's changed variables read old → new (as in the detail), not "16-1"
    const spans = diffSpans(cell.text);
    const text = cell.changed && cell.changed.length && !row.same
      ? spans.flatMap((node, i) => (node.nodeName === "INS" && i && spans[i - 1].nodeName === "DEL" ? [" → ", node] : [node])) : spans;
    return h("span", { class: "cvs-cmp-cell" },
      cell.prompt_changed ? badge("prompt edited", "state") : null,
      cell.code_changed ? badge("cell code changed", "state") : null,
      h("span", { class: "cvs-cmp-text" }, ...text),
      h("span", { class: "cvs-cmp-fig", text: figs }), deltas ? h("span", { class: "cvs-cmp-delta", text: deltas }) : null);
  });
  return h("div", { class: `cvs-row cvs-cmp ${row.same ? "cvs-same" : "cvs-diff"}${row.first ? " cvs-divergence" : ""}` },
    h("span", { class: "cvs-cmp-step", text: `${row.first ? "▶ " : ""}${row.step}` }), ...cells);
}

function compareDetail(detail) {
  const parts = [h("div", { class: "cvs-block-title", text: detail.title || "" })];
  if (detail.columns) {
    parts.push(h("div", { class: "cvs-cmp-detail" }, ...detail.columns.map((col) => {
      if (col.missing) return h("div", { class: "cvs-cmp-col" }, h("div", { class: "cvs-block-title", text: col.run }), "no such step");
      const [figs, deltas] = figures(col);
      const blocks = ["prompt", "note", "output"].filter((name) => col[name]).map((name) =>
        h("div", { class: "cvs-block" }, h("div", { class: "cvs-block-title", text: name }), h("div", { class: "cvs-diff-text" }, ...diffSpans(col[name]))));
      if (col.changes && col.changes.length) {
        blocks.unshift(h("div", { class: "cvs-block" }, h("div", { class: "cvs-block-title", text: "variables that differ" }),
          ...col.changes.map((c) => h("div", { class: "cvs-diff-text cvs-var-change" },
            h("code", { text: `${c.path}: ` }), h("del", { class: "cvs-del", text: c.old }), " → ", h("ins", { class: "cvs-ins", text: c.new })))));
      }
      // the code diff next to the variables it explains, before the note and output
      if (col.code_diff) blocks.splice(col.changes && col.changes.length ? 1 : 0, 0, pre("cell code changed", col.code_diff));
      return h("div", { class: "cvs-cmp-col" }, h("div", { class: "cvs-block-title", text: col.run }),
        h("div", { class: "cvs-stat", text: [figs, deltas].filter(Boolean).join(" · ") }), ...blocks);
    })));
  }
  return parts;
}

function mountCompare(model, el) {
  const runs = () => ((model.get("summary") || {}).runs || []);
  const shell = new Shell(model, el, {
    header: compareHeader,
    renderRow: compareRow,
    columns: (bar, shell) => {
      const draw = () => bar.replaceChildren(h("span", { class: "cvs-cmp-step", text: "step" }),
        ...runs().map((run, i) => h("span", { class: "cvs-cmp-cell", text: i === 0 ? `${run} (baseline)` : run })));
      draw();
      shell.listen("change:summary", draw);
    },
    toolbar: (bar, shell) => {
      const check = (name, label) => {
        const box = h("label", { class: "cvs-check" }, h("input", { type: "checkbox", onchange: (e) => { shell.holdRow(); model.set(name, e.target.checked); model.save_changes(); } }), ` ${label}`);
        box.querySelector("input").checked = model.get(name);
        shell.listen(`change:${name}`, () => { box.querySelector("input").checked = model.get(name); });
        return box;
      };
      bar.append(check("only_diff", "differences only"), check("fold", "fold shared steps"),
        h("button", { class: "cvs-button cvs-jump", text: "⇢ first divergence", onclick: () => jump() }));
    },
  });
  shell.onClick = (index, row) => {
    if (row.kind === "shared") { shell.holdRow(index); model.set("fold", false); model.save_changes(); return; }
    model.set("cursor", index);
    model.save_changes();
    shell.draw();
  };
  const jump = () => {
    const at = model.get("jump");
    if (at < 0) return;
    shell.scroller.scrollTop = Math.max(0, (at - 1) * ROW);
    model.set("cursor", at);
    model.save_changes();
    shell.draw();
    shell.root.dataset.jumped = String(at);
  };
  const unwire = wire(model, shell, compareDetail);
  model.on("change:jump", jump);
  requestAnimationFrame(() => requestAnimationFrame(jump));
  return () => { unwire(); model.off("change:jump", jump); };
}

// ---- Lineage --------------------------------------------------------------------------------------
const SVG = "http://www.w3.org/2000/svg";
const TREE_ROW = 30;
const TREE_INDENT = 26;

function s(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  node.append(...children.flat().filter(Boolean));
  return node;
}

function mountLineage(model, el) {
  const root = h("div", { class: "cvs-panel cvs-lineage" });
  const header = h("div", { class: "cvs-header" });
  const error = h("div", { class: "cvs-error", role: "alert" });
  const toolbar = h("div", { class: "cvs-toolbar" });
  const canvas = h("div", { class: "cvs-tree" });
  const detail = h("div", { class: "cvs-detail" });
  root.append(header, error, toolbar, canvas, detail);
  el.append(root);
  const compareButton = h("button", { class: "cvs-button cvs-compare", text: "Compare picked",
    onclick: () => model.send({ action: "compare", ids: model.get("picked") || [] }) });
  const hint = h("span", { class: "cvs-stat", text: "click a timeline to open it · tick two or more to compare them" });
  toolbar.append(compareButton, hint);
  let saved = false;

  const togglePick = (id) => {
    const picked = [...(model.get("picked") || [])];
    const at = picked.indexOf(id);
    if (at >= 0) picked.splice(at, 1); else picked.push(id);
    model.set("picked", picked);
    model.save_changes();
    draw();
  };
  const open = (row) => {
    model.set("cursor", row.row);
    model.save_changes();
    model.send({ action: "open", id: row.id });
    draw();
  };
  const draw = () => {
    const s0 = model.get("summary") || {};
    header.replaceChildren(...[h("span", { class: "cvs-title", text: `lineage of ${s0.root || ""}` }),
      h("span", { class: "cvs-stat", text: `${fmtInt(s0.timelines ?? 0)} timeline(s), ${fmtInt(s0.forks ?? 0)} fork(s)` }),
      statusBadge(model, saved, model.get("error"))].filter(Boolean));
    const message = model.get("error");
    error.textContent = message || "";
    error.style.display = message ? "block" : "none";
    const total = model.get("total") || 0;
    const rows = model.get("rows") || [];
    if (rows.length < total && model.get("view_count") < total) {
      model.set("view_start", 0);
      model.set("view_count", total);
      model.save_changes();
    }
    const picked = new Set(model.get("picked") || []);
    compareButton.disabled = picked.size < 2;
    compareButton.textContent = `Compare picked (${picked.size})`;
    const at = new Map(rows.map((row) => [row.id, row]));
    const x = (row) => 30 + row.depth * TREE_INDENT;
    const y = (row) => 15 + row.row * TREE_ROW;
    const edges = rows.filter((row) => row.parent && at.has(row.parent)).map((row) => {
      const parent = at.get(row.parent);
      return s("path", { class: "cvs-edge", d: `M${x(parent)},${y(parent)} V${y(row)} H${x(row)}` });
    });
    const selected = model.get("cursor");
    const nodes = rows.map((row) => {
      const where = row.point ? ` · from ${row.parent} at ${row.point_kind} ${row.point}` : "";
      const progress = row.steps ? ` · ${fmtInt(row.steps_done)}/${fmtInt(row.steps)} steps` : row.steps_done ? ` · ${fmtInt(row.steps_done)} waypoint(s)` : "";
      return s("g", { class: `cvs-node cvs-node-${row.status}${row.row === selected ? " cvs-node-selected" : ""}${picked.has(row.id) ? " cvs-node-picked" : ""}`, "data-id": row.id },
        s("rect", { class: "cvs-pick", x: 6, y: y(row) - 6, width: 12, height: 12, rx: 2, onclick: () => togglePick(row.id) }),
        picked.has(row.id) ? s("path", { class: "cvs-pick-mark", d: `M8,${y(row)} l3,3 l5,-6`, onclick: () => togglePick(row.id) }) : null,
        s("circle", { cx: x(row), cy: y(row), r: row.kind === "branch" ? 5 : 7, onclick: () => open(row) }),
        s("text", { x: x(row) + 14, y: y(row) + 4, onclick: () => open(row) },
          s("tspan", { class: "cvs-node-id", text: row.id }),
          s("tspan", { class: "cvs-node-meta", text: ` · ${row.status}${progress}${where}` }),
          row.edit ? s("tspan", { class: "cvs-node-edit", text: ` · ${row.edit}` }) : null));
    });
    const width = Math.max(400, ...rows.map((row) => x(row) + 14 + 7 * (row.id.length + (row.edit || "").length + 60)));
    canvas.replaceChildren(s("svg", { class: "cvs-svg", width, height: Math.max(1, rows.length) * TREE_ROW + 4, role: "img",
      "aria-label": "fork tree" }, ...edges, ...nodes));
    const d = model.get("detail") || {};
    detail.replaceChildren(...(d.title ? [h("div", { class: "cvs-block-title", text: d.title })] : []));
    detail.style.display = d.title ? "block" : "none";
    root.dataset.total = String(total);
    root.classList.toggle("cvs-saved-view", saved);
    root.classList.toggle("cvs-broken", Boolean(message) && !total);
  };
  savedPicture(model).then((value) => { if (value) { saved = true; draw(); } });
  const events = ["change:rows", "change:total", "change:summary", "change:error", "change:picked", "change:detail", "change:cursor", "change:live"];
  for (const event of events) model.on(event, draw);
  draw();
  requestAnimationFrame(() => { root.dataset.painted = "1"; });
  return () => { for (const event of events) model.off(event, draw); };
}

// ---- ForkPanel ------------------------------------------------------------------------------------
function forkRow(row) {
  if (row.kind === "waypoint") {
    // the note a fixed share of the row, so every row's variables start in one column
    const note = h("span", { class: "cvs-text cvs-md", style: "flex: 0 0 25%" });
    note.innerHTML = markdown(row.note || "");
    return h("div", { class: "cvs-row cvs-fork-row" }, h("span", { class: "cvs-icon", text: "◆" }),
      h("span", { class: "cvs-label", text: `waypoint ${row.step}` }), note, h("span", { class: "cvs-text cvs-output", text: row.state }));
  }
  return h("div", { class: `cvs-row cvs-fork-row${row.done ? "" : " cvs-not-done"}` }, h("span", { class: "cvs-icon", text: row.done ? "●" : "○" }),
    h("span", { class: "cvs-label", text: `step ${row.step}` }),
    h("span", { class: "cvs-text cvs-prompt", text: row.prompt }),
    h("span", { class: "cvs-text cvs-output", text: row.done ? `→ ${row.output}` : "→ (not run yet)" }),
    h("span", { class: "cvs-num", text: row.tokens !== null && row.tokens !== undefined ? `${fmtInt(row.tokens)} tok` : "" }));
}

function jobView(model, job) {
  if (!job || !job.state) return [h("span", { class: "cvs-stat", text: "pick a step, edit it, click Fork" })];
  if (job.state === "created") {
    return [badge("forked", "completed"), h("span", { class: "cvs-text", text: `${job.run} starts at waypoint ${job.step} of ${job.parent} · ${job.hint}` }),
      h("button", { class: "cvs-button", text: "timeline", onclick: () => model.send({ action: "open" }) }),
      h("button", { class: "cvs-button", text: "compare with parent", onclick: () => model.send({ action: "compare" }) })];
  }
  const total = job.steps || 0;
  const done = job.steps_done || 0;
  const states = { running: "pending", done: "completed", stopped: "pending", failed: "failed" };
  return [badge(job.state, states[job.state] || job.state),
    h("span", { class: "cvs-text cvs-job-text", text: `${job.run}: forked at step ${job.step} (head ${job.head || "…"}) · ${fmtInt(done)}/${total ? fmtInt(total) : "?"} steps · reused ${fmtInt(job.reused)} step(s), ${fmtInt(job.tokens_saved)} tokens saved · computed ${fmtInt(job.computed)}${job.error ? ` · ${job.error}` : ""}` }),
    h("span", { class: "cvs-bar" }, h("span", { class: "cvs-bar-fill", style: `width:${total ? Math.round((100 * done) / total) : 0}%` })),
    job.state === "running" ? h("button", { class: "cvs-button cvs-stop", text: "■ Stop", onclick: () => model.send({ action: "stop" }) }) : null,
    h("button", { class: "cvs-button", text: "timeline", onclick: () => model.send({ action: "open" }) }),
    h("button", { class: "cvs-button cvs-open-compare", text: "compare with parent", onclick: () => model.send({ action: "compare" }) })];
}

function forkDetail(model) {
  return (detail) => {
    if (!detail.edit) return [h("div", { class: "cvs-block-title", text: detail.title || "" })];
    const lines = String(detail.editable || "").split("\n").length;
    const editor = h("textarea", { class: "cvs-input cvs-edit", rows: detail.edit === "prompt" ? 3 : Math.min(12, Math.max(4, lines + 1)), spellcheck: "false" });
    editor.value = detail.editable;
    const newId = h("input", { class: "cvs-input cvs-new-id", type: "text", placeholder: "new run id (optional)" });
    const fork = h("button", { class: "cvs-button cvs-fork", text: "Fork",
      onclick: () => model.send({ action: "fork", step: detail.step, text: editor.value, new_run_id: newId.value }) });
    const parts = [h("div", { class: "cvs-block-title", text: detail.title }),
      h("div", { class: "cvs-block-title", text: { state: "state (JSON)", variables: "the cell's variables (name = value; Python literals)", prompt: "prompt" }[detail.edit] || detail.edit }), editor,
      h("div", { class: "cvs-toolbar" }, fork, newId)];
    if (detail.output !== undefined) parts.push(pre("output", detail.output || "(not run yet)"));
    if (detail.note) parts.push(pre("note", detail.note));
    return parts;
  };
}

function mountFork(model, el) {
  let jobBar = null;
  const shell = new Shell(model, el, {
    header: (m) => {
      const s0 = m.get("summary") || {};
      return [h("span", { class: "cvs-title", text: `fork ${s0.run_id || ""}` }),
        h("span", { class: "cvs-stat", text: s0.agent ? `${fmtInt(s0.steps)} step(s), ${fmtInt(s0.steps_done)} done · head ${(s0.head || "").slice(0, 12)}` : `${fmtInt(s0.steps)} waypoint(s)` })];
    },
    renderRow: forkRow,
    toolbar: (bar) => { jobBar = bar; },
  });
  const drawJob = () => { jobBar.classList.add("cvs-job"); jobBar.replaceChildren(...jobView(model, model.get("job") || {}).filter(Boolean)); };
  drawJob();
  model.on("change:job", drawJob);
  const unwire = wire(model, shell, forkDetail(model));
  return () => { unwire(); model.off("change:job", drawJob); };
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

const PANELS = { timeline: mountTimeline, journal: mountJournal, runs: mountRuns, compare: mountCompare, lineage: mountLineage, fork: mountFork };

export default {
  render({ model, el }) {
    const mount = PANELS[model.get("panel")];
    if (!mount) {
      el.append(h("div", { class: "cvs-panel" }, h("div", { class: "cvs-error", style: "display:block", text: `unknown panel ${model.get("panel")}` })));
      return () => {};
    }
    const unmount = mount(model, el);
    // the kernel polls a live panel only while a view shows it: say when this one is drawn,
    // that it is still there, and when it is removed (a re-run cell, a cleared output)
    const say = (action) => { try { model.send({ action }); } catch (_) { /* the comm is gone */ } };
    say("attach");
    const alive = setInterval(() => say("alive"), HEARTBEAT_MS);
    // later, not now: when the whole model is closing (a kernel restart) its comm is gone by then and
    // nothing is sent
    return () => { clearInterval(alive); setTimeout(() => say("detach"), 0); if (unmount) unmount(); };
  },
};
