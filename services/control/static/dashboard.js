// stare dashboard: polls the control-plane API of this origin and draws the curves on <canvas>.
// Hand-written, no libraries, no network beyond this API. Every chart canvas gets data-points
// (how many points it drew), which the browser test reads.
"use strict";

const POLL_MS = 1000;
const MAX_POINTS = 2000;
const COLORS = ["#1f6fb4", "#d9731a", "#2a9d4b", "#b8336a"];
const rows = [];           // step metrics, in index order
let nextIndex = -MAX_POINTS;  // first poll: the last MAX_POINTS entries

function token() { return sessionStorage.getItem("stare-token") || ""; }

async function api(method, path, body) {
  const headers = { "X-Stare-Actor": "dashboard" };
  if (token()) headers["Authorization"] = "Bearer " + token();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), 10000);
  try {
    const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal: ctl.signal });
    const data = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(data.detail || res.status + " " + res.statusText);
    return data;
  } finally { clearTimeout(timer); }
}

// -- charts ------------------------------------------------------------------------------------

function series(key) {
  return rows.filter(r => typeof r[key] === "number").map(r => [r.step, r[key]]);
}

function draw(id, lines, opts = {}) {
  const canvas = document.getElementById(id);
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 46, R = 10, T = 10, B = 24;
  ctx.clearRect(0, 0, W, H);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
  const pts = lines.flatMap(l => l.points);
  const bandPts = (opts.band || []).flatMap(b => [b[1], b[2]]);
  canvas.dataset.points = String(pts.length);
  if (!pts.length) {
    ctx.fillStyle = "#99a"; ctx.font = "13px sans-serif"; ctx.fillText("no data yet", W / 2 - 35, H / 2);
    return;
  }
  const xs = pts.map(p => p[0]);
  const ys = pts.map(p => p[1]).concat(bandPts.filter(v => typeof v === "number"));
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (opts.ymin !== undefined) y0 = Math.min(y0, opts.ymin);
  if (opts.ymax !== undefined) y1 = Math.max(y1, opts.ymax);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const Y = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  // axes and ticks
  ctx.strokeStyle = "#ccd"; ctx.fillStyle = "#556"; ctx.font = "11px sans-serif"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4;
    ctx.beginPath(); ctx.moveTo(L, Y(y)); ctx.lineTo(W - R, Y(y)); ctx.stroke();
    ctx.fillText(y.toPrecision(3), 2, Y(y) + 4);
  }
  ctx.fillText("step " + x0, L, H - 6);
  ctx.fillText(String(x1), W - R - 30, H - 6);
  // band: shaded area between low and high, per step
  for (const [x, lo, hi] of opts.band || []) {
    if (typeof lo !== "number" || typeof hi !== "number") continue;
    ctx.fillStyle = "rgba(42,157,75,0.15)";
    const w = Math.max((W - L - R) / Math.max(xs.length, 1), 2);
    ctx.fillRect(X(x) - w / 2, Y(hi), w, Y(lo) - Y(hi));
  }
  lines.forEach((line, i) => {
    ctx.strokeStyle = line.color || COLORS[i % COLORS.length];
    ctx.lineWidth = line.width || 2;
    ctx.setLineDash(line.dash || []);
    ctx.beginPath();
    line.points.forEach(([x, y], j) => {
      if (line.steps && j > 0) ctx.lineTo(X(x), Y(line.points[j - 1][1]));
      j ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y));
    });
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillStyle = ctx.strokeStyle;
    ctx.fillText(line.label, L + 8 + i * 90, T + 12);
  });
}

function render() {
  const band = rows.map(r => [r.step, r.band_low, r.band_high]);
  draw("chart-entropy", [
    { label: "entropy", points: series("entropy") },
    { label: "target", points: series("target"), dash: [5, 4], color: "#2a9d4b", width: 1.5, steps: true },
  ], { band, ymin: 0 });
  draw("chart-reward", [{ label: "reward", points: series("reward_mean") }]);
  draw("chart-eval", [{ label: "greedy accuracy", points: series("eval_greedy_accuracy"), color: "#2a9d4b" }], { ymin: 0, ymax: 1 });
  draw("chart-length", [{ label: "length", points: series("response_length_mean"), color: "#d9731a" }]);
  draw("chart-gate", [{ label: "gate", points: series("gate"), steps: true, color: "#b8336a" }], { ymin: 0, ymax: 1 });
  draw("chart-clip", [
    { label: "clip low", points: series("clip_fraction_low") },
    { label: "clip high", points: series("clip_fraction_high"), color: "#d9731a" },
    { label: "approx KL", points: series("approx_kl"), color: "#2a9d4b" },
  ], { ymin: 0 });
  draw("chart-mismatch", [
    { label: "k3 KL", points: series("rollout_mismatch_k3") },
    { label: "masked", points: series("rollout_masked_fraction"), color: "#b8336a" },
    { label: "truncated", points: series("rollout_truncated_fraction"), color: "#d9731a" },
  ], { ymin: 0 });
  draw("chart-wm", [
    { label: "W", points: series("w") },
    { label: "M", points: series("m"), color: "#d9731a" },
  ]);
}

