"""Server-rendered HTML: the page shell and the fragments htmx swaps in.

Every value goes through `html.escape`; every number a test or a script reads is also a
`data-*` attribute (GiB as plain decimals), so the DOM says exactly what the JSON says.
"""

from __future__ import annotations

import json
from functools import cache
from html import escape
from pathlib import Path
from string import Template
from typing import Any

TEMPLATES = Path(__file__).with_name("templates")
PAGES = (
    ("fleet", "Fleet"), ("models", "Models"), ("charts", "Charts"), ("usage", "Usage"),
    ("playground", "Playground"),
)  # fmt: skip
TONES = 4  # shades of the bar colours, one per instance sharing a card
STATE_CLASS = {
    "ready": "ok", "loading": "busy", "starting": "busy", "restarting": "busy",
    "unhealthy": "warn", "draining": "warn", "sleeping": "idle", "stopped": "idle",
    "failed": "bad", "not running": "idle", "external": "idle", "ejected": "warn",
}  # fmt: skip


@cache
def template(name: str) -> Template:
    return Template((TEMPLATES / name).read_text(encoding="utf-8"))


def e(value: object) -> str:
    return escape(str(value), quote=True)


def gib(value: float) -> str:
    return f"{value:.2f} GiB"


def page(name: str, title: str, content: str, who: str) -> str:
    nav = "".join(
        f'<a href="/ui/{p}"{" class=current" if p == name else ""}>{e(label)}</a>'
        for p, label in PAGES
    )
    return template("base.html").substitute(
        title=e(title), page=e(name), nav=nav, content=content, who=who
    )


def login(reason: str, env: str, error: str = "") -> str:
    return template("login.html").substitute(
        reason=e(reason), env=e(env), error=f'<p class="error">{e(error)}</p>' if error else ""
    )


def badge(state: str) -> str:
    return f'<span class="badge {STATE_CLASS.get(state, "idle")}">{e(state)}</span>'


def _live(share: dict[str, Any]) -> str:
    live = share.get("live")
    if live is None or live.get("kv_cache_usage") is None:
        return '<span class="nolive">no live data</span>'
    kv = float(live["kv_cache_usage"])
    return (
        f'<span class="kvlive" data-kv-usage="{kv:.4f}">KV {kv:.0%} of '
        f'{share["kv_cache_gib"]:.2f} GiB</span> · waiting {live["waiting"] or 0:g}, '
        f'running {live["running"] or 0:g}'
    )


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.3f}%" if whole > 0 else "0%"


def _segments(instances: list[dict[str, Any]], total: float, free_gib: float) -> str:
    """One memory bar's segments: each instance's weights / KV pool / overhead, then free."""
    segs = []
    for n, share in enumerate(instances):
        live = share.get("live") or {}
        tone = f"tone{n % TONES}"  # co-located instances: each its own shade
        for kind in ("weights", "kv_cache", "overhead"):
            value = share[f"{kind}_gib"]
            used = ""  # the engine's live KV usage, drawn inside the planned pool
            if kind == "kv_cache" and live.get("kv_cache_usage") is not None:
                used = (f'<i class="used" style="width:'
                        f'{100 * min(float(live["kv_cache_usage"]), 1.0):.1f}%"></i>')
            segs.append(
                f'<span class="seg {kind} {tone}" data-instance="{e(share["id"])}" '
                f'data-kind="{kind}" data-gib="{value:.3f}" '
                f'style="width:{_pct(value, total)}" '
                f'title="{e(share["id"])} {kind.replace("_", " ")} {gib(value)}">'
                f"{used}</span>"
            )
    segs.append(
        f'<span class="seg free" data-kind="free" data-gib="{free_gib:.3f}" '
        f'style="width:{_pct(max(free_gib, 0.0), total)}" '
        f'title="free {gib(free_gib)}"></span>'
    )
    return "".join(segs)


