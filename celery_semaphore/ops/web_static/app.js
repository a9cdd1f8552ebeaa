// celery-semaphore's operator page: polls the JSON of celery_semaphore.ops.web once a second.
// Every name shown is user data: it goes into the page as text (textContent, createTextNode),
// never as markup.
"use strict";

const POLL_MS = 1000;
let busy = false;
let pointerDown = false;
let actionsOn = false;
let lastView = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 60) return seconds.toFixed(1) + "s";
  const whole = Math.floor(seconds);
  if (whole < 3600) return Math.floor(whole / 60) + "m" + String(whole % 60).padStart(2, "0") + "s";
  return Math.floor(whole / 3600) + "h" + String(Math.floor((whole % 3600) / 60)).padStart(2, "0") + "m";
}

// A holder's process liveness, in the words of `celery semaphore show`.
function livenessText(h) {
  if (h.liveness === "alive") return "alive (record expires in " + duration(h.liveness_left) + ")";
  if (h.liveness === "expired" && h.liveness_left !== null && h.liveness_left !== undefined) {
    return "process record expired " + duration(-h.liveness_left) + " ago: reclaimed at the next call";
  }
  if (h.liveness === "expired" || h.liveness === "gone") {
    return "process record gone: reclaimed at the next call";
  }
  return "-";
}

function cell(value) {
  if (value === null || value === undefined || value === "") return "-";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (Array.isArray(value)) return value.join(", ");
  return String(value);
}

function bar(used, cap) {
  // nothing to draw against (no limit known): no bar, rather than a placeholder
  if (!(typeof cap === "number" && cap > 0)) return el("span", { class: "no-bar" });
  const fill = el("span");
  fill.style.width = Math.min(100, (100 * used) / cap) + "%";
  return el("span", { class: "bar" + (used >= cap ? " full" : ""), title: used + " of " + cap },
    fill);
}

function table(headers, rows, cls) {
  return el(
    "table",
    { class: cls },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows),
  );
}

function td(value, cls) {
  return el("td", { class: cls }, value instanceof Node ? value : cell(value));
}

function semLink(name) {
  return el("a", { href: "#/s/" + encodeURIComponent(name), class: "sem-link" }, name);
}

function taskLink(taskId) {
  if (!taskId) return "-";
  return el("a", { href: "#/explain/" + encodeURIComponent(taskId), class: "task-link" }, taskId);
}

function tasks(names, most) {
  if (!names || !names.length) return "-";
  const shown = names.slice(0, most).join(", ");
  return names.length > most ? shown + " (+" + (names.length - most) + " more)" : shown;
}

function partCap(part, limit) {
  // a partition without a cap may take up to the whole limit
  return part.cap !== undefined && part.cap !== null ? part.cap : limit;
}

function partName(part) {
  return part.name ? String(part.name) : "(default)";
}

function rateText(w) {
  // "7 started, 3 available" and, when full, ", opens in 0.4s" (as the CLI writes it)
  let text = w.started + " started, " + w.available + " available";
  if (w.available <= 0 || w.opens_in > 0) text += ", opens in " + duration(w.opens_in);
  return text;
}

function whyText(w) {
  // why a waiter waits, in the CLI's words: its reason (the semaphore is full, its queue is at
  // its cap, a rate window, an adaptive pause); from an older server, its "why"
  if (w.reason) return w.reason.text;
  return w.why ? w.why.text : null;
}

const REASON_LABELS = {
  pause: "adaptive pause", cap: "queue at its cap", units: "semaphore full",
  rate: "rate window full", starting: "starting",
};

function reasonsText(row) {
  // "2 queue at its cap, 1 semaphore full": the waiters by why they wait (null: none)
  const counts = row.waiting_by_reason || {};
  const shown = Object.entries(counts).filter(([, n]) => n > 0)
    .map(([kind, n]) => n + " " + (REASON_LABELS[kind] || kind));
  return shown.length ? shown.join(", ") : null;
}

