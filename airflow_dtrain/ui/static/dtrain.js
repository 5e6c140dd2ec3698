// The Training jobs pages: JSON from the app (api/...), drawn with textContent only (nothing a job's files
// say is ever read as HTML), charts by vega-embed from the specifications the app builds.
"use strict";
const dtrain = (() => {
  const LIVE = ["running", "waiting"];
  const POLL_MS = 5000;

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function usd(x) {
    if (x === null || x === undefined) return "–";
    return "$" + Number(x).toFixed(Math.abs(x) > 0 && Math.abs(x) < 1 ? 4 : 2);
  }
  function age(unix) {
    if (!unix) return "none yet";
    const s = Math.max(0, Date.now() / 1000 - unix);
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    if (s < 172800) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " days ago";
  }
  function stateBadge(state) { return el("span", state, "state state-" + state.replace(/ /g, "-")); }
  function spendBar(row) {
    const cell = el("td");
    if (!row.budget_usd) { cell.append(el("span", usd(row.spent_usd) + " (no cap)", "money")); return cell; }
    const share = row.spent_usd / row.budget_usd;
    const bar = el("div", null, "bar" + (share >= 1 ? " over" : share >= 0.8 ? " high" : ""));
    bar.setAttribute("role", "meter");
    bar.setAttribute("aria-label", "spend of budget");
    bar.setAttribute("aria-valuenow", row.spent_usd);
    bar.setAttribute("aria-valuemax", row.budget_usd);
    const fill = el("span");
    fill.style.width = Math.min(100, 100 * share).toFixed(1) + "%";
    bar.append(fill);
    cell.append(bar, el("span", usd(row.spent_usd) + " of " + usd(row.budget_usd), "money"));
    return cell;
  }
  function nodes(row) {
    const now = row.nodes === null || row.nodes === undefined ? "–" : row.nodes;
    return row.min_nodes && row.num_nodes && row.min_nodes !== row.num_nodes
      ? now + " (" + row.min_nodes + ".." + row.num_nodes + ")" : String(now);
  }
  function best(row) {
    const sets = Object.entries(row.best || {});
    return sets.length ? sets.map(([k, v]) => k + ": " + Number(v).toFixed(4)).join(", ") : "–";
  }
  async function getJSON(url) {
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok) throw new Error(response.status + " " + (await response.text()));
    return response.json();
  }
  function fill(select, values, chosen) {
    const keep = select.value;
    while (select.options.length > 1) select.remove(1);
    for (const v of values) select.append(new Option(v, v, false, v === (chosen || keep)));
  }

  function jobsPage() {
    const query = { sort: "updated_at", desc: true, page: 1, per_page: 50 };
    const tbody = document.querySelector("#jobs tbody");
    const filters = { owner: "owner", dag: "dag_id", state: "state" };
    async function load() {
      const params = new URLSearchParams({ sort: query.sort, desc: query.desc, page: query.page,
                                           per_page: query.per_page });
      for (const [id, name] of Object.entries(filters)) {
        const v = document.getElementById(id).value;
        if (v) params.set(name, v);
      }
      const data = await getJSON("api/jobs?" + params);
      fill(document.getElementById("owner"), data.owners);
      fill(document.getElementById("dag"), data.dags);
      fill(document.getElementById("state"), data.states);
      tbody.replaceChildren();
      for (const row of data.rows) {
        const tr = el("tr");
        tr.dataset.job = row.job;
        const link = el("a", row.job);
        link.href = "jobs/" + encodeURIComponent(row.dag_id) + "/" + encodeURIComponent(row.entry);
        const jobCell = el("td"); jobCell.append(link);
        for (const p of row.problems || []) jobCell.append(el("div", p, "problem"));
        const stateCell = el("td"); stateCell.append(stateBadge(row.state));
        tr.append(jobCell, el("td", row.owner), el("td", row.dag_id), stateCell,
                  el("td", row.step + (row.steps ? " of " + row.steps : "")), el("td", nodes(row)), spendBar(row),
                  el("td", row.preemptions, "preemptions"), el("td", row.steps_lost, "steps-lost"),
                  el("td", row.resizes), el("td", best(row)),
                  el("td", row.checkpoint_step === null ? "none yet" :
                     "step " + row.checkpoint_step + " (" + age(row.checkpoint_at) + ")"));
        tbody.append(tr);
      }
      const pages = Math.max(1, Math.ceil(data.total / data.per_page));
      document.getElementById("count").textContent = data.total + " jobs";
      document.getElementById("pageinfo").textContent = "page " + data.page + " of " + pages;
      document.getElementById("prev").disabled = data.page <= 1;
      document.getElementById("next").disabled = data.page >= pages;
    }
    document.querySelectorAll("th[data-sort]").forEach((th) => th.addEventListener("click", () => {
      query.desc = query.sort === th.dataset.sort ? !query.desc : true;
      query.sort = th.dataset.sort; query.page = 1; load();
    }));
    for (const id of Object.keys(filters))
      document.getElementById(id).addEventListener("change", () => { query.page = 1; load(); });
    document.getElementById("prev").addEventListener("click", () => { query.page -= 1; load(); });
    document.getElementById("next").addEventListener("click", () => { query.page += 1; load(); });
    load();
    setInterval(load, POLL_MS * 3);
  }

  function jobPage() {
    const [, dag, entry] = location.pathname.match(/\/jobs\/([^/]+)\/([^/]+)\/?$/) || [];
    const api = "../../api/jobs/" + dag + "/" + entry;
    async function load() {
      const data = await getJSON(api);
      const row = data.row;
      document.title = "Training job " + row.job;
      document.getElementById("title").textContent = "Training job " + row.job;
      const facts = document.querySelector("#facts tbody");
      facts.replaceChildren();
      const stateCell = el("td"); stateCell.append(stateBadge(row.state));
      const rows = [["owner", row.owner], ["DAG", row.dag_id], ["state", stateCell],
        ["step", row.step + (row.steps ? " of " + row.steps : "")], ["nodes", nodes(row)],
        ["spend", spendBar(row)], ["preemptions", row.preemptions], ["steps lost", row.steps_lost],
        ["resizes", row.resizes], ["checkpoints", data.checkpoint_uri || "–"], ["models", data.registry_entry || "–"]];
      for (const [k, v] of rows) {
        const tr = el("tr"); tr.append(el("th", k));
        if (v instanceof HTMLElement) { if (v.tagName === "TD") tr.append(v); else { const td = el("td"); td.append(v); tr.append(td); } }
        else tr.append(el("td", v));
        facts.append(tr);
      }
      const problems = document.getElementById("problems");
      problems.replaceChildren(...(row.problems || []).map((p) => el("p", p, "problem")));
      for (const [name, spec] of Object.entries(data.charts))
        vegaEmbed("#chart-" + name, spec, { renderer: "svg", actions: false });
      const attempts = document.querySelector("#attempts tbody");
      attempts.replaceChildren(...data.attempts.map((a) => {
        const tr = el("tr");
        tr.append(el("td", a.attempt), el("td", a.capacity), el("td", a.nodes), el("td", a.price_per_node_hour),
                  el("td", a.launched_at ? new Date(a.launched_at * 1000).toISOString() : "–"),
                  el("td", a.billed_s === null || a.billed_s === undefined ? "–" : Number(a.billed_s).toFixed(1)),
                  el("td", usd(a.dollars)), el("td", a.ended ? "yes" : "running"));
        return tr;
      }));
      const checkpoints = document.querySelector("#checkpoints tbody");
      checkpoints.replaceChildren(...data.checkpoints.map((c) => {
        const tr = el("tr");
        tr.append(el("td", c.step), el("td", c.valid ? (c.best ? "valid (best)" : "valid") : "refused: " + c.why,
                  c.valid ? "" : "problem"), el("td", c.path));
        return tr;
      }));
      const models = document.querySelector("#models tbody");
      models.replaceChildren(...Object.entries(data.models).map(([set, m]) => {
        const tr = el("tr");
        tr.append(el("td", set), el("td", Number(m.loss).toFixed(4)), el("td", m.step), el("td", m.export || "–"));
        return tr;
      }));
      document.getElementById("updated").textContent = "read " + new Date().toLocaleTimeString() +
        (LIVE.includes(row.state) ? " · updates every " + POLL_MS / 1000 + " s" : "");
      if (LIVE.includes(row.state)) setTimeout(load, POLL_MS);
    }
    load().catch((err) => {
      document.getElementById("problems").replaceChildren(el("p", "This job cannot be shown: " + err.message, "problem"));
    });
  }
  return { jobsPage, jobPage };
})();