def _cpu_host(host: dict[str, Any]) -> str:
    """A CPU host of a CPU plan: its RAM bar (weights / KV pool / engine runtime per
    instance) and which instance binds which cores (VLLM_CPU_OMP_THREADS_BIND)."""
    total, shares = host["memory_gib"], host["instances"]
    cores = ",".join(str(c) for c in host["cores"])
    by_core: dict[int, list[int]] = {c: [] for c in host["cores"]}
    for n, share in enumerate(shares):
        for core in share["cores"]:
            by_core.setdefault(core, []).append(n)
    cells = "".join(
        f'<span class="core" data-core="{core}" data-instances="'
        f'{e(",".join(shares[n]["id"] for n in users))}">core {core}: '
        + (" · ".join(f'<i class="swatch tone{n % TONES}"></i>{e(shares[n]["id"])}'
                      for n in users) or '<span class="note">free</span>')
        + "</span>"
        for core, users in sorted(by_core.items())
    )
    rows = "".join(
        f'<tr class="instance" data-instance="{e(s["id"])}" data-model="{e(s["model"])}"'
        f' data-state="{e(s["state"])}" data-share-gib="{s["share_gib"]:.3f}"'
        f' data-cores="{e(",".join(str(c) for c in s["cores"]))}">'
        f'<td class="name"><i class="swatch tone{n % TONES}"></i>{e(s["id"])}</td>'
        f'<td>{badge(s["state"])}</td>'
        f'<td class="num">{e(", ".join(str(c) for c in s["cores"]))}</td>'
        f'<td class="num">{gib(s["weights_gib"])}</td>'
        f'<td class="num">{gib(s["kv_cache_gib"])}</td>'
        f'<td class="num">{gib(s["overhead_gib"])}</td><td>{_live(s)}</td></tr>'
        for n, s in enumerate(shares)
    ) or '<tr><td colspan="7" class="note">idle host</td></tr>'
    count = len(host["cores"])
    return (
        f'<article class="gpu cpuhost" data-cpu-cores="{cores}" '
        f'data-memory-gib="{total:.3f}" data-used-gib="{host["used_gib"]:.3f}" '
        f'data-free-gib="{host["free_gib"]:.3f}" data-budget-gib="{host["budget_gib"]:.3f}">'
        f'<h3>CPU host · {count} core{"s" if count != 1 else ""} · {gib(total)} RAM</h3>'
        f'<div class="bar" role="img" aria-label="RAM of the CPU host">'
        f'{_segments(shares, total, host["free_gib"])}</div>'
        f'<p class="legend"><i class="weights"></i>weights <i class="kv_cache"></i>KV '
        f'pool (dark: in use now) <i class="overhead"></i>engine processes <i class="free">'
        f'</i>free · used {gib(host["used_gib"])} of budget {gib(host["budget_gib"])}</p>'
        f'<p class="cores">{cells}</p>'
        f'<table><thead><tr><th>instance</th><th>state</th><th>cores</th><th>weights</th>'
        f'<th>KV pool</th><th>engine processes</th><th>live (engine /metrics)</th></tr>'
        f"</thead><tbody>{rows}</tbody></table></article>"
    )


def fleet_fragment(view: dict[str, Any]) -> str:
    """Nodes -> GPUs (or a CPU plan's cores and RAM) -> instances with S0-style memory
    bars, then unplaced instances."""
    out: list[str] = []
    if view.get("message"):
        out.append(f'<p class="note">{e(view["message"])}</p>')
    for node in view["nodes"]:
        out.append(f'<section class="node" data-node="{e(node["name"])}">'
                   f'<h2>node {e(node["name"])}</h2><div class="gpus">')  # fmt: skip
        for host in node.get("cpus", []):
            out.append(_cpu_host(host))
        for gpu in node["gpus"]:
            total = gpu["memory_gib"]
            rows = "".join(
                f'<tr class="instance" data-instance="{e(s["id"])}" data-model="{e(s["model"])}"'
                f' data-state="{e(s["state"])}" data-share-gib="{s["share_gib"]:.3f}">'
                f'<td class="name"><i class="swatch tone{n % TONES}"></i>{e(s["id"])}</td>'
                f'<td>{badge(s["state"])}</td>'
                f'<td class="num">{gib(s["weights_gib"])}</td>'
                f'<td class="num">{gib(s["kv_cache_gib"])}</td>'
                f'<td class="num">{gib(s["overhead_gib"])}</td><td>{_live(s)}</td></tr>'
                for n, s in enumerate(gpu["instances"])
            ) or '<tr><td colspan="6" class="note">idle card</td></tr>'
            out.append(
                f'<article class="gpu" data-gpu-index="{gpu["index"]}" '
                f'data-memory-gib="{total:.3f}" data-used-gib="{gpu["used_gib"]:.3f}" '
                f'data-free-gib="{gpu["free_gib"]:.3f}" data-budget-gib="{gpu["budget_gib"]:.3f}">'
                f'<h3>GPU {gpu["index"]} · {e(gpu["type"])} · {gib(total)}</h3>'
                f'<div class="bar" role="img" aria-label="memory of GPU {gpu["index"]}">'
                f'{_segments(gpu["instances"], total, gpu["free_gib"])}</div>'
                f'<p class="legend"><i class="weights"></i>weights <i class="kv_cache"></i>KV '
                f'pool (dark: in use now) <i class="overhead"></i>overhead <i class="free">'
                f'</i>free · used '
                f'{gib(gpu["used_gib"])} of budget {gib(gpu["budget_gib"])}</p>'
                f'<table><thead><tr><th>instance</th><th>state</th><th>weights</th>'
                f'<th>KV pool</th><th>overhead</th><th>live (engine /metrics)</th></tr></thead>'
                f"<tbody>{rows}</tbody></table></article>"
            )
        out.append("</div></section>")
    if view["unplaced"]:
        out.append('<section class="node" data-node="-"><h2>instances without a card plan'
                   '</h2><table><tbody>')  # fmt: skip
        for s in view["unplaced"]:
            live = s.get("live")
            kv = live.get("kv_cache_usage") if live else None
            out.append(
                f'<tr class="instance" data-instance="{e(s["id"])}" data-state="{e(s["state"])}">'
                f'<td>{e(s["id"])}</td><td>{badge(s["state"])}</td><td>'
                + (f"KV {kv:.0%}" if kv is not None else '<span class="nolive">no live data'
                   "</span>") + "</td></tr>"
            )  # fmt: skip
        out.append("</tbody></table></section>")
    return "".join(out)