function waiterLines(waiters, parts) {
  // the waiters by partition ("" the default one), each line by position: the partitions in
  // the order the server lists them, then any other (as `celery semaphore show` groups them)
  const lines = new Map();
  for (const p of parts || []) lines.set(p.name || "", []);
  for (const w of waiters) {
    const name = w.partition || "";
    if (!lines.has(name)) lines.set(name, []);
    lines.get(name).push(w);
  }
  return [...lines.entries()].filter(([, line]) => line.length)
    .map(([name, line]) => [name, line.sort((a, b) => a.position - b.position)]);
}

function limitText(row) {
  return cell(row.limit) + " (" + row.source + ")";
}

function effectiveText(row) {
  // why the effective limit is lower, or the throttle pause (null: neither), as the CLI says it
  return row.effective && row.effective.text ? row.effective.text : null;
}

// -- views -------------------------------------------------------------------------------------

function route() {
  const hash = location.hash || "#/";
  if (hash.startsWith("#/s/")) return { kind: "detail", name: decodeURIComponent(hash.slice(4)) };
  if (hash.startsWith("#/explain/")) {
    return { kind: "explain", taskId: decodeURIComponent(hash.slice(10)) };
  }
  if (hash.startsWith("#/after/")) {
    return { kind: "overview", after: decodeURIComponent(hash.slice(8)) };
  }
  return { kind: "overview", after: null };
}

function overview(data) {
  const rows = [];
  for (const s of data.semaphores) {
    rows.push(
      el(
        "tr",
        { "data-name": s.name, class: "sem-row" },
        td(semLink(s.name)),
        td(limitText(s), "limit"),
        td(s.setting, "num"),
        td(s.code),
        td(s.used + "/" + cell(s.limit), "num used"),
        td(bar(s.used, s.limit)),
        td(s.holders, "num holders"),
        el("td", { class: "num waiting", title: reasonsText(s) }, cell(s.waiting)),
        td(s.waiting ? duration(s.oldest_wait) : "-", "num"),
        td(duration(s.hold_time_avg), "num"),
        td(s.reclaimed_total, "num"),
        td(tasks(s.tasks, 3), "tasks"),
      ),
    );
    for (const p of s.partitions) {
      const capped = p.cap !== undefined && p.cap !== null;
      const cap = partCap(p, s.limit);
      rows.push(
        el(
          "tr",
          { class: "part" },
          td("↳ partition " + partName(p)),
          td(capped ? "cap " + p.cap + (p.used >= p.cap && p.waiting ? " (at its cap)" : "")
            : "no cap"),
          td(""),
          td(""),
          td(cell(p.used) + "/" + cell(cap), "num"),
          td(bar(p.used || 0, cap)),
          td(""),
          td(p.waiting, "num"),
          td(""),
          td(""),
          td(""),
          td(""),
        ),
      );
    }
    const eff = effectiveText(s);
    if (eff) {
      const effLimit = s.effective.limit;
      rows.push(
        el(
          "tr",
          { class: "effective" },
          td("↳ effective limit"),
          td(cell(effLimit) + " of " + cell(s.limit)),
          td(""),
          td(""),
          td(s.used + "/" + cell(effLimit), "num"),
          td(bar(s.used, effLimit)),
          td(""),
          td(""),
          td(""),
          td(""),
          td(""),
          td(eff, "effective-text"),
        ),
      );
    }
    for (const w of s.rates || []) {
      rows.push(
        el(
          "tr",
          { class: "rate", "data-rate": w.rate },
          td("↳ rate " + w.rate),
          td("at most " + w.count + " per " + duration(w.period)),
          td(""),
          td(""),
          td(w.started + "/" + w.count, "num"),
          td(bar(w.started, w.count)),
          td(""),
          td(""),
          td(""),
          td(""),
          td(""),
          td(rateText(w), "rate-text"),
        ),
      );
    }
  }
  const headers = [
    "Semaphore", "Limit in force (source)", "Setting", "Code", "In use", "", "Holders",
    "Waiting", "Oldest wait", "Hold avg", "Leases reclaimed", "Tasks",
  ];
  if (!rows.length) {
    return el("p", { class: "muted" }, "No semaphores known under key prefix " + data.prefix +
      " (no limited task in the app, none registered by a worker, no state in Redis).");
  }
  return table(headers, rows, "overview");
}

