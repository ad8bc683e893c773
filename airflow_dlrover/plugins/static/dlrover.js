/* DLRover-RM views: fetch the /dlrover/api JSON and draw it with the vendored Chart.js.
 *
 * Every chart's canvas gets data-points (its data points, all datasets) and data-series (points per
 * dataset label) once drawn; the body gets data-rendered="true" when the page is complete, or
 * "error" (with the message shown) when a request failed. Tests and screenshots wait on them. */
(function () {
  "use strict";

  const COLORS = { worker: "#0b6bcb", ps: "#dd6b20", model: "#0b6bcb", band: "rgba(11,107,203,0.15)",
    measured: "#1a202c", training: "#38a169", keep: "#a0aec0", resize: "#2f855a", revert: "#c53030",
    failure: "#c53030", recovery: "#805ad5", alt: "#718096", baseline: "#d69e2e" };
  const AXIS_TITLES = { workers: "workers (w)", ps: "parameter servers (p)", worker_cpu: "CPU per worker (λw, cores)",
    ps_cpu: "CPU per PS (λp, cores)" };

  const base = () => document.body.dataset.base;
  const $ = (id) => document.getElementById(id);

  async function api(path) {
    const response = await fetch(`${base()}/api${path}`, { credentials: "same-origin", headers: { Accept: "application/json" } });
    const data = await response.json().catch(() => null);
    if (!response.ok) {
      const detail = data && data.detail;
      throw new Error((detail && (detail.message || JSON.stringify(detail))) || `${response.status} ${response.statusText}`);
    }
    return data;
  }

  const num = (v, digits = 0) => (v == null ? "—" : Number(v).toLocaleString("en", { maximumFractionDigits: digits }));
  const pct = (v) => (v == null ? "—" : `${Math.round(100 * v)} %`);
  const shape = (c) => (c ? `${c.workers}w×${num(c.worker_cpu, 2)}` + (c.ps ? ` + ${c.ps}ps×${num(c.ps_cpu, 2)}` : ", no PS") : "—");

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v; else if (k === "html") node.innerHTML = v; else node.setAttribute(k, v);
    }
    for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(child ?? "—"));
    return node;
  }

  function row(tbody, cells) {
    const tr = el("tr");
    for (const cell of cells) {
      const td = typeof cell === "object" && cell !== null && !(cell instanceof Node) ? el("td", cell.attrs, cell.value) : el("td", {}, cell);
      tr.append(td);
    }
    tbody.append(tr);
    return tr;
  }

  function bar(value) {
    if (value == null) return "—";
    const span = el("span", { title: pct(value) }, el("span", { class: "bar" }, el("i", { style: `width:${Math.min(100, 100 * value)}%` })), ` ${pct(value)}`);
    return span;
  }

  /* Vertical dashed lines at marked times (resizes, failures): Chart.js's plugin API. */
  const markLines = {
    id: "markLines",
    afterDatasetsDraw(chart, _args, options) {
      const lines = (options && options.lines) || [];
      const { ctx, chartArea: area, scales: { x } } = chart;
      ctx.save();
      ctx.setLineDash([4, 4]);
      ctx.font = "11px system-ui, sans-serif";
      for (const line of lines) {
        const px = x.getPixelForValue(line.t);
        if (px < area.left || px > area.right) continue;
        ctx.strokeStyle = ctx.fillStyle = line.color;
        ctx.beginPath(); ctx.moveTo(px, area.top); ctx.lineTo(px, area.bottom); ctx.stroke();
        ctx.fillText(line.text, px + 3, area.top + 11);
      }
      ctx.restore();
    },
  };

  const charts = {};
  function chart(id, config) {
    const canvas = $(id);
    if (charts[id]) charts[id].destroy();
    config.options = Object.assign({ animation: false, responsive: true, maintainAspectRatio: false }, config.options);
    config.options.plugins = Object.assign({
      legend: { labels: { boxWidth: 12, filter: (item) => !item.text.startsWith("_") } },
      tooltip: { callbacks: { label: (ctx) => (ctx.raw && ctx.raw.label) || `${ctx.dataset.label}: ${num(ctx.parsed.y, 1)}` } },
    }, config.options.plugins);
    const made = new Chart(canvas, config);
    charts[id] = made;
    const series = {};
    for (const ds of made.data.datasets) {
      series[ds.label] = ds.data.filter((p) => p != null && (typeof p !== "object" || p.y != null)).length;
    }
    canvas.dataset.series = JSON.stringify(series);
    canvas.dataset.points = Object.values(series).reduce((a, b) => a + b, 0);
    return made;
  }

  const roundUp = (v) => { const unit = 10 ** Math.floor(Math.log10(v)) / 2; return Math.ceil(v / unit) * unit; };
  const xy = (xs, ys) => xs.map((x, i) => ({ x, y: ys[i] }));
  const linear = (title, extra) => Object.assign({ type: "linear", title: { display: true, text: title } }, extra);

  /* ---------------------------------------------------------------------------------- pages */

  async function jobsPage() {
    const jobs = await api("/jobs");
    const tbody = $("jobs").querySelector("tbody");
    $("no-jobs").hidden = jobs.length > 0;
    for (const job of jobs) {
      const r = job.last_run, u = r.utilisation || {};
      const plan = r.plan ? `${shape(r.plan)} (${num(r.plan.worker_memory_mb)} / ${num(r.plan.ps_memory_mb)} MB)` : "—";
      row(tbody, [
        el("span", {}, el("a", { href: `${base()}/jobs/${job.id}` }, job.job),
          el("div", { class: "muted" }, [job.dag_id || "no DAG", job.task_group].filter(Boolean).join(" / "))),
        { attrs: { class: "num" }, value: String(job.runs) },
        el("a", { href: `${base()}/runs/${r.id}` }, `run ${r.id} · ${r.run_key}`),
        el("span", { class: `status-${r.status}` }, r.status),
        plan,
        { attrs: { class: "num" }, value: num(r.predicted_throughput ?? (r.plan && r.plan.predicted_throughput)) },
        { attrs: { class: "num" }, value: num(r.measured_throughput) },
        el("span", {}, el("div", {}, "w ", bar(u.worker_cpu)), el("div", {}, "ps ", bar(u.ps_cpu))),
        el("span", {}, el("div", {}, "w ", bar(u.worker_memory)), el("div", {}, "ps ", bar(u.ps_memory))),
        { attrs: { class: "num" }, value: num(r.resizes) },
        { attrs: { class: "num" }, value: num(r.recoveries) },
      ]);
    }
  }

  async function runsPage() {
    const job = document.body.dataset.job;
    const runs = await api(`/jobs/${job}/runs`);
    const tbody = $("runs").querySelector("tbody");
    for (const r of runs) {
      row(tbody, [
        el("a", { href: `${base()}/runs/${r.id}` }, `run ${r.id}`), r.run_key, (r.started || "").replace("T", " ").slice(0, 19),
        el("span", { class: `status-${r.status}` }, r.status),
        { attrs: { class: "num" }, value: num(r.predicted_throughput) }, { attrs: { class: "num" }, value: num(r.measured_throughput) },
        { attrs: { class: "num" }, value: num(r.jct_s) }, { attrs: { class: "num" }, value: num(r.resizes) },
        { attrs: { class: "num" }, value: num(r.recoveries) },
      ]);
    }
    chart("chart-runs", {
      type: "bar",
      data: {
        labels: runs.map((r) => `run ${r.id}`),
        datasets: [
          { label: "predicted samples/s", data: runs.map((r) => r.predicted_throughput), backgroundColor: COLORS.band, borderColor: COLORS.model, borderWidth: 1 },
          { label: "measured samples/s", data: runs.map((r) => r.measured_throughput), backgroundColor: COLORS.training },
        ],
      },
      options: { scales: { y: { beginAtZero: true, title: { display: true, text: "samples/s" } } } },
    });
  }

  /* Today's model against the one the job continued from (the report's model_comparison). */
  function comparison(c) {
    if (!c) return el("data", { id: "model-comparison" }, "— (the job did not continue from an earlier model)");
    const metric = (name, label) => {
      const [today, before, change] = [c[name], c[`previous_${name}`], c[`${name}_change`]];
      const fixed = (v) => (v == null ? "—" : Number(v).toFixed(4));
      const signed = change == null ? "" : ` (${change >= 0 ? "+" : "−"}${Math.abs(change).toFixed(4)})`;
      return `${label} ${fixed(today)} vs ${fixed(before)}${signed}`;
    };
    const uri = c.previous_uri || "";
    return el("data", { id: "model-comparison", value: uri, title: `previous model: ${uri}` },
      `${metric("auc", "AUC")} · ${metric("log_loss", "log loss")}`);
  }

  function facts(run) {
    const s = run.summary || {}, job = s.job || {}, u = s.utilisation || {};
    const items = [
      ["status", run.status], ["Airflow run", run.run_key], ["started", (run.started || "").replace("T", " ").slice(0, 19)],
      ["JCT", s.jct_s == null ? "—" : `${num(s.jct_s)} s`],
      ["profiling", s.profile_s == null ? "—" : `${num(s.profile_s)} s (${pct(s.profile_share)}, ${s.probes} probes, ${s.warm_start ? "warm" : "cold"})`],
      ["profiling cost", s.profile_cost_s == null ? "—" : `${num(s.profile_cost_s)} s (${pct(s.profile_cost_share)}: the job trained while profiled)`],
      ["predicted / measured", `${num(s.predicted_throughput)} / ${num(s.measured_throughput)} samples/s`],
      ["CPU used (w / ps)", `${pct(u.worker_cpu)} / ${pct(u.ps_cpu)}`], ["memory used (w / ps)", `${pct(u.worker_memory)} / ${pct(u.ps_memory)}`],
      ["resizes", num(s.resizes)], ["recoveries", num((s.recoveries || []).length)],
      ["samples trained / lost", job.samples_trained == null ? "—" : `${num(job.samples_trained)} / ${num(s.samples_lost)}`],
      ["held-out AUC", job.eval_auc == null ? "—" : num(job.eval_auc, 3)],
      ["today vs previous model (same held-out rows)", run.summary ? comparison(s.model_comparison) : "—"],
      ["records", `${run.counts.samples} samples, ${run.counts.models} models, ${run.counts.plans} plans, ${run.counts.decisions} decisions, ${run.counts.events} events`],
    ];
    const box = $("facts");
    box.replaceChildren(...items.map(([k, v]) => el("div", {}, el("span", {}, k), el("b", {}, v))));
    if (!run.summary) box.append(el("div", {}, el("span", {}, "report"), el("b", {}, "not yet: the run has no report (still running, or its report task did not run)")));
  }

  async function curves(runId, index) {
    const data = await api(`/runs/${runId}/curves?model=${index}`);
    const b = data.base;
    $("curve-base").textContent = `the ${data.base_from} (${shape(b)}, batch ${b.batch_size})`;
    const fit = data.fit || {};
    $("fit-quality").textContent = `Model ${data.model_index + 1} of ${data.models}: sharpness q = ${data.sharpness}; in-sample MAPE ${pct(fit.in_sample_mape)}, ` +
      `out-of-sample MAPE ${pct(fit.out_of_sample_mape)} (${fit.out_of_sample_method || "—"}), relative noise ${pct(fit.relative_noise)}` +
      (fit.pinned && Object.keys(fit.pinned).length ? `; pinned: ${Object.entries(fit.pinned).map(([k, v]) => `${k} (${v})`).join(", ")}` : "");
    for (const [axis, curve] of Object.entries(data.axes)) {
      const point = (p) => ({ x: p.x, y: p.y, label: `${shape(p.config)}: measured ${num(p.y)}/s, model ${num(p.predicted)}/s (${p.stage})` });
      const planY = curve.mean[curve.x.findIndex((x) => Math.abs(x - b[axis]) < 1e-9)];
      // the band widens fast away from the samples: scale to the curve and the points, not to the band
      const top = roundUp(1.25 * Math.max(...curve.mean, ...curve.points.map((p) => p.y)));
      chart(`chart-curve-${axis}`, {
        type: "line",
        data: {
          datasets: [
            { label: "_band_low", data: xy(curve.x, curve.lower), borderWidth: 0, pointRadius: 0, fill: false },
            { label: "90 % band", data: xy(curve.x, curve.upper), borderWidth: 0, pointRadius: 0, fill: "-1", backgroundColor: COLORS.band },
            { label: "model", data: xy(curve.x, curve.mean), borderColor: COLORS.model, borderWidth: 2, pointRadius: 0 },
            { label: "profile, on this slice", data: curve.points.filter((p) => p.stage === "profile" && p.on_slice).map(point),
              showLine: false, pointRadius: 5, backgroundColor: COLORS.measured, borderColor: COLORS.measured },
            { label: "profile, elsewhere", data: curve.points.filter((p) => p.stage === "profile" && !p.on_slice).map(point),
              showLine: false, pointRadius: 5, backgroundColor: "#fff", borderColor: COLORS.measured, borderWidth: 1.5 },
            { label: "training windows", data: curve.points.filter((p) => p.stage !== "profile").map(point),
              showLine: false, pointRadius: 2.5, backgroundColor: COLORS.training, borderColor: COLORS.training },
            { label: data.base_from, data: planY == null ? [] : [{ x: b[axis], y: planY, label: `${data.base_from}: model ${num(planY)}/s` }],
              showLine: false, pointStyle: "star", pointRadius: 9, borderColor: COLORS.revert, borderWidth: 2 },
          ],
        },
        options: { scales: { x: linear(AXIS_TITLES[axis]), y: linear("samples/s", { beginAtZero: true, max: top }) } },
      });
    }
  }

  function planCharts(canvasId, tableId, plans) {
    const chosen = plans.chosen, alternatives = plans.alternatives || [], front = [...(plans.pareto_front || [])].sort((a, c) => a.cores - c.cores);
    const label = (name, r) => `${name}: ${shape(r)} · ${num(r.cores, 2)} cores, ${num(r.memory_mb)} MB → ${num(r.predicted_throughput)}/s`;
    const datasets = [
      { label: "Pareto front", data: front.map((r) => ({ x: r.cores, y: r.predicted_throughput, label: label("front", r) })),
        borderColor: COLORS.model, backgroundColor: COLORS.model, pointRadius: 3, stepped: false },
      { label: "alternatives", data: alternatives.map((r) => ({ x: r.cores, y: r.predicted_throughput, label: label("alternative", r) })),
        showLine: false, pointRadius: 5, pointStyle: "rect", backgroundColor: COLORS.alt, borderColor: COLORS.alt },
    ];
    if (chosen) {
      datasets.push({ label: "chosen", data: [{ x: chosen.cores, y: chosen.predicted_throughput, label: label("chosen", chosen) }],
        showLine: false, pointStyle: "star", pointRadius: 10, borderColor: COLORS.revert, borderWidth: 2 });
    }
    const baseline = plans.baseline;
    if (baseline) {
      const cores = baseline.workers * baseline.worker_cpu + baseline.ps * baseline.ps_cpu;
      const memory = baseline.workers * baseline.worker_memory_mb + baseline.ps * baseline.ps_memory_mb;
      Object.assign(baseline, { cores, memory_mb: memory });
      datasets.push({ label: "baseline (by hand)", data: [{ x: cores, y: baseline.predicted_throughput, label: label("baseline", baseline) }],
        showLine: false, pointStyle: "crossRot", pointRadius: 9, borderColor: COLORS.baseline, borderWidth: 3 });
    }
    chart(canvasId, { type: "line", data: { datasets },
      options: { scales: { x: linear("cores"), y: linear("predicted samples/s", { beginAtZero: true }) } } });
    const tbody = $(tableId).querySelector("tbody");
    tbody.replaceChildren();
    const line = (name, r) => row(tbody, [name, { attrs: { class: "num" }, value: `${r.workers} × ${num(r.worker_cpu, 2)}` },
      { attrs: { class: "num" }, value: `${r.ps} × ${num(r.ps_cpu, 2)}` }, { attrs: { class: "num" }, value: num(r.cores, 2) },
      { attrs: { class: "num" }, value: num(r.memory_mb) }, { attrs: { class: "num" }, value: num(r.predicted_throughput) }]);
    if (chosen) line(el("b", {}, "chosen"), chosen);
    if (baseline) line("baseline", baseline);
    alternatives.forEach((r, i) => line(`alternative ${i + 1}`, r));
  }

  function utilisationCharts(timeline) {
    const s = timeline.samples;
    const series = (key, label, color, dashed) => ({ label, data: s.map((r) => ({ x: r.t, y: r[key] })), borderColor: color,
      backgroundColor: color, borderDash: dashed ? [6, 4] : [], stepped: dashed, pointRadius: dashed ? 0 : 2, spanGaps: false });
    const opts = (title) => ({ scales: { x: linear("seconds since the run started"), y: linear(title, { beginAtZero: true }) } });
    chart("chart-cpu", { type: "line", data: { datasets: [
      series("worker_cpu_used", "workers: used", COLORS.worker, false), series("worker_cpu_allocated", "workers: allocated", COLORS.worker, true),
      series("ps_cpu_used", "PS: used", COLORS.ps, false), series("ps_cpu_allocated", "PS: allocated", COLORS.ps, true),
    ] }, options: opts("CPU cores (role total)") });
    chart("chart-memory", { type: "line", data: { datasets: [
      series("worker_memory_used_mb", "workers: used", COLORS.worker, false), series("worker_memory_allocated_mb", "workers: allocated", COLORS.worker, true),
      series("ps_memory_used_mb", "PS: used", COLORS.ps, false), series("ps_memory_allocated_mb", "PS: allocated", COLORS.ps, true),
    ] }, options: opts("memory MB (role total)") });
  }

  function throughputChart(timeline) {
    const s = timeline.samples;
    const at = (t) => { // the throughput measured last before t (for placing a marker on the curve)
      let y = s.length ? s[0].throughput : 0;
      for (const r of s) { if (r.t <= t) y = r.throughput; }
      return y;
    };
    const windows = (stage) => s.filter((r) => (stage === "profile") === (r.stage === "profile"))
      .map((r) => ({ x: r.t, y: r.throughput, label: `${r.stage}: ${r.workers}w + ${r.ps}ps → ${num(r.throughput)}/s` }));
    const decisions = (action) => timeline.decisions.filter((d) => d.action === action)
      .map((d) => ({ x: d.t, y: at(d.t), label: `${d.action} at ${num(d.t)} s: ${d.reason}` }));
    const failures = timeline.events.filter((e) => ["node_failed", "recovered", "instability"].includes(e.event));
    const lines = [
      ...timeline.decisions.filter((d) => d.action !== "keep").map((d) => ({ t: d.t, color: COLORS[d.action] || COLORS.resize, text: d.action })),
      ...failures.map((e) => ({ t: e.t, color: e.event === "recovered" ? COLORS.recovery : COLORS.failure, text: e.event })),
    ];
    chart("chart-throughput", {
      type: "line",
      data: { datasets: [
        { label: "profiling probes", data: windows("profile"), showLine: false, pointRadius: 4, backgroundColor: COLORS.alt, borderColor: COLORS.alt },
        { label: "training windows", data: windows("finetune"), borderColor: COLORS.training, backgroundColor: COLORS.training, pointRadius: 2 },
        { label: "keep", data: decisions("keep"), showLine: false, pointStyle: "triangle", pointRadius: 5, backgroundColor: COLORS.keep, borderColor: COLORS.keep },
        { label: "resize", data: decisions("resize"), showLine: false, pointStyle: "triangle", pointRadius: 9, backgroundColor: COLORS.resize, borderColor: COLORS.resize },
        { label: "revert", data: decisions("revert"), showLine: false, pointStyle: "triangle", pointRadius: 9, backgroundColor: COLORS.revert, borderColor: COLORS.revert },
        { label: "failures / recoveries", data: failures.map((e) => ({ x: e.t, y: at(e.t), label: `${e.event} at ${num(e.t)} s: ${e.label}` })),
          showLine: false, pointStyle: "rectRot", pointRadius: 8, backgroundColor: COLORS.failure, borderColor: COLORS.failure },
      ] },
      options: { scales: { x: linear("seconds since the run started"), y: linear("samples/s", { beginAtZero: true }) },
        plugins: { markLines: { lines } } },
      plugins: [markLines],
    });
    const tbody = $("decisions").querySelector("tbody");
    tbody.replaceChildren();
    for (const d of timeline.decisions) {
      row(tbody, [{ attrs: { class: "num" }, value: num(d.t) }, el("b", { style: `color:${COLORS[d.action] || COLORS.keep}` }, d.action),
        d.reason, d.action === "keep" ? "—" : shape(d.target), { attrs: { class: "num" }, value: num(d.predicted_speedup, 2) }]);
    }
    if (!timeline.decisions.length) row(tbody, [{ attrs: { colspan: 5, class: "muted" }, value: "no fine-tune decision recorded" }]);
  }

  function instabilityTable(rows) {
    const tbody = $("instability-table").querySelector("tbody");
    tbody.replaceChildren();
    $("no-instability").hidden = rows.length > 0;
    for (const r of rows) {
      row(tbody, [{ attrs: { class: "num" }, value: num(r.t) }, el("b", {}, r.kind), r.node, r.reason,
        el("pre", { class: "evidence" }, JSON.stringify(r.evidence, null, 1)), el("pre", { class: "evidence" }, JSON.stringify(r.action, null, 1)),
        r.outcome]);
    }
  }

  async function runPage() {
    const runId = document.body.dataset.run;
    const [run, plans, timeline, instability] = await Promise.all([
      api(`/runs/${runId}`), api(`/runs/${runId}/plans`), api(`/runs/${runId}/timeline`), api(`/runs/${runId}/instability`),
    ]);
    facts(run);
    const select = $("model-select");
    for (let i = 0; i < run.counts.models; i++) {
      select.append(el("option", { value: String(i) }, i === 0 ? "fit task's (the plan's)" : `fine-tune refit ${i}`));
    }
    select.addEventListener("change", () => curves(runId, select.value).catch(fail));
    if (run.counts.models) await curves(runId, 0);
    else $("fit-quality").textContent = "No model was fitted in this run.";
    if (plans.chosen) {
      $("plan-reason").textContent = `${plans.chosen.objective}: ${plans.chosen.reason} (90 % band ${num(plans.chosen.lower_throughput)}–${num(plans.chosen.upper_throughput)}/s)`;
    } else $("plan-reason").textContent = "No plan was recorded in this run.";
    planCharts("chart-pareto", "plan-table", plans);
    utilisationCharts(timeline);
    throughputChart(timeline);
    instabilityTable(instability);
    const section = document.body.dataset.section;
    if (section && $(section)) { $(section).classList.add("focus"); $(section).scrollIntoView(); }
  }

  function whatIfPage() {
    const form = $("what-if-form");
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const params = new URLSearchParams();
      for (const [k, v] of new FormData(form)) if (k !== "job" && String(v).trim() !== "") params.set(k, String(v).trim());
      $("what-if-error").hidden = true;
      document.body.dataset.whatIf = "pending";
      try {
        const result = await api(`/jobs/${encodeURIComponent(form.elements.job.value)}/what-if?${params}`);
        const p = result.plan;
        $("what-if-plan").textContent = `${result.describe} → ${num(p.predicted_throughput)} samples/s ` +
          `(90 % band ${num(p.lower_throughput)}–${num(p.upper_throughput)}). ${p.reason}`;
        $("what-if-result").hidden = false;
        planCharts("chart-what-if", "what-if-table", { chosen: p, alternatives: p.alternatives, pareto_front: p.pareto_front });
        document.body.dataset.whatIf = "done";
      } catch (err) {
        $("what-if-error").textContent = err.message;
        $("what-if-error").hidden = false;
        document.body.dataset.whatIf = "error";
      }
    });
  }

  function fail(err) {
    const box = $("page-error");
    box.textContent = `Could not load the data: ${err.message}`;
    box.hidden = false;
    document.body.dataset.rendered = "error";
    document.body.dataset.error = err.message;
  }

  const PAGES = { jobs: jobsPage, runs: runsPage, run: runPage, what_if: whatIfPage, dag_run: () => undefined };

  document.addEventListener("DOMContentLoaded", async () => {
    const started = performance.now();
    try {
      await PAGES[document.body.dataset.page]();
      document.body.dataset.renderMs = Math.round(performance.now() - started);
      document.body.dataset.rendered = "true";
    } catch (err) {
      fail(err);
    }
  });
})();
