// inferplane console: the live charts (uPlot) and the playground. Everything else is
// server-rendered HTML that htmx refreshes; no build step, no third-party origin.
"use strict";

(function () {
  const page = document.body.dataset.page;

  // ---- live charts ------------------------------------------------------------------
  const KEEP = 900;  // points kept in the browser (15 min at 1 s), as the server's ring
  const PALETTE = ["#3b6fd8", "#2fa36b", "#e0a030", "#c83232", "#8e5bd8", "#1aa3b8",
                   "#d8589b", "#6b7585"];

  // Each chart: title, and a function (point, model) -> {series label: value}.
  const CHARTS = [
    ["requests/s", (p, m) => perReplica(p, m, "requests_per_s", { gateway: p.models[m].requests_per_s })],
    ["gateway queue vs engine", (p, m) => ({
      "gateway queue": p.models[m].queue_depth, "in flight": p.models[m].in_flight,
      "engine waiting": p.models[m].engine_waiting, "engine running": p.models[m].engine_running })],
    ["gateway queue wait (s)", (p, m) => ({ "mean wait": p.models[m].queue_wait_mean_s })],
    ["TTFT (s)", (p, m) => perReplica(p, m, "ttft_p50_s", {
      "gateway p50": p.models[m].ttft_p50_s, "gateway p95": p.models[m].ttft_p95_s,
      "gateway p99": p.models[m].ttft_p99_s }, " engine p50")],
    ["TPOT (s)", (p, m) => Object.assign(perReplica(p, m, "tpot_p50_s", {}, " p50"),
                                       perReplica(p, m, "tpot_p95_s", {}, " p95"))],
    ["tokens/s", (p, m) => perReplica(p, m, "generation_tokens_per_s",
                                     { "gateway (prompt+completion)": p.models[m].tokens_per_s }, " generated")],
    ["KV-cache usage", (p, m) => perReplica(p, m, "kv_cache_usage", {})],
    ["prefix-cache hit rate", (p, m) => perReplica(p, m, "prefix_hit_rate", {})],
    ["errors/s by status", (p, m) => Object.assign({ any: sum(Object.values(p.models[m].errors_per_s)) },
                                                   p.models[m].errors_per_s)],
  ];

  // Three significant digits: 0.0005 / 0.001 / 0.0015, not 0.001 three times.
  function tick(v) {
    if (v === null || v === undefined) return "";
    return Math.abs(v) >= 100 ? v.toFixed(0) : String(+v.toPrecision(3));
  }

  function sum(values) { return values.reduce((a, b) => a + (b || 0), 0); }

  function perReplica(p, model, field, base, suffix) {
    const out = Object.assign({}, base);
    for (const [name, r] of Object.entries(p.replicas)) {
      if (r.model === model) out[name + (suffix || "")] = r[field];
    }
    return out;
  }

  function initCharts() {
    const box = document.getElementById("charts");
    const select = document.getElementById("chart-model");
    const status = document.getElementById("chart-status");
    let points = [];
    let since = 0;
    const built = {};  // chart title -> {plot, key, el}

    // The grid's column width (CSS: columns of at least 440 px), minus the card padding.
    function chartWidth() {
      const gap = 14, total = box.clientWidth;
      const cols = Math.max(1, Math.floor((total + gap) / (440 + gap)));
      return Math.max(Math.floor((total - gap * (cols - 1)) / cols) - 18, 280);
    }

    function render() {
      const model = select.value;
      const usable = points.filter((p) => p.models[model]);
      CHARTS.forEach(([title, pick], i) => {
        const rows = usable.map((p) => pick(p, model));
        const labels = [...new Set(rows.flatMap((r) => Object.keys(r)))];
        const data = [usable.map((p) => p.t)].concat(
          labels.map((l) => rows.map((r) => (r[l] === undefined ? null : r[l]))));
        let c = built[title];
        const key = model + "|" + labels.join("|");
        if (!c || c.key !== key) {
          if (c) c.plot.destroy(); else {
            const el = document.createElement("div");
            el.className = "chart";
            el.dataset.chart = title;
            el.innerHTML = "<h3></h3>";
            el.querySelector("h3").textContent = title;
            box.appendChild(el);
            c = built[title] = { el };
          }
          c.key = key;
          const width = chartWidth();
          c.plot = new uPlot({
            width, height: 200, legend: { live: false },
            scales: { x: { time: true } },
            series: [{}].concat(labels.map((l, j) => ({
              label: l, stroke: PALETTE[j % PALETTE.length], width: 1.5, spanGaps: false }))),
            axes: [{}, { size: 56, values: (u, ticks) => ticks.map(tick) }],
          }, data, c.el);
        } else {
          c.plot.setData(data);
          const width = chartWidth();
          if (Math.abs(c.plot.width - width) > 2) c.plot.setSize({ width, height: 200 });
        }
        const last = rows.length ? rows[rows.length - 1] : {};
        c.el.dataset.points = String(usable.length);
        c.el.dataset.last = JSON.stringify(last);
      });
      status.textContent = usable.length
        ? usable.length + " points, last at " + new Date(usable[usable.length - 1].t * 1000).toLocaleTimeString()
        : "waiting for samples…";
      box.dataset.points = String(usable.length);
    }

    async function poll() {
      try {
        const r = await fetch("/ui/api/series?since=" + since, { credentials: "same-origin" });
        if (r.ok) {
          const body = await r.json();
          if (body.points.length) {
            points = points.concat(body.points).slice(-KEEP);
            since = points[points.length - 1].t;
          }
          render();
        } else {
          status.textContent = "the console answered " + r.status;
        }
      } catch (err) {
        status.textContent = "gateway unreachable: " + err;
      }
      setTimeout(poll, 1000);
    }
    select.addEventListener("change", () => render());
    poll();
  }

  // ---- playground -------------------------------------------------------------------
  function initPlayground() {
    const form = document.getElementById("playground");
    const out = document.getElementById("pg-output");
    const timings = document.getElementById("pg-timings");
    const replicas = JSON.parse(form.dataset.replicas || "{}");
    const modelSelect = document.getElementById("pg-model");
    const kindSelect = document.getElementById("pg-kind");
    // Picking a model picks the request kind it serves (its option's data-kind), so an
    // embedding model is not sent a chat request; the kind can still be changed after.
    function matchKind() {
      const option = modelSelect.selectedOptions[0];
      if (option && option.dataset.kind) kindSelect.value = option.dataset.kind;
    }
    modelSelect.addEventListener("change", matchKind);
    matchKind();

    function show(items) {
      timings.replaceChildren();
      for (const [id, label, value] of items) {
        const dt = document.createElement("dt");
        dt.textContent = label;
        const dd = document.createElement("dd");
        dd.id = id;
        dd.textContent = value;
        timings.append(dt, dd);
      }
    }

    function route(resp) {
      // The header names the replica (chat-0); its engine URL comes from the page.
      const name = resp.headers.get("x-inferplane-replica") || "-";
      return [
        ["pg-status", "status", String(resp.status)],
        ["pg-replica", "replica", replicas[name] || "-"],
        ["pg-instance", "instance", name],
        ["pg-request-id", "request id", resp.headers.get("x-request-id") || "-"],
      ];
    }

    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const model = document.getElementById("pg-model").value;
      const kind = document.getElementById("pg-kind").value;
      const prompt = document.getElementById("pg-prompt").value;
      const maxTokens = parseInt(document.getElementById("pg-max").value, 10) || 64;
      const key = document.getElementById("pg-key").value.trim();
      const headers = { "content-type": "application/json" };
      if (key) headers.authorization = "Bearer " + key;
      // The gateway names the replica only to the console (its page holds this token).
      if (form.dataset.replicaToken) {
        headers["x-inferplane-replica-token"] = form.dataset.replicaToken;
      }
      out.textContent = "";
      out.dataset.done = "false";
      const t0 = performance.now();
      const ms = (t) => (t === null ? "-" : (t - t0).toFixed(0) + " ms");
      try {
        if (kind === "embeddings") {
          const resp = await fetch("/v1/embeddings", { method: "POST", headers,
            body: JSON.stringify({ model, input: prompt }) });
          const body = await resp.json();
          const t1 = performance.now();
          if (!resp.ok) throw new Error(body.error ? body.error.message : resp.status);
          const vec = body.data[0].embedding;
          out.textContent = vec.length + " dimensions: [" +
            vec.slice(0, 8).map((v) => v.toFixed(4)).join(", ") + ", …]";
          show(route(resp).concat([["pg-total", "total", ms(t1)],
            ["pg-tokens", "prompt tokens", String((body.usage || {}).prompt_tokens || "-")]]));
          return;
        }
        const resp = await fetch("/v1/chat/completions", { method: "POST", headers,
          body: JSON.stringify({ model, max_tokens: maxTokens, stream: true,
            stream_options: { include_usage: true },
            messages: [{ role: "user", content: prompt }] }) });
        if (!resp.ok) {
          const body = await resp.text();
          show(route(resp));
          throw new Error(body);
        }
        const reader = resp.body.getReader();
        const decoder = new TextDecoder();
        let buf = "", first = null, chunks = 0, usage = null;
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += decoder.decode(value, { stream: true });
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const event = buf.slice(0, cut);
            buf = buf.slice(cut + 2);
            for (const line of event.split("\n")) {
              if (!line.startsWith("data:")) continue;
              const data = line.slice(5).trim();
              if (data === "[DONE]") continue;
              const msg = JSON.parse(data);
              if (msg.error) throw new Error(msg.error.message);
              if (msg.usage) usage = msg.usage;
              const delta = (msg.choices && msg.choices[0] && msg.choices[0].delta) || {};
              if (delta.content) {
                if (first === null) first = performance.now();
                chunks += 1;
                out.textContent += delta.content;
                out.dataset.chunks = String(chunks);
              }
            }
          }
          show(route(resp).concat([["pg-ttft", "time to first token", ms(first)]]));
        }
        const t1 = performance.now();
        const tokens = usage ? usage.completion_tokens : chunks;
        const decode = first === null ? 0 : (t1 - first) / 1000;
        show(route(resp).concat([
          ["pg-ttft", "time to first token", ms(first)],
          ["pg-total", "total", ms(t1)],
          ["pg-tokens", "completion tokens", String(tokens)],
          ["pg-rate", "tokens/s after the first", decode > 0 ? ((tokens - 1) / decode).toFixed(1) : "-"],
        ]));
      } catch (err) {
        out.textContent += "\n[error] " + err.message;
      } finally {
        out.dataset.done = "true";
      }
    });
  }

  if (page === "charts") initCharts();
  if (page === "playground") initPlayground();
})();

// A replica's logs: the panel comes into view (hx-swap show:) and opens at the newest line.
document.addEventListener("htmx:afterSwap", (ev) => {
  if (ev.target && ev.target.id === "logs") {
    ev.target.querySelectorAll("pre").forEach((pre) => { pre.scrollTop = pre.scrollHeight; });
  }
});
