// agentrl viewer: plain DOM code, no framework, no external assets. Data comes from /api/*; the
// page polls every 2 s so a run that is still writing shows its new episodes and metrics.
"use strict";

const POLL_MS = 2000;
const CURVES = [
  ["reward_mean", "reward (batch mean)"],
  ["success_rate", "success (batch)"],
  ["eval_success_rate", "held-out success"],
  ["buffer/batch_staleness_mean", "staleness (versions)"],
  ["learner/loss", "loss"],
  ["learner/grad_norm", "grad norm"],
  ["step_seconds", "step seconds"],
  ["trainer_wait_s", "trainer wait (s)"],
  ["tokens_per_s", "tokens / s"],
];
const VERSION_COLOURS = ["#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed", "#0891b2"];
const state = { run: null, selected: null, tab: "episodes", listSignature: "", listRequest: 0 };
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

async function api(route, params = {}) {
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v != null));
  const response = await fetch(`/api/${route}?${query}`);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function setOptions(select, values, label = (v) => String(v)) {
  const current = select.value;
  const keep = select.dataset.all === "no" ? [] : [["", "all"]];
  const wanted = keep.concat(values.map((v) => [String(v), label(v)]));
  const signature = JSON.stringify(wanted);
  if (select.dataset.signature === signature) return;
  select.dataset.signature = signature;
  select.replaceChildren(...wanted.map(([value, text]) => el("option", { value, text })));
  if (wanted.some(([value]) => value === current)) select.value = current;
}

function filters() {
  return {
    run: state.run,
    step: $("filter-step").value,
    env: $("filter-env").value,
    stop_reason: $("filter-stop").value,
    source: $("filter-source").value,
    success: $("filter-success").value,
    min_reward: $("filter-min-reward").value,
    max_reward: $("filter-max-reward").value,
    seed: $("filter-seed").value,
  };
}

async function refreshRuns() {
  const runs = await api("runs");
  const select = $("run-select");
  select.dataset.all = "no";
  setOptions(select, runs.map((r) => r.name), (name) => {
    const run = runs.find((r) => r.name === name);
    return `${name === "." ? run.path.split("/").pop() : name} (${run.episodes} episodes)`;
  });
  state.run = select.value || (runs[0] && runs[0].name);
  const run = runs.find((r) => r.name === state.run);
  if (!run) return;
  setOptions($("filter-step"), run.steps);
  setOptions($("filter-env"), run.envs);
  setOptions($("filter-stop"), run.stop_reasons);
  setOptions($("filter-source"), run.sources);
  $("tab-curves").disabled = !run.has_metrics;
}

async function refreshList() {
  // A poll sent before a filter changed may answer after the filtered request: only the newest
  // request may draw the list.
  const request = ++state.listRequest;
  const result = await api("episodes", filters());
  if (request !== state.listRequest) return;
  const signature = JSON.stringify([result.total, result.episodes.map((e) => e.key)]);
  if (signature === state.listSignature) return;
  state.listSignature = signature;
  $("list-count").textContent =
    `${result.total} episodes` + (result.total > result.episodes.length ? ` (newest ${result.episodes.length} shown)` : "");
  const rows = result.episodes.map((e) => {
    const versions = e.min_version == null ? "" : e.min_version === e.max_version ? `v${e.min_version}` : `v${e.min_version}–${e.max_version}`;
    const row = el("tr", { "data-key": e.key, onclick: () => selectEpisode(e.key) },
      el("td", { text: e.step ?? "" }), el("td", { text: e.env_id.split("/").pop(), title: `${e.env_id} · ${e.source}` }),
      el("td", { text: e.seed ?? "" }), el("td", { class: `stop-${e.stop_reason}`, text: e.stop_reason }),
      el("td", { text: formatReward(e.reward) }), el("td", { text: e.success ? "✓" : "" }),
      el("td", { text: e.turns }), el("td", { text: versions }));
    if (e.key === state.selected) row.classList.add("selected");
    return row;
  });
  $("episode-table").tBodies[0].replaceChildren(...rows);
}

