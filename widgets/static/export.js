// caravanserai offline export: mounts the panels of an exported HTML file with no kernel.
//
// The page embeds the panels' own module (shell.js + panels.js joined, as text) and the rows and details of every
// panel for each setting of its switches. StaticModel plays the part of the anywidget model:
// get/set/on/off/save_changes/send, answering window requests from the embedded rows.

const data = JSON.parse(document.getElementById("cvs-data").textContent);
const url = URL.createObjectURL(new Blob([data.js], { type: "text/javascript" }));
const panels = (await import(url)).default;

class StaticModel {
  constructor(panel) {
    this.p = panel;
    this.handlers = new Map();
    this.dirty = new Set();
    this.state = {
      panel: panel.panel, error: "", summary: panel.summary, live: false, follow: false, start_at_end: false,
      cursor: -1, detail: {}, view_start: 0, view_count: 200, row_start: 0, rows: [], total: 0, jump: -1,
      job: {}, picked: [], exported: true, ...panel.state,
    };
    this.applyVariant();
    this.window();
  }

  applyVariant() {
    const key = JSON.stringify(this.p.options.map((name) => this.state[name]));
    const variant = this.p.variants[key] || Object.values(this.p.variants)[0];
    this.all = variant.rows.map((i) => this.p.row_pool[i]);
    this.details = variant.details;
    Object.assign(this.state, variant.traits || {});
    this.state.total = this.all.length;
    return Object.keys(variant.traits || {});
  }

  window() {
    const total = this.state.total;
    const start = Math.max(0, Math.min(this.state.view_start, Math.max(0, total - 1)));
    this.state.row_start = start;
    this.state.rows = this.all.slice(start, start + Math.max(1, this.state.view_count));
  }

  get(name) { return this.state[name]; }

  set(name, value) {
    this.state[name] = value;
    this.dirty.add(name);
  }

  on(event, fn) {
    if (!this.handlers.has(event)) this.handlers.set(event, []);
    this.handlers.get(event).push(fn);
  }

  off(event, fn) {
    const list = this.handlers.get(event) || [];
    const at = list.indexOf(fn);
    if (at >= 0) list.splice(at, 1);
  }

  emit(names) {
    for (const name of names) for (const fn of [...(this.handlers.get(`change:${name}`) || [])]) fn();
  }

  // The kernel answers asynchronously; so does this model (a microtask later), in the same order.
  save_changes() {
    const changed = new Set(this.dirty);
    this.dirty.clear();
    const emits = new Set(changed);
    if ([...changed].some((name) => this.p.options.includes(name))) {
      for (const name of this.applyVariant()) emits.add(name);
      this.state.cursor = -1;
      ["total", "cursor", "rows", "row_start"].forEach((name) => emits.add(name));
      this.window();
    }
    if (changed.has("view_start") || changed.has("view_count")) {
      this.window();
      emits.add("rows").add("row_start").add("total");
    }
    if (emits.has("cursor")) {
      const index = this.state.cursor;
      this.state.detail = index >= 0 ? this.p.detail_pool[this.details[index]] || {} : {};
      emits.add("detail");
    }
    queueMicrotask(() => this.emit(emits));
  }

  // Buttons that would ask the kernel: in a file, "open" goes to that run's section if it is there.
  send(message) {
    if (!message || message.action !== "open") return;
    const target = data.panels.find((p) => p.panel === "timeline" && p.summary.run_id === String(message.id).split("@")[0]);
    if (target) document.getElementById(target.anchor).scrollIntoView({ behavior: "smooth" });
  }
}

document.querySelectorAll(".cvs-mount").forEach((el) => {
  const panel = data.panels[Number(el.dataset.index)];
  panels.render({ model: new StaticModel(panel), el });
});
document.body.dataset.mounted = String(data.panels.length);