def _held(adapters: list[str]) -> str:
    """One replica's adapters cell: what its engine lists in /v1/models now."""
    text = e(", ".join(adapters)) if adapters else '<span class="nolive">none</span>'
    return f'<td data-adapters-held="{e(" ".join(adapters))}">{text}</td>'


def models_fragment(view: dict[str, Any], actions: bool) -> str:
    out: list[str] = []
    for m in view["models"]:
        aliases = f' (aliases: {e(", ".join(m["aliases"]))})' if m["aliases"] else ""
        lora = bool(m.get("adapters"))  # the adapters column only for a model that has them
        declared = (f' · LoRA adapters <span data-adapters="{e(" ".join(m["adapters"]))}">'
                    f'{e(", ".join(m["adapters"]))}</span>' if lora else "")
        out.append(
            f'<section class="model" data-model="{e(m["name"])}"><h2>{e(m["name"])}{aliases}'
            f'</h2><p class="note">engine name {e(m["served_name"])} · gateway queue '
            f'<span data-queue-depth="{m["queue_depth"]}">{m["queue_depth"]}</span>'
            f"{declared}</p>"
            "<table><thead><tr><th>replica</th><th>state</th><th>restarts</th><th>routed</th>"
            f"<th>in flight</th>{'<th>adapters held</th>' if lora else ''}<th>pid</th>"
            "<th>gpus</th><th></th></tr></thead><tbody>"
        )
        for r in m["replicas"]:
            name = str(r["name"])
            buttons = ""
            if r.get("restarts") is not None:
                buttons = (
                    f'<button class="link" hx-get="/ui/partials/logs/{e(name)}" '
                    f'hx-target="#logs" hx-swap="innerHTML show:#logs:top">logs</button>'
                )
                if actions:
                    buttons += (
                        f' <button class="restart" data-instance="{e(name)}" '
                        f'hx-post="/ui/api/instances/{e(name)}/restart" hx-target="#action" '
                        f'hx-swap="innerHTML" hx-confirm="Restart {e(name)}? Its requests in '
                        f'flight finish first (grace period).">restart</button>'
                    )
            err = (f'<div class="error">{e(r["last_error"])}</div>'
                   if r.get("last_error") and r["state"] != "ready" else "")  # fmt: skip
            out.append(
                f'<tr class="replica" data-instance="{e(name)}" data-state="{e(r["state"])}" '
                f'data-restarts="{r.get("restarts") if r.get("restarts") is not None else ""}">'
                f'<td>{e(name)}</td><td>{badge(r["state"])}{err}</td>'
                f'<td>{"-" if r.get("restarts") is None else r["restarts"]}</td>'
                f'<td>{"yes" if r["routable"] else "no"}</td><td>{r["in_flight"]}</td>'
                f"{_held(r.get('adapters') or []) if lora else ''}"
                f'<td>{e(r.get("pid") or "-")}</td>'
                f'<td>{e(r.get("gpus_label") or "-")}</td>'
                f"<td>{buttons}</td></tr>"
            )
        out.append("</tbody></table></section>")
    routes = view["routes"]
    out.append('<section class="routes"><h2>weighted routes</h2>')
    if not routes:
        out.append('<p class="note">no weighted routes (canaries): each name goes to its own '
                   "model</p>")  # fmt: skip
    for route in routes:
        targets = ", ".join(
            f'<span data-route="{e(route["name"])}" data-target="{e(t["model"])}" '
            f'data-share="{t["share"]}">{e(t["model"])} {t["share"]:.0%}</span>'
            for t in route["targets"]
        )
        out.append(f"<p><b>{e(route['name'])}</b> → {targets}</p>")
    out.append("</section>")
    return "".join(out)