function pager(data, after) {
  // a page at a time, by name: the server reads only the semaphores shown
  if (data.next === null && after === null) return el("span");
  const links = [];
  if (after !== null) links.push(el("a", { href: "#/", class: "first-page" }, "First page"), " ");
  if (data.next !== null) {
    links.push(el("a", { href: "#/after/" + encodeURIComponent(data.next), class: "next-page" },
      "Next page"));
  }
  return el("p", { class: "muted pager" }, "Showing " + data.semaphores.length + " of " +
    data.total + " semaphores, by name. ", ...links);
}

function detailLive(d) {
  const facts = [
    ["Limit in force", limitText(d)],
    ["Runtime override", d.override],
    ["Effective limit", effectiveText(d) ||
      (d.effective ? cell(d.effective.limit) + " (not lowered, no pause)" : null)],
    ["Throttles", d.effective && d.effective.throttles_total ? d.effective.throttles_total +
      " (the last " + duration(d.effective.last_throttle_age) + " ago)" : 0],
    ["Rate", d.rate && d.rate.rate ? d.rate.rate + " (" +
      (d.rate.source === "override" ? "runtime override" : "the tasks' rate=") + ")" : null],
    ["Setting (semaphore_limits)", d.setting],
    ["Code (@limited)", d.code],
    ["In use", d.used + " of " + cell(d.limit) + " unit(s)"],
    ["Holders / waiting", d.holders + " / " + d.waiting +
      (d.waiting ? " (oldest " + duration(d.oldest_wait) + ")" : "")],
    ["Why they wait", reasonsText(d)],
    ["Hold time (average of recent releases)", duration(d.hold_time_avg)],
    ["Leases expired and reclaimed", d.reclaimed_total],
    ["Permits granted", d.grants_total],
    ["Line full (max_waiting): refused / dropped for a newer task",
      (d.full_total || d.dropped_total) ? d.full_total + " / " + d.dropped_total : null],
    ["Tasks", tasks(d.tasks, 10)],
    ["Priority, and when the line is full", (d.line_policies || []).map((p) =>
      p.task + ": priority " + p.priority + ", max_waiting " + cell(p.max_waiting) +
      ", on_full " + p.on_full).join("; ") || null],
    ["Found in", d.found_in],
    ["Recorded by", d.recorded_by],
  ];
  const out = [
    el("dl", {}, facts.map(([k, v]) => [el("dt", {}, k), el("dd", {}, cell(v))])),
    el("div", {}, bar(d.used, d.limit)),
  ];
  if (d.partitions.length) {
    out.push(el("h2", {}, "Partitions"));
    out.push(
      table(
        ["Partition", "In use", "", "Cap", "Weight", "Waiting"],
        d.partitions.map((p) =>
          el("tr", {}, td(partName(p)), td(p.used, "num"), td(bar(p.used || 0, partCap(p, d.limit))),
            td(p.cap, "num"), td(p.weight, "num"), td(p.waiting, "num"))),
      ),
    );
  }
  if ((d.rates || []).length) {
    out.push(el("h2", {}, "Rate windows"));
    out.push(
      table(
        ["Rate", "Started", "", "Available", "Opens in"],
        d.rates.map((w) =>
          el("tr", { class: "rate", "data-rate": w.rate }, td(w.rate), td(w.started, "num started"),
            td(bar(w.started, w.count)), td(w.available, "num available"),
            td(w.available > 0 && !(w.opens_in > 0) ? "has room" : duration(w.opens_in),
              "num opens-in"))),
        "rates",
      ),
    );
  }
  out.push(el("h2", {}, "Holders (" + d.holder_list.length + ")"));
  const holderHead = ["Task id", "Task", "Host", "PID", "Weight", "Age", "Lease left",
    "Partition", "Fence", "Token", "Process", "Liveness"];
  if (actionsOn) holderHead.push("");
  out.push(
    table(
      holderHead,
      d.holder_list.map((h) => {
        const row = el("tr", { class: "holder", "data-task-id": h.task_id },
          td(taskLink(h.task_id)), td(h.task), td(h.host), td(h.pid, "num"),
          td(h.weight, "num"), td(duration(h.age), "num"), td(duration(h.lease_left), "num"),
          td(h.partition), td(h.fencing_token, "num"), td(h.token), td(h.process, "process"),
          td(livenessText(h), "liveness"));
        if (actionsOn) {
          row.appendChild(td(el("button", {
            class: "danger release",
            onclick: () => {
              if (confirm("Force-release token " + h.token + "? Its task keeps running.")) {
                act("release", { name: d.name, token: h.token });
              }
            },
          }, "Release")));
        }
        return row;
      }),
      "holders",
    ),
  );
  out.push(el("h2", {}, "Waiters (" + d.waiter_list.length + ")"));
  const groups = waiterLines(d.waiter_list, d.partitions);
  const rows = [];
  for (const [name, line] of groups) {
    if (groups.length > 1 || name) {
      // positions count within a partition's line: a heading row per line
      const part = (d.partitions || []).find((p) => (p.name || "") === name) || { name };
      const capped = part.cap !== undefined && part.cap !== null;
      rows.push(el("tr", { class: "line", "data-partition": name },
        el("th", { colspan: 10 }, "Queue " + partName(part) + ": " + cell(part.used) + " in use" +
          (capped ? " of its cap " + part.cap : " (no cap)") + ", " + line.length + " waiting")));
    }
    for (const w of line) {
      rows.push(el("tr", { class: "waiter", "data-task-id": w.task_id || w.ticket,
        "data-partition": name },
        td(w.position, "num position"), td(taskLink(w.task_id || w.ticket)), td(w.task),
        td(w.weight, "num"), td(w.priority, "num priority"), td(duration(w.waited), "num"),
        td(w.how, "how"),
        td(w.held_by, "held-by"), td(w.host), td(whyText(w), "why")));
    }
  }
  out.push(
    table(
      ["Position", "Task id", "Task", "Weight", "Priority", "Waited", "How", "Held by", "Host",
        "Why it waits"],
      rows,
      "waiters",
    ),
  );
  const acts = d.operator_actions || [];
  if (acts.length) {
    out.push(el("h2", {}, "Recent operator actions"));
    out.push(
      table(
        ["When", "Action", "By", "Detail"],
        acts.map((a) => el("tr", {}, td(new Date(a.at * 1000).toLocaleString()), td(a.action),
          td(a.user + "@" + a.host + (a.detail && a.detail.via ? " via " + a.detail.via : "") +
            (a.detail && a.detail.operator ? " (" + a.detail.operator + ")" : "")),
          td(JSON.stringify(a.detail)))),
      ),
    );
  }
  return out;
}