// -- panels --------------------------------------------------------------------------------------

function text(id, value) { document.getElementById(id).textContent = value; }

function fillTable(id, cells) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...cells.map(row => {
    const tr = document.createElement("tr");
    row.forEach(c => {
      const td = document.createElement("td");
      if (c && typeof c === "object") { td.textContent = c.text; td.className = c.cls; } else td.textContent = c;
      tr.appendChild(td);
    });
    return tr;
  }));
}

const fmt = v => typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(4)) : (v === null || v === undefined ? "-" : JSON.stringify(v));

async function poll() {
  try {
    const page = await api("GET", `/v1/metrics/history?offset=${nextIndex}&limit=1000`);
    rows.push(...page.items);
    if (rows.length > MAX_POINTS) rows.splice(0, rows.length - MAX_POINTS);
    nextIndex = page.next;
    const st = await api("GET", "/v1/status");
    text("run", "run: " + st.run_id);
    const phase = document.getElementById("phase");
    phase.textContent = st.paused && st.phase !== "paused" ? st.phase + " (pausing)" : st.phase;
    phase.className = "pill " + st.phase;
    phase.title = st.reason || "";  // phase down: why, and what to do
    text("step", "step " + fmt(st.step));
    fillTable("roles", st.roles.map(r => [r.role, r.name, r.host, r.pid, r.age_s.toFixed(1) + " s ago",
      { text: r.state, cls: r.state }]));  // alive, down (no heartbeat: crashed or killed), gone (stopped)
    try {
      const ent = await api("GET", "/v1/entropy");
      fillTable("controller", Object.keys(ent).filter(k => k !== "pending" && k !== "updated_at")
        .map(k => [k, fmt(ent[k])]).concat([["pending changes", String(ent.pending.length)]]));
      const target = document.getElementById("f-target");
      if (!target.value && document.activeElement !== target) target.value = ent.target;
    } catch (e) { fillTable("controller", [["controller", e.message]]); }
    const audit = await api("GET", "/v1/entropy/audit?limit=8");
    fillTable("audit", audit.reverse().map(a => [a.id, a.who, JSON.stringify(a.old) + " \u2192 " + JSON.stringify(a.new),
      a.error ? a.error : fmt(a.applied_step)]));
    text("conn", "updated " + new Date().toLocaleTimeString());
    render();
  } catch (e) {
    text("conn", "API: " + e.message);
  }
}

function message(msg) { text("form-message", msg); }

document.getElementById("f-token").addEventListener("change", e => sessionStorage.setItem("stare-token", e.target.value.trim()));

document.getElementById("entropy-form").addEventListener("submit", async e => {
  e.preventDefault();
  sessionStorage.setItem("stare-token", document.getElementById("f-token").value.trim() || token());
  const body = { target: parseFloat(document.getElementById("f-target").value) };
  const lo = document.getElementById("f-band-low").value, hi = document.getElementById("f-band-high").value;
  body.band = lo !== "" && hi !== "" ? [parseFloat(lo), parseFloat(hi)] : null;
  try {
    const res = await api("PATCH", "/v1/entropy", body);
    message(`change #${res.audit.id} accepted: ${JSON.stringify(res.audit.new)}; applies at the next step`);
  } catch (err) { message("refused: " + err.message); }
  poll();
});

for (const [id, path] of [["b-pause", "pause"], ["b-resume", "resume"], ["b-checkpoint", "checkpoint"]]) {
  document.getElementById(id).addEventListener("click", async () => {
    try { message((await api("POST", "/v1/run/" + path)).message); } catch (err) { message("refused: " + err.message); }
    poll();
  });
}

poll();
setInterval(poll, POLL_MS);
