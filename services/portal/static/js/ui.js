// Small DOM helpers: elements, times, sortable tables, cursor pagers, forms.

let ids = 0;

/** An element: h("a", {href: "#/x", class: "y", onclick: fn}, "text", child, ...). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      el.className = value;
    } else if (name in el && typeof value !== "string") {
      el[name] = value;
    } else {
      el.setAttribute(name, value === true ? "" : value);
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function uid(prefix) {
  ids += 1;
  return `${prefix}-${ids}`;
}

const LOCAL = new Intl.DateTimeFormat(undefined, {
  year: "numeric",
  month: "short",
  day: "2-digit",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  timeZoneName: "short",
});

/** A time in the viewer's zone, UTC on hover. */
export function time(iso) {
  if (!iso) return h("span", { class: "muted" }, "—");
  const date = new Date(iso);
  const utc = iso.replace("T", " ").replace("Z", " UTC");
  return h("time", { datetime: iso, title: utc }, LOCAL.format(date));
}

/** `datetime-local` input value -> ISO 8601 UTC with milliseconds, or "". */
export function localToIso(value) {
  if (!value) return "";
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? "" : date.toISOString();
}

/** ISO -> `datetime-local` value in the viewer's zone. */
export function isoToLocal(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const pad = (n) => String(n).padStart(2, "0");
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}` +
    `T${pad(d.getHours())}:${pad(d.getMinutes())}`
  );
}

export function badge(text, kind) {
  return h("span", { class: `badge ${kind || text}` }, text);
}

export function code(text) {
  return h("code", {}, text);
}

export function pre(value) {
  const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
  return h("pre", { tabindex: "0" }, text);
}

/**
 * A table whose time column sorts (this page's rows) by a header button.
 * columns: [{label, render(row) -> node|text, time: key?}]
 */
export function table(caption, columns, rows, { empty = "Nothing here yet." } = {}) {
  const timeColumn = columns.find((c) => c.time);
  let descending = true;
  const body = h("tbody");
  const wrapper = h("div", { class: "table-wrap" });
  const fill = () => {
    body.replaceChildren();
    const sorted = timeColumn
      ? [...rows].sort((a, b) => {
          const x = a[timeColumn.time] || "";
          const y = b[timeColumn.time] || "";
          return descending ? (x < y ? 1 : x > y ? -1 : 0) : x < y ? -1 : x > y ? 1 : 0;
        })
      : rows;
    for (const row of sorted) {
      body.append(h("tr", {}, columns.map((c) => h("td", {}, c.render(row)))));
    }
  };
  const headers = columns.map((c) => {
    if (!c.time) return h("th", { scope: "col" }, c.label);
    const th = h("th", { scope: "col", "aria-sort": "descending" });
    const button = h("button", { type: "button", class: "sort" }, `${c.label} ↓`);
    button.addEventListener("click", () => {
      descending = !descending;
      th.setAttribute("aria-sort", descending ? "descending" : "ascending");
      button.textContent = `${c.label} ${descending ? "↓" : "↑"}`;
      fill();
    });
    th.append(button);
    return th;
  });
  if (!rows.length) {
    wrapper.append(h("p", { class: "muted" }, empty));
    return wrapper;
  }
  fill();
  wrapper.append(
    h("table", {}, h("caption", {}, caption), h("thead", {}, h("tr", {}, headers)), body),
  );
  return wrapper;
}

/**
 * Previous / Next over an API's cursors. `state` keeps the cursors of earlier pages
 * (in memory: a reload starts again at the first page).
 */
export function pager(state, nextCursor, go) {
  const nav = h("nav", { class: "pager", "aria-label": "Pages" });
  const prev = h("button", { type: "button", disabled: !state.stack.length }, "Previous page");
  prev.addEventListener("click", () => {
    const cursor = state.stack.pop();
    go(cursor === "" ? null : cursor);
  });
  const next = h("button", { type: "button", disabled: !nextCursor }, "Next page");
  next.addEventListener("click", () => {
    state.stack.push(state.cursor || "");
    go(nextCursor);
  });
  nav.append(prev, h("span", { class: "muted" }, `Page ${state.stack.length + 1}`), next);
  return nav;
}

/**
 * A list's filters from the route's query (each "" when unset, `limit` too), with its
 * pager `state` started again when they change and its cursor taken from the query.
 */
export function listFilters(params, names, state) {
  const filters = Object.fromEntries([...names, "limit"].map((name) => [name, params.get(name) || ""]));
  const key = JSON.stringify(filters);
  if (state.key !== key) Object.assign(state, { stack: [], key });
  state.cursor = params.get("cursor");
  return filters;
}

/** A labelled field: label + control, bound by id. */
export function field(label, control, hint) {
  const id = control.id || uid("f");
  control.id = id;
  const parts = [h("label", { for: id }, label), control];
  if (hint) {
    const hintId = `${id}-hint`;
    control.setAttribute("aria-describedby", hintId);
    parts.push(h("small", { id: hintId, class: "muted" }, hint));
  }
  return h("div", { class: "field" }, parts);
}

export function input(attrs) {
  return h("input", { type: "text", ...attrs });
}

export function select(options, value, attrs) {
  const el = h("select", attrs || {});
  for (const option of options) {
    const [optValue, text] = Array.isArray(option) ? option : [option, option];
    el.append(h("option", { value: optValue, selected: optValue === value }, text));
  }
  return el;
}

/** A group of checkboxes with a legend; returns [fieldset, () => checked values]. */
export function checkboxes(legend, values, checked) {
  const set = new Set(checked || []);
  const boxes = values.map((value) => {
    const id = uid("c");
    const box = h("input", { type: "checkbox", id, value, checked: set.has(value) });
    return [box, h("div", { class: "check" }, box, h("label", { for: id }, value))];
  });
  const fieldset = h(
    "fieldset",
    {},
    h("legend", {}, legend),
    boxes.map(([, row]) => row),
  );
  return [fieldset, () => boxes.filter(([box]) => box.checked).map(([box]) => box.value)];
}

/** A message in the page (errors are role=alert so screen readers announce them). */
export function message(text, kind = "error") {
  return h("p", { class: `message ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