function detailActions(name) {
  const limit = el("input", { id: "limit-input", type: "number", min: "1", size: "5" });
  const rate = el("input", { id: "rate-input", type: "text", size: "10", placeholder: "10/s" });
  return el(
    "div",
    { class: "act", id: "actions" },
    el("label", { for: "limit-input" }, "runtime limit"),
    limit,
    el("button", {
      id: "set-limit",
      onclick: () => {
        const value = parseInt(limit.value, 10);
        if (!(value >= 1)) return showMessage("give a limit of at least 1", false);
        act("set-limit", { name, limit: value });
      },
    }, "Set limit"),
    el("button", { id: "clear-limit", onclick: () => act("set-limit", { name, limit: null }) },
      "Clear override"),
    el("label", { for: "rate-input" }, "runtime rate"),
    rate,
    el("button", {
      id: "set-rate",
      onclick: () => {
        const value = rate.value.trim();
        if (!value) return showMessage("give a rate such as 10/s (or 60/m, 1000/h)", false);
        act("set-rate", { name, rate: value.split(",").map((v) => v.trim()) });
      },
    }, "Set rate"),
    el("button", { id: "clear-rate", onclick: () => act("set-rate", { name, rate: null }) },
      "Clear rate"),
    el("button", {
      id: "reset", class: "danger",
      onclick: () => {
        if (confirm("Reset " + name + ": drop every holder and waiter?")) act("reset", { name });
      },
    }, "Reset (drop holders and waiters)"),
  );
}

