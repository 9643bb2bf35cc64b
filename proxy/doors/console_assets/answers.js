// The try-it form's answer: digits' probabilities as bars, OCR's lines drawn on the image,
// anything else as JSON; and the request's waterfall below.
"use strict";

(() => {
  const { el } = window.mesh;

  function probabilities(result) {
    const values = result.probabilities;
    const best = values.indexOf(Math.max(...values));
    const bars = el("div", { class: "bars", id: "answer-probabilities" });
    values.forEach((p, digit) => {
      const bar = el("div", { class: "bar" + (digit === best ? " best" : ""),
        style: { width: `${Math.max(0.5, 100 * p)}%` } });
      bars.append(el("div", { text: String(digit) }), el("div", {}, bar),
        el("div", { class: "value", text: p.toFixed(3) }));
    });
    const members = el("div", { class: "hint" });
    for (const [name, member] of Object.entries(result.members || {})) {
      members.append(el("div", { text: `${name}: ${member.label}` }));
    }
    return el("div", { class: "answer" },
      el("div", {}, el("div", { class: "hint", text: "label" }),
        el("div", { class: "label", id: "answer-label", text: String(result.label) })),
      bars, members);
  }

  // A box's corners in the image's pixels, outlined on the canvas; its first corner back.
  function outline(g, box, scale, colour, width) {
    const [first, ...rest] = box.map(([x, y]) => [x * scale, y * scale]);
    g.strokeStyle = colour;
    g.lineWidth = width;
    g.beginPath();
    g.moveTo(...first);
    for (const point of rest) g.lineTo(...point);
    g.closePath();
    g.stroke();
    return first;
  }

  // Boxes in the image's own pixels (the pipeline answers them so), scaled to the canvas:
  // each word's thin, each line's thick with its text above.
  async function lines(result, file) {
    let picture = null;
    try {
      picture = await createImageBitmap(file);
    } catch {
      picture = null; // a format the browser cannot draw (TIFF): the boxes alone
    }
    const points = result.lines.flatMap((line) => line.box);
    const width = picture ? picture.width : Math.max(1, ...points.map((p) => p[0]));
    const height = picture ? picture.height : Math.max(1, ...points.map((p) => p[1]));
    const scale = Math.min(1, 720 / width);
    const canvas = el("canvas", { id: "answer-canvas", width: Math.round(width * scale),
      height: Math.round(height * scale) });
    const g = canvas.getContext("2d");
    if (picture) g.drawImage(picture, 0, 0, canvas.width, canvas.height);
    g.font = "13px sans-serif";
    for (const line of result.lines) {
      for (const word of line.words || []) {
        outline(g, word.box, scale, "rgba(221, 107, 32, 0.9)", 1);
      }
      const first = outline(g, line.box, scale, "rgba(43, 108, 176, 0.9)", 2);
      const label = line.text;
      const textWidth = g.measureText(label).width;
      g.fillStyle = "rgba(43, 108, 176, 0.85)";
      g.fillRect(first[0], Math.max(0, first[1] - 16), textWidth + 6, 16);
      g.fillStyle = "#fff";
      g.fillText(label, first[0] + 3, Math.max(12, first[1] - 4));
    }
    const table = el("table", { class: "lines", id: "answer-lines" });
    for (const line of result.lines) {
      table.append(el("tr", {}, el("td", { text: line.text }),
        el("td", { class: "hint", text: line.score.toFixed(3) })));
    }
    if (!result.lines.length) table.append(el("tr", {}, el("td", { text: "no text found" })));
    return el("div", { class: "answer" }, canvas, table);
  }

  window.mesh.renderAnswer = async (answer, file) => {
    const result = answer.result || {};
    let shown;
    if (Array.isArray(result.probabilities) && typeof result.probabilities[0] === "number") {
      shown = probabilities(result);
    } else if (Array.isArray(result.lines)) {
      shown = await lines(result, file);
    } else {
      shown = el("pre", { class: "json", text: JSON.stringify(result, null, 2) });
    }
    const about = `${answer.pipeline}: ${window.mesh.ms(answer.latency_ms)} ms` +
      (answer.partial ? ", partial (a branch failed)" : "");
    return el("div", {}, shown, el("h3", { class: "hint", text: about }),
      window.mesh.waterfall(answer.steps, answer.latency_ms));
  };
})();