function formatReward(value) {
  // Enough digits for small shaping rewards; -0 shows as 0.
  return Number(value.toPrecision(4)).toString();
}

function tokenSpan(token) {
  const p = Math.exp(token.logprob);
  // Low-probability tokens are shaded red; the underline colour marks the policy version.
  const span = el("span", {
    class: "tok",
    title: `id ${token.id}  logprob ${token.logprob.toFixed(4)}  p ${p.toFixed(3)}  version ${token.version}`,
    text: token.text ?? `‹${token.id}›`,
  });
  span.style.background = `rgba(239, 68, 68, ${(0.75 * (1 - p)).toFixed(3)})`;
  span.style.borderBottomColor = VERSION_COLOURS[((token.version % VERSION_COLOURS.length) + VERSION_COLOURS.length) % VERSION_COLOURS.length];
  return span;
}

function extraBlocks(extra) {
  // Fields a newer Turn carries (tool calls, tool messages) are shown generically.
  const blocks = [];
  for (const [name, value] of Object.entries(extra || {})) {
    if (value == null || (Array.isArray(value) && value.length === 0)) continue;
    if (Array.isArray(value) && value.every((m) => m && typeof m === "object" && "role" in m)) {
      for (const message of value) {
        blocks.push(el("div", { class: `msg ${message.role === "tool" ? "tool" : "env"}` },
          el("span", { class: "role", text: `${message.role}${message.name ? " · " + message.name : ""}` }),
          typeof message.content === "string" ? message.content : JSON.stringify(message.content, null, 1),
          message.tool_calls ? el("pre", { class: "extra", text: JSON.stringify(message.tool_calls, null, 1) }) : null));
      }
    } else {
      blocks.push(el("pre", { class: "extra", text: `${name}: ${JSON.stringify(value, null, 1)}` }));
    }
  }
  return blocks;
}

function renderEpisode(episode, container) {
  const children = [
    el("h2", { text: `${episode.env_id} · seed ${episode.seed} · ${episode.stop_reason}` }),
    el("div", { class: "meta", text:
      `reward ${episode.reward.toFixed(3)} · success ${episode.success ? "yes" : "no"} · ${episode.turns.length} turns · ` +
      `${episode.action_tokens} action tokens · step ${episode.step ?? "–"} · ${episode.source}` +
      (episode.policy ? ` · policy ${episode.policy}` : "") + ` · ${episode.duration.toFixed(2)} s` }),
    el("div", { class: "legend", text: "action tokens: red = low probability under the sampling policy; underline colour = policy version; hover for numbers" }),
  ];
  if (episode.error) children.push(el("div", { class: "msg env", text: `error: ${episode.error}` }));
  if (episode.system_prompt) children.push(el("div", { class: "msg system" }, el("span", { class: "role", text: "system" }), episode.system_prompt));
  episode.turns.forEach((turn, index) => {
    const reward = el("span", { class: `turn-reward ${turn.reward > 0 ? "pos" : turn.reward < 0 ? "neg" : ""}`,
      "data-reward": String(turn.reward), text: `reward ${formatReward(turn.reward)}` });
    const agent = el("div", { class: "msg agent" },
      el("span", { class: "role", text: ["agent", `turn ${index + 1}`, turn.finish_reason, `${turn.policy_seconds.toFixed(2)} s`].filter(Boolean).join(" · ") }));
    if (turn.tokens.length) agent.append(...turn.tokens.map(tokenSpan));
    else agent.append(turn.action);
    agent.append(reward);
    const infoKeys = Object.keys(turn.info || {});
    children.push(
      el("div", { class: "msg env turn", "data-turn": index },
        el("span", { class: "role", text: `env · observation · ${turn.prompt_tokens} prompt tokens` }), turn.observation),
      agent,
      ...extraBlocks(turn.extra),
      infoKeys.length ? el("pre", { class: "extra", text: `info: ${JSON.stringify(turn.info)}` }) : null,
    );
  });
  if (episode.final_observation) children.push(el("div", { class: "msg env" }, el("span", { class: "role", text: "env · final observation" }), episode.final_observation));
  container.replaceChildren(...children.filter((c) => c != null));
}

