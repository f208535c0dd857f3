"""One self-contained HTML page of a run (``ors check --html FILE``).

The page has no external resources: inline CSS, no scripts. A summary table gives each
check's verdict and time; below it, one section per check with the first violation and
its JSON path, then every exchange of the check: the request as sent and what the
server answered, one block per SSE event or WebSocket frame. Failed checks come open.
"""

from __future__ import annotations

import html
import json
from typing import Any

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:72rem;padding:0 1rem;color:#1d1d1f}
h1{font-size:1.4rem}table{border-collapse:collapse;width:100%}td,th{padding:.3rem .6rem;text-align:left;
border-bottom:1px solid #ddd}.PASS{color:#0a7d32;font-weight:600}.FAIL{color:#b3261e;font-weight:600}
.SKIP{color:#8a6d00;font-weight:600}details{border:1px solid #ddd;border-radius:6px;margin:.8rem 0;padding:.4rem .8rem}
summary{cursor:pointer}pre{background:#f6f8fa;padding:.5rem;overflow:auto;max-height:24rem;font-size:12px}
.violation{background:#fdecea;border-left:4px solid #b3261e;padding:.4rem .6rem}code{font-size:12px}
.meta{color:#555}
"""


def render(report: dict[str, Any]) -> str:
    """The page for ``report`` (``compliance.__main__.report`` with exchanges)."""
    verdict = "conformant" if report["conformant"] else "not conformant"
    rows = "".join(
        f"<tr><td><a href='#{_e(check['name'])}'>{_e(check['name'])}</a></td>"
        f"<td class='{check['status']}'>{check['status']}</td><td>{check['seconds']:.1f} s</td>"
        f"<td>{_e(_first_line(check['reason']))}</td></tr>"
        for check in report["checks"]
    )
    sections = "".join(_section(check) for check in report["checks"])
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>Open Responses check: {_e(report['endpoint'])}</title><style>{STYLE}</style></head><body>"
        f"<h1>Open Responses check: {_e(report['endpoint'])}</h1>"
        f"<p class='meta'>model <code>{_e(report['model'])}</code> · checked {_e(report['checked_at'])} · "
        f"{report['wall_seconds']} s · <b>{verdict}</b>: {report['passed']} passed, {report['failed']} failed, "
        f"{report['skipped']} skipped</p>"
        f"<table><tr><th>check</th><th>verdict</th><th>time</th><th>reason</th></tr>{rows}</table>"
        f"{sections}</body></html>\n"
    )


def _section(check: dict[str, Any]) -> str:
    opened = " open" if check["status"] == "FAIL" else ""
    violation = ""
    if check["reason"]:
        where = f"<br>at <code>{_e(check['json_path'])}</code>" if check.get("json_path") else ""
        violation = f"<p class='violation'>{_e(check['reason'])}{where}</p>"
    exchanges = "".join(_exchange(index, exchange) for index, exchange in enumerate(check.get("exchanges", []), 1))
    return (
        f"<details id='{_e(check['name'])}'{opened}><summary><span class='{check['status']}'>{check['status']}</span> "
        f"{_e(check['name'])} <span class='meta'>({check['seconds']:.1f} s)</span></summary>"
        f"{violation}{exchanges or '<p class=meta>No request was sent.</p>'}</details>"
    )


def _exchange(index: int, exchange: dict[str, Any]) -> str:
    head = f"{index}. {_e(exchange['method'])} <code>{_e(exchange['url'])}</code>"
    if exchange["transport"] == "websocket":
        head += " (WebSocket)"
    elif exchange["status"] is not None:
        head += f" → {exchange['status']} <span class='meta'>{_e(exchange['content_type'])}</span>"
    sent = "".join(f"<pre>{_e(_pretty(message))}</pre>" for message in exchange["sent"])
    received = "".join(f"<pre>{_e(_pretty(message))}</pre>" for message in exchange["received"])
    cut = (f"<p class='meta'>{exchange['truncated_bytes']:,} more bytes not kept.</p>"
           if exchange["truncated_bytes"] else "")
    count = len(exchange["received"])
    return (
        f"<h4>{head}</h4><p class='meta'>sent</p>{sent or '<p class=meta>(no body)</p>'}"
        f"<p class='meta'>received: {count} message{'s' if count != 1 else ''}</p>{received}{cut}"
    )


def _pretty(message: Any) -> str:
    return message if isinstance(message, str) else json.dumps(message, indent=2, ensure_ascii=False)


def _first_line(text: str) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= 160 else line[:157] + "..."


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)
