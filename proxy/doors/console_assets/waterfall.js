// Shared by the console's scripts: building elements (text only through textContent: pipeline
// names, errors and OCR text come from outside), the API, and a request's waterfall.
"use strict";

window.mesh = {
  el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key === "style") Object.assign(node.style, value);
      else node.setAttribute(key, value);
    }
    for (const child of children) if (child) node.append(child);
    return node;
  },

  // The proxy's JSON API, relative to the page (the console may sit behind a path prefix).
  // The browser sends the credentials it was asked for (HTTP Basic, the API key as password).
  async api(path, options = {}) {
    const response = await fetch(`../${path}`, { credentials: "same-origin", ...options });
    let body = null;
    const type = response.headers.get("content-type") || "";
    if (type.includes("json")) body = await response.json();
    else body = { error: await response.text() };
    return { ok: response.ok, status: response.status, body };
  },

  ms(value) {
    return value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
  },

  kind(step) {
    if (step.status === "ok") return "ok";
    return ["partial", "cancelled"].includes(step.status) ? step.status : "failed";
  },

  describe(step) {
    const { ms } = window.mesh;
    const detail = step.error ? `: ${step.error}` : step.cache ? ` (cache ${step.cache})` : "";
    const name = step.variant === "canary" ? `${step.name} (canary)` : step.name;
    return `${name} ${step.status}${detail}, ${ms(step.latency_ms)} ms from ${ms(step.start_ms)} ms`;
  },

  // One row per step, a bar from when it began to when it ended, on the request's scale;
  // `compact`: one thin lane a step, no labels (a list's row; the title names each).
  waterfall(steps, totalMs, compact = false) {
    const { el, ms, kind, describe } = window.mesh;
    const end = Math.max(totalMs, ...steps.map((s) => s.start_ms + s.latency_ms), 0.001);
    const ordered = [...steps].sort((a, b) => a.start_ms - b.start_ms);
    const place = (start, length) => ({ left: `${(100 * start) / end}%`, width: `${(100 * length) / end}%` });
    if (compact) {
      const lanes = el("div", { class: "lanes", style: { height: `${4 * ordered.length + 4}px` } });
      lanes.append(el("div", { class: "span request", title: `request: ${ms(totalMs)} ms`,
        style: { ...place(0, totalMs), top: "0px" } }));
      ordered.forEach((step, i) => lanes.append(el("div", { class: `span ${kind(step)}`,
        title: describe(step), style: { ...place(step.start_ms, step.latency_ms), top: `${4 * i + 4}px` } })));
      return lanes;
    }
    const box = el("div", { class: "waterfall" });
    const bar = (name, start, length, kind, title) => {
      const span = el("div", {
        class: `span ${kind}`,
        title,
        style: place(start, length),
      });
      box.append(el("div", { class: "step", text: name }), el("div", { class: "track" }, span));
      box.append(el("div", { class: "ms", text: `${ms(length)} ms` }));
    };
    bar("request", 0, totalMs, "request", `the whole request: ${ms(totalMs)} ms`);
    for (const step of ordered) bar(step.name, step.start_ms, step.latency_ms, kind(step), describe(step));
    return box;
  },
};
