// The console: pipelines and their step graphs with live p50/p99, the try-it form, and the
// last requests with their waterfalls. Everything comes from the proxy's own API.
"use strict";

(() => {
  const { el, api, ms } = window.mesh;
  const TOTAL = "(request)"; // the whole request's figures, beside its steps' (recent.py)
  const POLL_MS = 2000;
  let pipelines = {};
  const expanded = new Set(); // the requests whose steps are shown in full

  function node(pipeline, label, kind, lines) {
    return el("div", { class: `node kind-${kind}`, "data-step": label },
      el("div", { class: "name", text: label.split("/").pop() }),
      ...lines.map(([cls, text]) => el("div", { class: cls, text })),
      el("div", { class: "live", "data-live": `${pipeline}|${label}` }));
  }

  // A branch names its variable in its title only: its group's caption says the pattern.
  function callNode(pipeline, label, target, branch = false) {
    if (!target) return node(pipeline, label, "call", []);
    const model = `${target.model}${target.version ? " v" + target.version : ""}`;
    const lines = branch ? [["model", model], ["where", target.address]]
      : [["model", model], ["where", target.endpoint], ["where", target.address]];
    const shown = node(pipeline, label, "call", lines);
    shown.title = `${target.endpoint} = ${target.address}`;
    return shown;
  }

  // A list of steps as a column: one row a step, a parallel step's branches side by side.
  function column(pipeline, steps, targets) {
    const box = el("div", { class: "graph" });
    steps.forEach((entry, i) => {
      if (i) box.append(el("div", { class: "edge" }));
      const [kind, step] = Object.entries(entry)[0];
      if (kind === "call") {
        box.append(callNode(pipeline, step.name, targets[step.name]));
      } else if (kind === "parallel") {
        const branches = Object.keys(targets).filter((k) => k.startsWith(`${step.name}/`));
        const row = el("div", { class: "row" },
          ...branches.map((b) => callNode(pipeline, b, targets[b], true)));
        const from = step.branches_from ? `, a branch per ${step.branches_from.prefix}<NAME>_URL` : "";
        const caption = `parallel ${step.name}: ${step.aggregation || "all_or_nothing"}` +
          (step.combine ? `, ${step.combine.op} of ${step.combine.tensor}` : "") + from;
        box.append(el("div", { class: "group", "data-step": step.name },
          el("div", { class: "caption", text: caption }), row,
          el("div", { class: "live", "data-live": `${pipeline}|${step.name}` })));
      } else if (kind === "switch") {
        box.append(node(pipeline, step.name, "switch", [["model", `switch on ${step.input}`]]));
        for (const c of step.cases || []) {
          const when = JSON.stringify(c.when);
          box.append(el("div", { class: "caption hint", text: (c.steps || []).length
            ? `when ${when}: its own steps` : `when ${when}: stop here` }));
        }
        if ((step.default || []).length) {
          box.append(el("div", { class: "edge" }), el("div", { class: "group" },
            el("div", { class: "caption", text: "otherwise" }),
            column(pipeline, step.default, targets)));
        }
      }
    });
    return box;
  }

  function showPipelines() {
    const box = document.getElementById("pipelines");
    box.replaceChildren();
    for (const [name, about] of Object.entries(pipelines)) {
      const definition = about.definition;
      const given = definition.inputs ? Object.keys(definition.inputs).join(", ") : "image";
      const graph = el("div", { class: "graph" },
        el("div", { class: "node input", text: `request: ${given}` }), el("div", { class: "edge" }),
        column(name, definition.steps, about.targets), el("div", { class: "edge" }),
        el("div", { class: "node output", text: "answer" }));
      box.append(el("article", { class: "pipeline", "data-pipeline": name },
        el("h3", { text: name }), el("p", { class: "about", text: about.description }), graph,
        el("div", { class: "total" }, el("span", { text: `budget ${about.timeout_ms} ms · ` }),
          el("span", { class: "live", "data-live": `${name}|${TOTAL}` }))));
    }
    const select = document.getElementById("try-pipeline");
    select.replaceChildren(...Object.entries(pipelines)
      .filter(([, about]) => !about.definition.inputs)
      .map(([name]) => el("option", { value: name, text: name })));
  }

  async function refreshLatency() {
    const { ok, body } = await api("v1/console/latency");
    if (!ok) return;
    for (const cell of document.querySelectorAll("[data-live]")) {
      const [pipeline, step] = cell.dataset.live.split("|");
      const figures = (body.pipelines[pipeline] || {})[step];
      cell.textContent = figures
        ? `p50 ${ms(figures.p50_ms)} · p99 ${ms(figures.p99_ms)} ms · n=${figures.count}` : "";
    }
  }

  async function refreshRecent(now = false) {
    if (!now && !document.getElementById("recent-live").checked) return;
    const { ok, body } = await api("v1/console/requests?limit=25");
    if (!ok) return;
    const rows = body.requests.flatMap((r) => {
      const good = r.status === "200";
      const status = r.status + (r.cache === "hit" ? " (cache)" : "") + (r.partial ? " partial" : "");
      const row = el("tr", { "data-id": r.id, title: `request ${r.id}: click for its steps` },
        el("td", { text: new Date(r.at * 1000).toLocaleTimeString() }),
        el("td", { text: r.pipeline }),
        el("td", { class: good ? "status-ok" : "status-bad", text: status }),
        el("td", { class: "num", text: ms(r.latency_ms) }),
        el("td", {}, window.mesh.waterfall(r.steps, r.latency_ms, true)));
      row.addEventListener("click", () => {
        if (!expanded.delete(r.id)) expanded.add(r.id);
        refreshRecent(true);
      });
      if (!expanded.has(r.id)) return [row];
      return [row, el("tr", { class: "detail" },
        el("td", { colspan: "5" }, window.mesh.waterfall(r.steps, r.latency_ms)))];
    });
    document.querySelector("#recent tbody").replaceChildren(...rows);
  }

  async function send(event) {
    event.preventDefault();
    const status = document.getElementById("try-status");
    const shown = document.getElementById("try-answer");
    const file = document.getElementById("try-file").files[0];
    const name = document.getElementById("try-pipeline").value;
    status.className = "";
    if (!file) {
      status.textContent = "choose an image first";
      status.className = "error";
      return;
    }
    status.textContent = `sending ${file.name} to ${name}…`;
    shown.replaceChildren();
    const { ok, status: code, body } = await api(`v1/pipelines/${encodeURIComponent(name)}/infer`, {
      method: "POST",
      headers: { "Content-Type": file.type || "application/octet-stream" },
      body: file,
    });
    if (!ok) {
      status.className = "error";
      status.textContent = `${code}: ${body.error || JSON.stringify(body)}`;
      return;
    }
    status.textContent = `answered, request ${body.id}`;
    shown.replaceChildren(await window.mesh.renderAnswer(body, file));
    refreshRecent();
  }

  async function start() {
    const server = await api("v2");
    if (server.ok) {
      document.getElementById("server").textContent = `${server.body.name} ${server.body.version}`;
    }
    const listed = await api("v1/pipelines");
    if (!listed.ok) {
      document.getElementById("pipelines").textContent = `${listed.status}: ${listed.body.error}`;
      return;
    }
    pipelines = listed.body;
    showPipelines();
    document.getElementById("try").addEventListener("submit", send);
    await Promise.all([refreshLatency(), refreshRecent()]);
    document.body.dataset.ready = "true"; // the tests wait for this
    setInterval(() => { refreshLatency(); refreshRecent(); }, POLL_MS);
  }

  start();
})();
