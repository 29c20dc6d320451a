// caravanserai panels, part 2 of 2 (after shell.js: one ES module, joined by
// caravanserai.panels.export.panels_module): each panel's header, rows and detail, and the anywidget entry.

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
