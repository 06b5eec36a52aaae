// Audit log (admins and owners): who changed what, when and from where, newest first,
// filtered by action, actor and time.

import { api, query } from "../api.js";
import { go } from "../session.js";
import { code, field, form, h, input, isoToLocal, listFilters, localToIso, pager, table, time } from "../ui.js";

const listState = { stack: [], cursor: null, key: "" };
const ACTOR_KINDS = { api_key: "API key", member: "member", portal_link: "portal link", ops: "ops", anonymous: "unknown" };

export async function render(root, route) {
  const params = route.params;
  const filters = listFilters(params, ["action", "actorId", "createdAfter", "createdBefore"], listState);
  const body = await api("GET", "/v1/audit-events" + query({ ...filters, limit: filters.limit || 50, cursor: listState.cursor }));

  const action = input({ name: "action", value: filters.action, placeholder: "e.g. member.* or destination_policy.updated", spellcheck: false });
  const actor = input({ name: "actorId", value: filters.actorId, placeholder: "key_…, mem_…", spellcheck: false });
  const after = input({ type: "datetime-local", value: isoToLocal(filters.createdAfter) });
  const before = input({ type: "datetime-local", value: isoToLocal(filters.createdBefore) });
  root.append(
    h("h1", {}, "Audit log"),
    h("p", { class: "muted" }, "Every change to your tenant: who made it, what it was before and after, and from where. Entries are never changed or removed, and each holds the hash of the one before."),
    form(
      "Filter the audit log",
      h("div", { class: "filters" }, field("Action", action), field("Actor id", actor), field("From", after), field("Until", before)),
      "Filter",
      async () => {
        go("/audit", {
          action: action.value.trim(),
          actorId: actor.value.trim(),
          createdAfter: localToIso(after.value),
          createdBefore: localToIso(before.value),
        });
      },
    ),
    table("Audit events, newest first", [
      { label: "Time", time: "createdAt", render: (e) => time(e.createdAt) },
      { label: "Action", render: (e) => code(e.action) },
      { label: "Who", render: who },
      { label: "Target", render: (e) => [e.target.type, " ", e.target.id ? code(e.target.id) : ""] },
      { label: "Change", render: change },
      { label: "From", render: (e) => (e.ip ? [e.ip, h("br"), h("small", { class: "muted" }, e.requestId || "")] : h("span", { class: "muted" }, "command line")) },
    ], body.auditEvents, { empty: "No audit events match." }),
    pager(listState, body.nextCursor, (cursor) => go("/audit", { ...filters, cursor })),
  );
}

function who(event) {
  const actor = event.actor;
  const kind = ACTOR_KINDS[actor.type] || actor.type;
  const label = actor.name || actor.id || "—";
  const link = actor.id
    ? h("a", { href: "#/audit?" + new URLSearchParams({ actorId: actor.id }).toString(), title: actor.id }, label)
    : label;
  return [link, h("br"), h("small", { class: "muted" }, kind)];
}

function compact(value) {
  return value === null || value === undefined ? "—" : JSON.stringify(value);
}

function change(event) {
  if (event.before === null && event.after === null) return "—";
  return h(
    "dl",
    { class: "change-facts" },
    event.before !== null ? [h("dt", {}, "Before"), h("dd", {}, code(compact(event.before)))] : null,
    event.after !== null ? [h("dt", {}, "After"), h("dd", {}, code(compact(event.after)))] : null,
  );
}