async function selectEpisode(key) {
  state.selected = key;
  for (const row of $("episode-table").tBodies[0].rows) row.classList.toggle("selected", row.dataset.key === key);
  const episode = await api("episode", { run: state.run, key });
  renderEpisode(episode, $("episode-detail"));
  $("compare-detail").hidden = true;
  // Same env and seed under other policies (other steps, evaluations, checkpoints): side by side.
  const same = await api("episodes", { run: state.run, env: episode.env_id, seed: episode.seed ?? "" });
  const others = same.episodes.filter((e) => e.key !== key);
  const select = $("compare-select");
  select.replaceChildren(el("option", { value: "", text: `${others.length} other episodes on seed ${episode.seed}` }),
    ...others.map((e) => el("option", { value: e.key,
      text: `step ${e.step ?? "–"} · ${e.source} · v${e.max_version ?? "?"} · reward ${e.reward.toFixed(2)} · ${e.stop_reason}` })));
  $("compare-bar").hidden = others.length === 0;
}

async function compareWith(key) {
  const pane = $("compare-detail");
  if (!key) { pane.hidden = true; return; }
  renderEpisode(await api("episode", { run: state.run, key }), pane);
  pane.hidden = false;
}

function chart(title, points) {
  const width = 340, height = 170, pad = 30;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => pad + ((x - x0) / (x1 - x0 || 1)) * (width - pad - 8);
  const sy = (y) => height - pad + 8 - ((y - y0) / (y1 - y0)) * (height - pad - 4);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text != null) node.textContent = text;
    svg.append(node);
  };
  add("line", { x1: pad, y1: height - pad + 8, x2: width - 8, y2: height - pad + 8, stroke: "#9ca3af" });
  add("line", { x1: pad, y1: 4, x2: pad, y2: height - pad + 8, stroke: "#9ca3af" });
  add("text", { x: 2, y: 12, "font-size": 9 }, y1.toPrecision(3));
  add("text", { x: 2, y: height - pad + 8, "font-size": 9 }, y0.toPrecision(3));
  add("text", { x: width - 40, y: height - 4, "font-size": 9 }, `step ${x1}`);
  add("polyline", { fill: "none", stroke: "#2563eb", "stroke-width": 1.5,
    points: points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ") });
  if (points.length < 40) for (const [x, y] of points) add("circle", { cx: sx(x), cy: sy(y), r: 2, fill: "#2563eb" });
  return el("div", { class: "chart" }, el("h3", { text: title }), svg);
}

async function refreshCurves() {
  const records = await api("metrics", { run: state.run });
  const charts = [];
  for (const [key, title] of CURVES) {
    const points = records.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]);
    if (points.length) charts.push(chart(title, points));
  }
  $("curves").replaceChildren(...(charts.length ? charts : [el("p", { class: "hint", text: "This run has no metrics yet." })]));
}

async function poll() {
  try {
    await refreshRuns();
    if (state.tab === "episodes") await refreshList();
    else await refreshCurves();
    $("status").textContent = "";
    $("live").classList.remove("stale");
  } catch (error) {
    $("status").textContent = String(error.message || error);
    $("live").classList.add("stale");
  }
}

function showTab(tab) {
  state.tab = tab;
  for (const button of document.querySelectorAll(".tab")) button.classList.toggle("active", button.dataset.tab === tab);
  $("episodes-view").hidden = tab !== "episodes";
  $("curves-view").hidden = tab !== "curves";
  poll();
}

for (const button of document.querySelectorAll(".tab")) button.addEventListener("click", () => showTab(button.dataset.tab));
for (const id of ["filter-step", "filter-env", "filter-stop", "filter-source", "filter-success", "filter-min-reward", "filter-max-reward", "filter-seed"]) {
  $(id).addEventListener("change", () => { state.listSignature = ""; refreshList().catch((e) => ($("status").textContent = e.message)); });
}
$("run-select").addEventListener("change", () => { state.listSignature = ""; state.selected = null; poll(); });
$("compare-select").addEventListener("change", (event) => compareWith(event.target.value));
poll();
setInterval(poll, POLL_MS);