function explained(r) {
  // why the task waits, in one sentence first (wrapped, as a paragraph), then the facts
  const lines = r.text.split("\n");
  const sentence = r.sentence ? el("p", { class: "sentence" }, r.sentence) : null;
  const facts = r.sentence ? lines.slice(1).join("\n") : r.text;
  return el("div", {}, el("p", {}, semLink(r.name)), sentence,
    el("pre", { class: "explain" }, facts));
}

// -- fetching ----------------------------------------------------------------------------------

async function getJSON(url) {
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) {
    const err = new Error(body.error || response.statusText);
    err.status = response.status;
    throw err;
  }
  return body;
}

function setStatus(text, error) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = error ? "error" : "";
}

function showMessage(text, ok) {
  const box = document.getElementById("message");
  box.textContent = text;
  box.className = ok ? "ok" : "";
  box.hidden = false;
}

function setActions(on) {
  actionsOn = on;
  const note = document.getElementById("actions-note");
  note.textContent = on
    ? "Actions are on (set-limit, set-rate, reset, release): each needs the action token and is logged " +
      "with who did it (celery semaphore audit)."
    : "Read-only: actions (set-limit, set-rate, reset, release) are off. They are allowed only by " +
      "`celery semaphore serve --allow-actions` with a token.";
  note.className = "note" + (on ? " on" : "");
  document.getElementById("token-bar").hidden = !on;
}

async function act(action, payload) {
  const token = document.getElementById("token").value;
  const operator = document.getElementById("operator").value;
  try {
    const response = await fetch("/api/actions/" + action, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Semaphore-Token": token },
      body: JSON.stringify({ ...payload, operator }),
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      showMessage("refused (" + response.status + "): " + (body.error || response.statusText), false);
    } else {
      showMessage(action + " done: " + JSON.stringify(body), true);
    }
  } catch (exc) {
    showMessage(action + " failed: " + exc.message, false);
  }
  refresh();
}

async function refresh() {
  if (busy || pointerDown) return;
  busy = true;
  const view = route();
  const key = JSON.stringify(view);
  const main = document.getElementById("view");
  try {
    if (view.kind === "overview") {
      const query = view.after === null ? "" : "?after=" + encodeURIComponent(view.after);
      const data = await getJSON("/api/semaphores" + query);
      document.getElementById("prefix").textContent = "key prefix " + data.prefix;
      setActions(data.actions);
      main.replaceChildren(el("h2", {}, "Semaphores"), overview(data), pager(data, view.after));
    } else if (view.kind === "detail") {
      const data = await getJSON("/api/semaphore?name=" + encodeURIComponent(view.name));
      document.getElementById("prefix").textContent = "key prefix " + data.prefix;
      setActions(data.actions);
      if (lastView !== key || !document.getElementById("live")) {
        main.replaceChildren(
          el("h2", { id: "title" }, "Semaphore ", el("code", {}, data.name)),
          actionsOn ? detailActions(data.name) : el("span"),
          el("div", { id: "live" }),
        );
      }
      document.getElementById("live").replaceChildren(...detailLive(data));
    } else {
      const head = el("h2", {}, "Explain task ", el("code", {}, view.taskId));
      try {
        const data = await getJSON("/api/explain?task_id=" + encodeURIComponent(view.taskId));
        main.replaceChildren(head, ...data.results.map(explained));
      } catch (exc) {
        if (exc.status !== 404) throw exc;
        main.replaceChildren(head, el("pre", { class: "explain" }, exc.message));
      }
    }
    lastView = key;
    setStatus("updated " + new Date().toLocaleTimeString(), false);
  } catch (exc) {
    setStatus("error: " + exc.message, true);
    if (exc.status === 404 && view.kind === "detail") {
      main.replaceChildren(el("p", { class: "error" }, exc.message));
      lastView = null;
    }
  } finally {
    busy = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("explain-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = document.getElementById("explain-id").value.trim();
    if (id) location.hash = "#/explain/" + encodeURIComponent(id);
  });
  document.addEventListener("pointerdown", () => { pointerDown = true; });
  for (const end of ["pointerup", "pointercancel", "blur"]) {
    window.addEventListener(end, () => { pointerDown = false; });
  }
  window.addEventListener("hashchange", () => {
    document.getElementById("message").hidden = true;
    refresh();
  });
  refresh();
  setInterval(refresh, POLL_MS);
});