def logs_fragment(view: dict[str, Any]) -> str:
    changes = "".join(
        f"<li>{_clock(c['at'])} {e(c['from'] or 'seen')} → {e(c['to'])}</li>"
        for c in view["state_changes"]
    ) or "<li>none seen since the console started</li>"
    scaling = "".join(
        f"<li>{_clock(ev.get('at', 0))} {e(ev.get('kind'))}: {e(ev.get('reason'))}</li>"
        for ev in view["scaling_events"]
    ) or "<li>none</li>"
    lines = e("\n".join(view["lines"])) or "(empty)"
    return (
        f'<div class="logs" data-instance="{e(view["instance"])}"><h3>{e(view["instance"])}'
        f'</h3><p class="note">{e(view["log"])}</p><div class="cols"><div><h4>state changes'
        f"</h4><ul>{changes}</ul><h4>scaling events</h4><ul>{scaling}</ul></div>"
        f"<pre>{lines}</pre></div></div>"
    )


def _clock(at: float) -> str:
    import time

    return time.strftime("%H:%M:%S", time.localtime(at))


def usage_fragment(view: dict[str, Any]) -> str:
    if not view["tenancy"]:
        return f'<p class="note tenancy-off">{e(view["message"])}</p>'
    usd = view["fleet_usd_per_hour"]
    head = (
        f'<p class="note">last {view["days"]} days · auth '
        f'{"ON" if view["auth_required"] else "OFF"} · '
        + (f"GPU cost ${usd:.2f}/h, split by tokens" if usd is not None
           else f"cost unknown: {e(view['cost_note'])}") + "</p>"
    )  # fmt: skip
    keys = "".join(
        f'<li data-key="{e(k["id"])}">{e(k["name"])} <code>{e(k["id"])}</code>'
        f'{" · " + e(", ".join(k["models"])) if k["models"] else ""}</li>'
        for k in view["active_keys"]
    ) or "<li>no API keys yet (`inferplane keys create NAME`)</li>"
    parts = [head, f"<h2>active keys</h2><ul>{keys}</ul>"]
    for by, title in (("key", "per key"), ("model", "per model"), ("day", "per day (UTC)")):
        rows = view[f"by_{by}"]
        label = "name" if by == "key" else by
        body = "".join(
            f'<tr data-{by}="{e(r[by])}" data-total-tokens="{r["total_tokens"]}">'
            f'<td>{e(r.get("name", r[by]) if by == "key" else r[by])}</td>'
            f'<td>{r["requests"]}</td><td>{r["errors"]}</td><td>{r["prompt_tokens"]}</td>'
            f'<td>{r["completion_tokens"]}</td><td>{r["total_tokens"]}</td>'
            f"<td>{_usd(r['cost_usd'])}</td></tr>"
            for r in rows
        ) or '<tr><td colspan="7" class="note">no requests in this window</td></tr>'
        parts.append(
            f'<h2>{title}</h2><table class="usage" data-by="{by}"><thead><tr><th>{label}</th>'
            "<th>requests</th><th>errors</th><th>prompt</th><th>completion</th><th>total</th>"
            f"<th>cost</th></tr></thead><tbody>{body}</tbody></table>"
        )
    return "".join(parts)


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def chat_first(models: list[str], embeddings: set[str]) -> list[str]:
    """Chat models before embedding ones, so the first choice answers a chat request."""
    return sorted(models, key=lambda m: m in embeddings)


def charts_body(models: list[str], embeddings: set[str]) -> str:
    options = "".join(f'<option value="{e(m)}">{e(m)}</option>'
                      for m in chat_first(models, embeddings))
    return (
        '<div class="toolbar"><label>model <select id="chart-model">' + options + "</select>"
        '</label> <span class="note" id="chart-status">waiting for samples…</span></div>'
        '<div id="charts" class="charts"></div>'
    )


def playground_body(
    models: list[str], replicas: dict[str, str], embeddings: set[str], replica_token: str = ""
) -> str:
    # data-kind: the request kind console.js selects when this model is picked.
    options = "".join(
        f'<option value="{e(m)}" data-kind="{"embeddings" if m in embeddings else "chat"}">'
        f"{e(m)}</option>" for m in chat_first(models, embeddings))
    return (
        f"<form id=\"playground\" data-replicas='{e(json.dumps(replicas))}' "
        f'data-replica-token="{e(replica_token)}">'
        '<div class="row"><label>model <select name="model" id="pg-model">' + options
        + '</select></label><label>kind <select name="kind" id="pg-kind">'
        '<option value="chat">chat (streamed)</option><option value="embeddings">'
        "embeddings</option></select></label>"
        '<label>max tokens <input name="max_tokens" id="pg-max" type="number" min="1" '
        'value="64"></label><label>API key <input name="key" id="pg-key" type="password" '
        'placeholder="only when auth is on"></label></div>'
        '<textarea id="pg-prompt" name="prompt" rows="4">Say hello to the fleet.</textarea>'
        '<button type="submit" id="pg-send">send</button></form>'
        '<section class="answer"><dl class="timings" id="pg-timings"></dl>'
        '<pre id="pg-output" data-done="false"></pre></section>'
    )  # fmt: skip
