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

function fmtUsd(usd, priced) {
  if (priced === false || usd === null || usd === undefined) return "unpriced";
  return `$${Number(usd).toFixed(usd >= 0.01 ? 4 : 6)}`;
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
    if (toolbar) toolbar(this.toolbarEl);
    if (columns) columns(this.columnsEl);
    this.pending = null;
    this.scroller.addEventListener("scroll", () => this.draw());
    this.stickToEnd = false;
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
    this.scroller.style.height = `${Math.min(MAX_HEIGHT, Math.max(3, total) * ROW + 2)}px`;
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
    this.headerEl.replaceChildren(...this.header(this.model));
    const error = this.model.get("error");
    this.errorEl.textContent = error || "";
    this.errorEl.style.display = error ? "block" : "none";
  }

  drawDetail(render) {
    const detail = this.model.get("detail") || {};
    this.detailEl.replaceChildren(...(Object.keys(detail).length ? render(detail) : []));
    this.detailEl.style.display = Object.keys(detail).length ? "block" : "none";
  }

  scrollToEnd() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  atEnd() {
    return this.scroller.scrollTop + this.scroller.clientHeight >= this.scroller.scrollHeight - ROW * 2;
  }
}

function badge(text, kind) {
  return h("span", { class: `cvs-badge cvs-${kind}`, text });
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
};

function timelineHeader(model) {
  const s = model.get("summary") || {};
  const parts = [
    h("span", { class: "cvs-title", text: s.run_id || model.get("title") || "" }),
    s.status ? badge(s.status, s.status) : null,
    h("span", { class: "cvs-stat", text: `${s.attempts ?? 0} attempt(s)` }),
    h("span", { class: "cvs-stat", text: `${fmtInt(s.waypoints ?? 0)} waypoint(s)` }),
    h("span", { class: "cvs-stat", text: s.calls ? `${fmtInt(s.calls)} call(s), ${fmtInt(s.tokens ?? 0)} tokens` : "no calls" }),
    s.calls ? h("span", { class: "cvs-stat", text: `${fmtUsd(s.usd, true)}${s.unpriced ? " + unpriced" : ""} (inferred)` }) : null,
  ];
  if (s.replayed) parts.push(h("span", { class: "cvs-stat", text: `${fmtInt(s.replayed)} replayed free` }));
  if (s.parent) parts.push(h("span", { class: "cvs-stat", text: `forked from ${s.parent}` }));
  if (model.get("live")) parts.push(badge("live", "live"));
  return parts;
}

function timelineRow(row, index) {
  const when = h("span", { class: "cvs-time", text: fmtTime(row.at) });
  switch (row.kind) {
    case "attempt":
      return h("div", { class: `cvs-row cvs-attempt cvs-end-${row.end}` },
        h("span", { class: "cvs-icon", text: "▎" }),
        h("span", { class: "cvs-label", text: `attempt ${row.number}` }), when,
        h("span", { class: "cvs-text", text: `${row.number > 1 ? "resumed" : "started"}${row.pid ? ` · pid ${row.pid}` : ""}${row.host ? ` on ${row.host}` : ""} · ended: ${ENDINGS[row.end] || row.end}${row.message ? ` · ${row.message}` : ""}` }));
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
      const state = row.replayed ? badge("replayed · free", "replayed") : row.status === "settled" ? badge("paid", "paid")
        : badge(row.status, row.status);
      return h("div", { class: `cvs-row cvs-call cvs-${row.status}` },
        h("span", { class: "cvs-icon", text: row.kind_of === "tool" ? "⚙" : "●" }),
        h("span", { class: "cvs-label", text: row.kind_of === "tool" ? `tool ${row.tool}` : `${row.model || "model"}` }), when,
        h("span", { class: "cvs-bar" }, h("span", { class: "cvs-bar-fill", style: `width:${width}%` })),
        h("span", { class: "cvs-num", text: fmtDuration(row.duration_s) }),
        row.kind_of === "tool" ? h("span", { class: "cvs-num", text: row.effect || "" })
          : h("span", { class: "cvs-num", text: `${fmtInt(row.tokens)} tok` }),
        row.kind_of === "tool" ? null : h("span", { class: "cvs-num", text: fmtUsd(row.usd, row.priced) }),
        state);
    }
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
  if (detail.event !== undefined) parts.push(pre("event", detail.event));
  return parts;
}

