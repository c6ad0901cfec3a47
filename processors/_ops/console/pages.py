"""The console's HTML: the page shell, the live fragment and the savepoint page (pure).

Everything is rendered on the server from a snapshot (:mod:`processors._ops.console.data`);
every value from Kafka or the store goes through :func:`html.escape`. The page's one small
script replaces the live fragment every :data:`POLL_MS` and sends the savepoint actions
(with the token the operator typed, in an ``Authorization`` header; it is never put into
a page). The script carries the response's CSP nonce.
"""

from __future__ import annotations

import contextlib
import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from state.savepoint import ms_to_iso

__all__ = [
    "POLL_MS",
    "actions",
    "dashboard_page",
    "key_group_watermarks",
    "live_fragment",
    "page",
    "savepoint_page",
]

#: The live fragment is fetched again this often.
POLL_MS = 1500

_STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#1d2330;background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:10px 18px;display:flex;gap:18px;align-items:center}
header h1{font-size:18px;margin:0} header a{color:#9cc3ff}
main{padding:12px 18px} h2{font-size:16px;margin:18px 0 6px} h3{margin:4px 0}
section.card{background:#fff;border:1px solid #d8dce3;border-radius:6px;padding:10px 14px;
margin:10px 0}
table{border-collapse:collapse;font-size:13px;margin:4px 0 8px}
td,th{border-bottom:1px solid #e3e6eb;padding:3px 8px;text-align:left}
th{background:#eef0f4} .num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;border-radius:9px;padding:1px 8px;font-size:12px;margin-right:4px;
background:#e6ecf5} .bad{background:#ffd9d6;color:#8a1c12} .ok{background:#d6f5dd;color:#135b24}
.warn{background:#fff0c2;color:#6b4d00} .muted{color:#6b7280;font-size:12px}
.grid{display:flex;flex-wrap:wrap;gap:14px} .grid>div{min-width:260px}
form{display:flex;gap:8px;flex-wrap:wrap;align-items:center;font-size:13px}
input{padding:3px 6px} button{padding:3px 10px;cursor:pointer}
#msg{font-size:13px;margin:6px 0;white-space:pre-wrap}
svg text{font-size:12px;font-family:system-ui,sans-serif}
pre{background:#f0f2f5;padding:8px;overflow:auto;font-size:12px}
.panels{display:grid;grid-template-columns:repeat(auto-fill,minmax(590px,1fr));gap:10px}
.panels section.card{margin:0} .panel h3{font-size:14px}
.panel-note{font-size:12px;margin:4px 0} .unsupported{color:#8a1c12} .no-data{color:#6b4d00}
table.legend{font-size:12px;margin:2px 0} .swatch{display:inline-block;width:10px;height:10px;
margin-right:6px;border-radius:2px} .app-filter a{margin-right:8px;color:#2f6fde}
.app-filter a.on{font-weight:bold;color:#1d2330}
"""

_SCRIPT = """
(function(){
  const live = document.getElementById('live');
  const msg = document.getElementById('msg');
  const tokenBox = document.getElementById('token');
  async function refresh(){
    try{
      const r = await fetch(live.dataset.src || '/partial/live', {cache:'no-store'});
      if(r.ok){ live.innerHTML = await r.text(); }
    }catch(e){ /* the next poll tries again */ }
  }
  async function post(url, body){
    const headers = {'Content-Type':'application/json'};
    if(tokenBox && tokenBox.value){ headers['Authorization'] = 'Bearer ' + tokenBox.value; }
    const r = await fetch(url, {method:'POST', headers, body: JSON.stringify(body)});
    let data = {};
    try{ data = await r.json(); }catch(e){}
    msg.textContent = (r.ok ? '' : 'error ' + r.status + ': ') + (data.status || '');
    refresh();
  }
  const trig = document.getElementById('trigger-form');
  if(trig){ trig.addEventListener('submit', function(ev){
    ev.preventDefault();
    post('/api/savepoints', {pipeline: document.getElementById('trigger-pipeline').value,
                             stop: document.getElementById('trigger-stop').checked});
  }); }
  const canc = document.getElementById('cancel-form');
  if(canc){ canc.addEventListener('submit', function(ev){
    ev.preventDefault();
    const id = document.getElementById('cancel-id').value;
    post('/api/savepoints/' + encodeURIComponent(id) + '/cancel',
         {pipeline: document.getElementById('cancel-pipeline').value});
  }); }
  document.addEventListener('click', function(ev){
    const b = ev.target.closest('button[data-cancel]');
    if(!b){ return; }
    document.getElementById('cancel-id').value = b.dataset.cancel;
    document.getElementById('cancel-pipeline').value = b.dataset.pipeline;
  });
  if(live){ setInterval(refresh, POLL_MS); }
})();
"""


def _e(value: Any) -> str:
    """Escape ``value`` for HTML (``None`` is a dash)."""
    return "–" if value is None else html.escape(str(value), quote=True)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], attrs: str = "") -> str:
    """Return a table; ``rows`` hold already escaped cells (``<td ...>`` or text)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table {attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f'<td class="num">{_e(value)}</td>'


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}/s"


def page(title: str, body: str, nonce: str, live: bool = True) -> str:
    """Return a whole page: header, ``body`` and the script.

    Args:
        title: the page title.
        body: the escaped HTML of the main part.
        nonce: the CSP nonce of the script.
        live: whether ``body`` holds ``#live`` to refresh.
    """
    script = _SCRIPT.replace("POLL_MS", str(POLL_MS if live else 0))
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
        '<header><h1>lockgate console</h1><a href="/">overview</a>'
        '<a href="/dashboard">dashboard</a><a href="/api/overview">JSON</a></header>'
        f'<main>{body}</main><script nonce="{_e(nonce)}">{script}</script></body></html>'
    )


def dashboard_page(fragment: str, src: str) -> str:
    """Return the dashboard page's body: the live dashboard fragment and where it is fetched.

    Args:
        fragment: the escaped HTML of the dashboard
            (:meth:`~processors._ops.console.dashboard.MetricsHistory.fragment`).
        src: the URL the page's script fetches the fragment from again.
    """
    return (
        '<h2>Dashboard</h2><p class="muted">The panels of the chart\'s Grafana dashboard '
        "(dashboards/lockgate.json), evaluated by the console over the instances' /metrics: "
        "no Grafana or Prometheus involved.</p>"
        f'<div id="live" data-src="{_e(src)}">{fragment}</div>'
    )


def actions(token_set: bool) -> str:
    """Return the savepoint forms (outside the live fragment, so typing survives a refresh).

    Args:
        token_set: whether LOCKGATE_QUERY_TOKEN is configured (else actions are off).
    """
    if not token_set:
        note = (
            '<p class="muted">Savepoint trigger and cancel are off: start the console with '
            "LOCKGATE_QUERY_TOKEN set (the queryable-state token).</p>"
        )
    else:
        note = '<p class="muted">Trigger and cancel need the LOCKGATE_QUERY_TOKEN token.</p>'
    return (
        '<section class="card" id="actions"><h2>Savepoint actions</h2>' + note + ""
        '<form id="trigger-form"><label>token <input type="password" id="token" '
        'autocomplete="off"></label>'
        '<label>pipeline of <input id="trigger-pipeline" list="app-names" required '
        'placeholder="app name"></label>'
        '<label><input type="checkbox" id="trigger-stop"> stop at the savepoint</label>'
        '<button type="submit" id="trigger-button">Trigger savepoint</button></form>'
        '<form id="cancel-form" style="margin-top:6px"><label>cancel savepoint '
        '<input id="cancel-id" required placeholder="savepoint id"></label>'
        '<label>of the pipeline of <input id="cancel-pipeline" list="app-names" required>'
        '</label><button type="submit" id="cancel-button">Cancel savepoint</button></form>'
        '<div id="msg"></div></section>'
    )


def _graph_svg(graph: Mapping[str, Any]) -> str:
    nodes = {n["id"]: n for n in graph.get("nodes") or ()}
    if not nodes:
        return '<p class="muted">no app has registered yet</p>'
    w, h = 170, 34
    cols = max(n["level"] for n in nodes.values()) + 1
    rows = max(n["row"] for n in nodes.values()) + 1
    width, height = 20 + cols * 200, 20 + rows * 56

    def pos(n: Mapping[str, Any]) -> tuple[int, int]:
        return 10 + int(n["level"]) * 200, 10 + int(n["row"]) * 56

    parts = [
        f'<svg id="graph" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'role="img" aria-label="pipeline graph"><defs><marker id="arrow" viewBox="0 0 10 10" '
        'refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto">'
        '<path d="M0,0L10,5L0,10z" fill="#6b7280"/></marker></defs>'
    ]
    for e in graph.get("edges") or ():
        a, b = nodes.get(e["source"]), nodes.get(e["target"])
        if a is None or b is None:
            continue
        (x1, y1), (x2, y2) = pos(a), pos(b)
        parts.append(
            f'<line x1="{x1 + w}" y1="{y1 + h // 2}" x2="{x2}" y2="{y2 + h // 2}" '
            'stroke="#6b7280" marker-end="url(#arrow)"/>'
        )
    fills = {"app": "#2f6fde", "input": "#e6ecf5", "internal": "#fff0c2", "output": "#d6f5dd"}
    for n in nodes.values():
        x, y = pos(n)
        kind = str(n["kind"])
        rx = 4 if kind == "app" else 16
        color = "#fff" if kind == "app" else "#1d2330"
        label = str(n["label"])
        short = label if len(label) <= 26 else label[:12] + "…" + label[-12:]
        parts.append(
            f'<g class="node {_e(kind)}" data-id="{_e(n["id"])}"><title>{_e(kind)}: {_e(label)}'
            f'</title><rect x="{x}" y="{y}" width="{w}" height="{h}" rx="{rx}" '
            f'fill="{fills.get(kind, "#eee")}" stroke="#9aa3b2"/>'
            f'<text x="{x + w // 2}" y="{y + h // 2 + 4}" text-anchor="middle" '
            f'fill="{color}">{_e(short)}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _graph_list(apps: Sequence[Mapping[str, Any]]) -> str:
    items = []
    for app in apps:
        topics = []
        for label, field in (
            ("reads", "inputs"),
            ("writes (internal)", "internal_outputs"),
            ("writes", "outputs"),
        ):
            names = ", ".join(_e(t) for t in app.get(field) or ()) or "–"
            topics.append(f"<li>{label}: {names}</li>")
        topics.append(
            f"<li>internal: {_e(app.get('control_topic'))}, {_e(app.get('dlq_topic'))}</li>"
        )
        items.append(f"<li><b>{_e(app['name'])}</b><ul>{''.join(topics)}</ul></li>")
    return f'<ul class="graph-list">{"".join(items)}</ul>'


def _instances_of(snapshot: Mapping[str, Any], app: str) -> list[Mapping[str, Any]]:
    return [i for i in snapshot.get("instances") or () if i.get("app") == app]


def _app_section(app: Mapping[str, Any], snapshot: Mapping[str, Any]) -> str:
    name = str(app["name"])
    halted = app.get("halted") or {}
    checkpoints = app.get("checkpoints") or []
    latest = checkpoints[0] if checkpoints else None
    badges = [
        f'<span class="badge">{_e(app.get("key_groups"))} key groups</span>',
        f'<span class="badge">throughput {_e(_rate(app.get("throughput")))}</span>',
        f'<span class="badge {"warn" if app.get("lag_total") else "ok"}">lag '
        f"{_e(app.get('lag_total'))}</span>",
    ]
    dead = app.get("dead_letters")
    badges.append(
        f'<span class="badge {"bad" if dead else ""}">dead letters {_e(dead)}</span>'
        if dead is not None
        else '<span class="badge">no dead-letter topic</span>'
    )
    if halted:
        badges.append(f'<span class="badge bad">{len(halted)} key groups halted</span>')
    if app.get("error"):
        badges.append(f'<span class="badge bad access-error">{_e(app["error"])}</span>')
    latest_html = (
        f'latest completed checkpoint <b class="latest-checkpoint" data-app="{_e(name)}">'
        f"{_e(latest['checkpoint'])}</b> at {_e(latest.get('time'))}"
        if latest
        else '<span class="latest-checkpoint none" data-app="'
        + _e(name)
        + '">no completed checkpoint yet</span>'
    )
    lag_by_group: dict[int, int] = {}
    for r in app.get("lag") or ():
        if r.get("lag") is not None:
            lag_by_group[int(r["partition"])] = lag_by_group.get(int(r["partition"]), 0) + int(
                r["lag"]
            )
    insts = _instances_of(snapshot, name)
    marks_of = key_group_watermarks(insts)
    now_ms = snapshot.get("generated_ms")
    kg_rows = []
    for r in app.get("key_group_rows") or ():
        g = int(r["key_group"])
        state = (
            f'<span class="badge bad">halted at {_e(r.get("halted"))}</span>'
            if r.get("halted")
            else '<span class="badge ok">running</span>'
            if r.get("checkpoint") is not None
            else '<span class="badge">no checkpoint</span>'
        )
        kg_rows.append(
            [
                f'<td data-key-group="{g}">{g}</td>',
                _e(r.get("instance")),
                _num(r.get("checkpoint")),
                _e(r.get("time")),
                "yes" if r.get("aligned") else "no",
                state,
                _e(r.get("origin")),
                _num(lag_by_group.get(g)),
                _watermark_cell(g, marks_of.get(g), r.get("instance"), now_ms),
            ]
        )
    kg_table = _table(
        [
            "key group",
            "instance",
            "checkpoint",
            "committed at",
            "aligned",
            "state",
            "restored from",
            "lag",
            "watermark",
        ],
        kg_rows,
        f'class="key-groups" data-app="{_e(name)}"',
    )
    ck_rows = [
        [
            _num(c["checkpoint"]),
            _e(c.get("time")),
            _num(None if c.get("duration_ms") is None else f"{c['duration_ms']} ms"),
            _num(c.get("records")),
            "yes" if c.get("aligned") else "no",
        ]
        for c in checkpoints
    ]
    ck_table = _table(
        ["checkpoint", "completed at", "duration", "records", "aligned"],
        ck_rows,
        f'class="checkpoints" data-app="{_e(name)}"',
    )
    lag_table = _table(
        ["topic", "partition", "committed", "end", "lag"],
        (
            [
                _e(r["topic"]),
                _num(r["partition"]),
                _num(r["committed"]),
                _num(r["end"]),
                _num(r["lag"]),
            ]
            for r in app.get("lag") or ()
        ),
        'class="lag"',
    )
    align = [
        i["metrics"]["alignment_mean_s"]
        for i in insts
        if "alignment_mean_s" in i.get("metrics", {})
    ]
    commit = [
        i["metrics"]["commit_mean_s"] for i in insts if "commit_mean_s" in i.get("metrics", {})
    ]
    timing = []
    if align:
        timing.append(f"mean alignment time {max(align) * 1000:.1f} ms (slowest instance)")
    if commit:
        timing.append(f"mean commit time {max(commit) * 1000:.1f} ms (slowest instance)")
    if not timing:
        timing.append("alignment and commit times: no instance endpoint known")
    marks = [
        [
            _e(i["id"]),
            _e(w["name"]),
            _e(", ".join(f"{k}={v}" for k, v in w["labels"].items())),
            _num(w["value"]),
        ]
        for i in insts
        for w in i.get("watermarks") or ()
        if "key_group" not in w["labels"]
    ]
    marks_html = (
        _table(["instance", "metric", "labels", "value"], marks, 'class="watermarks"')
        + '<p class="muted">each key group\'s watermark: the key groups table</p>'
        if marks
        else '<p class="muted">watermarks: not exposed by the instances\' /metrics (the app '
        "uses no event time, or no record carried a timestamp yet)</p>"
    )
    return (
        f'<section class="card app" data-app="{_e(name)}"><h3>{_e(name)}</h3>'
        f"<div>{''.join(badges)}</div><p>{latest_html}</p>"
        f'<p class="muted">{_e("; ".join(timing))}</p>'
        '<div class="grid"><div><h2>Key groups</h2>' + kg_table + "</div>"
        "<div><h2>Completed checkpoints</h2>" + ck_table + "</div>"
        "<div><h2>Lag per partition</h2>" + lag_table + "</div></div>"
        "<h2>Watermarks</h2>" + marks_html + "</section>"
    )


def key_group_watermarks(
    instances: Sequence[Mapping[str, Any]],
) -> dict[int, list[tuple[str, float, bool]]]:
    """Return key group -> [(instance, watermark in Unix seconds, idle)] of one app.

    From each instance's ``lockgate_key_group_watermark_timestamp_seconds`` and
    ``lockgate_key_group_idle`` samples (``watermarks`` of the snapshot's instances).
    """
    out: dict[int, list[tuple[str, float, bool]]] = {}
    for inst in instances:
        idle: set[str] = {
            str(w["labels"].get("key_group"))
            for w in inst.get("watermarks") or ()
            if w["name"] == "lockgate_key_group_idle" and w["value"]
        }
        for w in inst.get("watermarks") or ():
            g = w["labels"].get("key_group")
            if w["name"] != "lockgate_key_group_watermark_timestamp_seconds" or g is None:
                continue
            with contextlib.suppress(ValueError):
                out.setdefault(int(g), []).append(
                    (str(inst["id"]), float(w["value"]), str(g) in idle)
                )
    return out


def _watermark_cell(
    g: int,
    found: Sequence[tuple[str, float, bool]] | None,
    owner: Any,
    now_ms: Any,
) -> str:
    """The key group's watermark (from its owner's /metrics when two instances say)."""
    if not found:
        return f'<td class="watermark none" data-watermark-of="{g}">–</td>'
    iid, value, idle = next((f for f in found if f[0] == owner), found[0])
    ms = int(value * 1000)
    behind = ""
    if isinstance(now_ms, int):
        behind = f" ({max(0, now_ms - ms) / 1000:,.1f} s behind)"
    badge = ' <span class="badge">idle</span>' if idle else ""
    return (
        f'<td class="watermark" data-watermark-of="{g}" data-watermark-ms="{ms}" '
        f'title="from {_e(iid)}">{_e(ms_to_iso(ms))}{_e(behind)}{badge}</td>'
    )


def _instances_table(snapshot: Mapping[str, Any]) -> str:
    rows = []
    for i in snapshot.get("instances") or ():
        m = i.get("metrics") or {}
        ready = i.get("ready")
        state = (
            '<span class="badge">unknown</span>'
            if ready is None
            else '<span class="badge ok">ready</span>'
            if ready
            else '<span class="badge bad">not ready</span>'
        )
        rows.append(
            [
                f'<td data-instance="{_e(i["id"])}">{_e(i["id"])}</td>',
                _e(i.get("app")),
                _e(", ".join(str(g) for g in i.get("key_groups") or ())),
                state,
                _num(m.get("records_in")),
                _num(m.get("dlq_records")),
                _num(m.get("epochs_committed")),
                _num(m.get("epochs_aborted")),
                _e(i.get("url") or "not known")
                + (f" ({_e(i['error'])})" if i.get("error") else ""),
            ]
        )
    return _table(
        [
            "instance",
            "app",
            "key groups",
            "readiness",
            "records in",
            "dead letters",
            "epochs",
            "aborts",
            "endpoint",
        ],
        rows,
        'class="instances"',
    )


def _savepoints_table(snapshot: Mapping[str, Any]) -> str:
    sp = snapshot.get("savepoints") or {}
    if sp.get("error"):
        return f'<p class="muted">{_e(sp["error"])}</p>'
    rows = []
    for r in sp.get("rows") or ():
        apps = r.get("apps") or []
        sid = str(r["savepoint"])
        rows.append(
            [
                f'<td data-savepoint="{_e(sid)}">'
                f'<a href="/savepoints/{_e(sid)}">{_e(sid)}</a></td>',
                _e(r.get("created")),
                _num(r.get("checkpoint")),
                _e(", ".join(apps)),
                "stop" if r.get("stop") else "",
                f'<td><button type="button" data-cancel="{_e(sid)}" '
                f'data-pipeline="{_e(apps[0] if apps else "")}">cancel…</button></td>',
            ]
        )
    if not rows:
        return '<p class="muted">no savepoints yet</p>'
    return _table(
        ["savepoint", "created", "checkpoint", "apps", "", ""], rows, 'class="savepoints"'
    )


_JOB_BADGE = {"failed": "bad", "completed": "ok"}


def _jobs_table(jobs: Sequence[Mapping[str, Any]]) -> str:
    if not jobs:
        return ""
    rows = [
        [
            _e(j["id"]),
            _e(j.get("pipeline") or ", ".join(j.get("apps") or [])),
            f'<span class="badge {_JOB_BADGE.get(str(j["state"]), "warn")}">'
            f"{_e(j['state'])}</span>",
            _e(j.get("savepoint")),
            _e(j.get("error") or ((j.get("lines") or [""])[-1])),
        ]
        for j in jobs
    ]
    return "<h2>Triggered here</h2>" + _table(
        ["job", "pipeline", "state", "savepoint", "last message"], rows, 'class="jobs"'
    )


def live_fragment(snapshot: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]]) -> str:
    """Return the part of the overview that the page refreshes.

    Args:
        snapshot: the latest snapshot.
        jobs: the savepoint jobs (newest first).
    """
    apps = snapshot.get("apps") or []
    error = snapshot.get("error")
    names = "".join(f'<option value="{_e(a["name"])}">' for a in apps)
    parts = [
        f'<p class="muted">updated <span id="generated">{_e(snapshot.get("generated"))}</span></p>',
        f'<datalist id="app-names">{names}</datalist>',
    ]
    if error:
        parts.append(f'<p class="badge bad" id="error">{_e(error)}</p>')
    if snapshot.get("generated") is None:
        parts.append(
            '<p class="badge warn" id="error">reading the registry and the control topics: '
            "no answer from Kafka yet (check LOCKGATE_BOOTSTRAP_SERVERS)</p>"
        )
    parts.append(
        '<section class="card"><h2>Pipeline</h2>'
        + _graph_svg(snapshot.get("graph") or {})
        + _graph_list(apps)
        + "</section>"
    )
    parts.append(
        '<section class="card"><h2>Instances</h2>' + _instances_table(snapshot) + "</section>"
    )
    parts.append("<h2>Apps</h2>")
    parts.extend(_app_section(a, snapshot) for a in apps)
    parts.append(
        '<section class="card" id="savepoints"><h2>Savepoints</h2>'
        + _savepoints_table(snapshot)
        + _jobs_table(jobs)
        + "</section>"
    )
    return "".join(parts)


def savepoint_page(descriptor: Mapping[str, Any]) -> str:
    """Return the body of a savepoint's page (``savepoint describe``).

    Args:
        descriptor: the savepoint's descriptor
            (:func:`~processors._ops.catalog.describe_savepoint`).
    """
    head = (
        '<section class="card"><h2>Savepoint <span id="savepoint-id">'
        f"{_e(descriptor.get('savepoint'))}</span></h2>"
        f"<p>checkpoint {_e(descriptor.get('checkpoint'))}, created "
        f"{_e(descriptor.get('created'))}{', stop' if descriptor.get('stop') else ''}</p>"
    )
    parts = [head]
    for app, info in (descriptor.get("apps") or {}).items():
        rows = []
        for m in info.get("manifests") or ():
            stores = "; ".join(
                f"{name}: {s.get('entries')} entries, {s.get('bytes')} bytes"
                for name, s in sorted((m.get("stores") or {}).items())
            )
            offsets = " ".join(f"{t}={o}" for t, o in sorted((m.get("offsets") or {}).items()))
            rows.append(
                [
                    _num(m.get("key_group")),
                    _num(m.get("checkpoint")),
                    _e(offsets or None),
                    _e(stores or None),
                ]
            )
        parts.append(
            f"<h3>{_e(app)}</h3><p class=muted>{_e(info.get('key_groups'))} key groups; inputs "
            f"{_e(', '.join(info.get('inputs') or []) or None)}; outputs "
            f"{_e(', '.join(info.get('outputs') or []) or None)}</p>"
            + _table(["key group", "checkpoint", "offsets", "stores"], rows)
        )
    parts.append(
        '<p><a href="/api/savepoints/'
        + _e(descriptor.get("savepoint"))
        + '">descriptor (JSON)</a></p>'
        "</section>"
    )
    return "".join(parts)