let toastTimer = null;
export function toast(text) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.classList.add("shown");
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => el.classList.remove("shown"), 4000);
}

/** A secret shown once, with a Copy button. */
export function secretBox(label, secret) {
  const id = uid("secret");
  const out = h("input", { id, type: "text", readonly: true, value: secret, class: "secret" });
  const copy = h("button", { type: "button" }, "Copy");
  copy.addEventListener("click", async () => {
    out.select();
    try {
      await navigator.clipboard.writeText(secret);
    } catch (err) {
      document.execCommand("copy");
    }
    copy.textContent = "Copied";
    toast(`${label} copied`);
  });
  return h(
    "div",
    { class: "secret-box" },
    h("label", { for: id }, label),
    h("div", { class: "row" }, out, copy),
    h("p", { class: "muted" }, "Shown once: copy it now. Settle keeps only a hash or a sealed copy."),
  );
}

/** A button that asks again before `action` (no modal: the question appears beside it). */
export function confirmButton(label, question, action, { danger = true } = {}) {
  const wrap = h("span", { class: "confirm" });
  const first = h("button", { type: "button", class: danger ? "danger" : "" }, label);
  first.addEventListener("click", () => {
    const yes = h("button", { type: "button", class: danger ? "danger" : "" }, `Yes, ${label.toLowerCase()}`);
    const no = h("button", { type: "button" }, "Cancel");
    const ask = h("span", { role: "group", "aria-label": question }, h("span", {}, question), yes, no);
    no.addEventListener("click", () => {
      wrap.replaceChildren(first);
      first.focus();
    });
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      await action();
    });
    wrap.replaceChildren(ask);
    yes.focus();
  });
  wrap.append(first);
  return wrap;
}

/** A form whose submit runs `handler(form)`, showing errors in place. */
export function form(label, controls, submitText, handler) {
  const errors = h("div", { class: "form-errors" });
  const submit = h("button", { type: "submit", class: "primary" }, submitText);
  const el = h("form", { "aria-label": label, novalidate: true }, controls, errors, submit);
  el.addEventListener("submit", async (event) => {
    event.preventDefault();
    errors.replaceChildren();
    submit.disabled = true;
    try {
      await handler(el);
    } catch (err) {
      errors.replaceChildren(message(err.message || String(err)));
    } finally {
      submit.disabled = false;
    }
  });
  return el;
}

export function dl(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.flatMap(([term, value]) => [h("dt", {}, term), h("dd", {}, value ?? "—")]),
  );
}

export function section(title, ...children) {
  const id = uid("s");
  return h("section", { "aria-labelledby": id }, h("h2", { id }, title), children);
}