function mountTimeline(model, el) {
  const shell = new Shell(model, el, {
    header: timelineHeader,
    renderRow: timelineRow,
    toolbar: (bar) => {
      const fold = h("label", { class: "cvs-check" },
        h("input", { type: "checkbox", onchange: (e) => { model.set("fold", e.target.checked); model.save_changes(); } }),
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
    columns: (bar) => {
      for (const [key, label] of JOURNAL_COLUMNS) {
        bar.append(h("span", {
          class: `cvs-cell cvs-col-${key} cvs-sortable`, text: label,
          onclick: () => {
            const [col, asc] = model.get("sort") || ["seq", true];
            model.set("sort", [key, col === key ? !asc : true]);
            model.save_changes();
          },
        }));
      }
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
  return h("div", { class: "cvs-row cvs-grid cvs-runs" },
    ...RUN_COLUMNS.map(([key]) => {
      if (key === "status") return h("span", { class: "cvs-cell cvs-col-status" }, badge(row.status || "", row.status || ""));
      const value = key === "usd" ? `${fmtUsd(row.usd, true)}${row.unpriced ? "+unpriced" : ""}` : key === "updated_at" ? fmtTime(row[key]) : row[key] ?? "";
      return h("span", { class: `cvs-cell cvs-col-${key}`, text: value });
    }));
}

function mountRuns(model, el) {
  const shell = new Shell(model, el, {
    header: (m) => {
      const s = m.get("summary") || {};
      return [h("span", { class: "cvs-title", text: s.store || "" }), h("span", { class: "cvs-stat", text: `${fmtInt(m.get("total"))} run(s)` }),
        m.get("live") ? badge("live", "live") : null];
    },
    renderRow: runsRow,
    columns: (bar) => RUN_COLUMNS.forEach(([key, label]) => bar.append(h("span", { class: `cvs-cell cvs-col-${key}`, text: label }))),
  });
  return wire(model, shell, (detail) => [h("div", { class: "cvs-block-title", text: detail.title || "" })]);
}

// ---- wiring a panel to its model -----------------------------------------------------------------
function wire(model, shell, renderDetail) {
  const redraw = () => { shell.pending = null; shell.draw(); };
  const onTotal = () => {
    const follow = model.get("follow") && shell.atEnd();
    shell.drawHeader();
    shell.draw();
    if (follow) shell.scrollToEnd();
  };
  const handlers = [
    ["change:rows", redraw], ["change:row_start", redraw], ["change:total", onTotal],
    ["change:summary", () => shell.drawHeader()], ["change:error", () => shell.drawHeader()], ["change:live", () => shell.drawHeader()],
    ["change:selected_seqs", () => shell.drawHeader()],
    ["change:detail", () => shell.drawDetail(renderDetail)], ["change:cursor", () => shell.draw()],
  ];
  for (const [event, fn] of handlers) model.on(event, fn);
  shell.drawHeader();
  shell.drawDetail(renderDetail);
  requestAnimationFrame(() => {
    if (model.get("start_at_end")) shell.scrollToEnd();
    shell.draw();
    shell.root.dataset.painted = "1";
  });
  return () => { for (const [event, fn] of handlers) model.off(event, fn); };
}

const PANELS = { timeline: mountTimeline, journal: mountJournal, runs: mountRuns };

export default {
  render({ model, el }) {
    const mount = PANELS[model.get("panel")];
    if (!mount) {
      el.append(h("div", { class: "cvs-panel" }, h("div", { class: "cvs-error", style: "display:block", text: `unknown panel ${model.get("panel")}` })));
      return () => {};
    }
    return mount(model, el);
  },
};
