// Deliveries: filter (endpoint, event type, status, time), one delivery with every
// attempt, Replay.

import { api, enc, query } from "../api.js";
import { go, session } from "../session.js";
import {
  badge,
  code,
  dl,
  field,
  form,
  h,
  input,
  isoToLocal,
  listFilters,
  localToIso,
  pager,
  pre,
  section,
  select,
  table,
  time,
  toast,
} from "../ui.js";
import { DELIVERY_STATUSES, allEndpoints, eventTypes } from "./shared.js";

const listState = { stack: [], cursor: null, key: "" };

export async function render(root, route) {
  if (route.id) return renderOne(root, route.id);
  return renderList(root, route.params);
}

function replayButton(delivery) {
  const button = h("button", { type: "button", "aria-label": `Replay ${delivery.id}` }, "Replay");
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const body = await api("POST", `/v1/webhook-deliveries/${enc(delivery.id)}/replay`);
      toast(`Replayed as ${body.webhookDelivery.id}`);
      go(`/deliveries/${body.webhookDelivery.id}`);
    } catch (err) {
      toast(err.message);
      button.disabled = false;
    }
  });
  return button;
}

async function renderList(root, params) {
  const filters = listFilters(
    params,
    ["endpointId", "eventType", "status", "createdAfter", "createdBefore"],
    listState,
  );
  const [endpoints, types] = await Promise.all([allEndpoints(), eventTypes()]);
  const names = Object.fromEntries(endpoints.map((e) => [e.id, e.name]));

  const endpoint = select([["", "Any endpoint"], ...endpoints.map((e) => [e.id, e.name])], filters.endpointId);
  const type = select([["", "Any event type"], ...types.map((t) => t.type)], filters.eventType);
  const status = select([["", "Any status"], ...DELIVERY_STATUSES], filters.status);
  const after = input({ type: "datetime-local", value: isoToLocal(filters.createdAfter) });
  const before = input({ type: "datetime-local", value: isoToLocal(filters.createdBefore) });
  root.append(
    h("h1", {}, "Deliveries"),
    form(
      "Filter deliveries",
      h(
        "div",
        { class: "filters" },
        field("Endpoint", endpoint),
        field("Event type", type),
        field("Status", status),
        field("Created after", after),
        field("Created before", before),
      ),
      "Filter",
      async () =>
        go("/deliveries", {
          endpointId: endpoint.value,
          eventType: type.value,
          status: status.value,
          createdAfter: localToIso(after.value),
          createdBefore: localToIso(before.value),
          limit: filters.limit,
        }),
    ),
  );
  const body = await api(
    "GET",
    "/v1/webhook-deliveries" + query({ ...filters, limit: filters.limit || 50, cursor: listState.cursor }),
  );
  const columns = [
    { label: "Created", time: "createdAt", render: (d) => time(d.createdAt) },
    { label: "Delivery", render: (d) => h("a", { href: `#/deliveries/${d.id}` }, d.id) },
    { label: "Endpoint", render: (d) => names[d.endpointId] || d.endpointId },
    { label: "Event type", render: (d) => d.eventType },
    { label: "Status", render: (d) => (d.heldBy ? [badge(d.status), " ", heldBy(d)] : badge(d.status)) },
    { label: "Attempts", render: (d) => String(d.attemptCount) },
    { label: "Last response", render: (d) => (d.lastResponseStatus ?? d.lastError ?? "—") },
  ];
  if (session.can("developer")) columns.push({ label: "Replay", render: replayButton });
  root.append(
    table("Deliveries, newest first", columns, body.webhookDeliveries, { empty: "No deliveries match." }),
    pager(listState, body.nextCursor, (cursor) => go("/deliveries", { ...filters, cursor })),
  );
}

/** An ordered delivery waiting for an earlier one of its account: which (a link). */
function heldBy(delivery) {
  return h("span", { class: "held" }, "held by ", h("a", { href: `#/deliveries/${delivery.heldBy}` }, delivery.heldBy));
}

/** The headers of one attempt as sent, one per line. */
function headerLines(headers) {
  return Object.entries(headers).map(([name, value]) => `${name}: ${value}`).join("\n");
}

async function renderOne(root, deliveryId) {
  const { webhookDelivery: delivery } = await api("GET", `/v1/webhook-deliveries/${enc(deliveryId)}`);
  root.append(
    h("p", {}, h("a", { href: "#/deliveries" }, "← Deliveries")),
    h("h1", {}, "Delivery ", code(delivery.id)),
    dl([
      ["Status", badge(delivery.status)],
      ["Held by", delivery.heldBy ? heldBy(delivery) : "—"],
      ["Endpoint", h("a", { href: `#/endpoints/${delivery.endpointId}` }, delivery.endpointId)],
      ["Event", [code(delivery.eventId), " ", delivery.eventType]],
      ["Attempts", String(delivery.attemptCount)],
      ["Next attempt", time(delivery.nextAttemptAt)],
      ["Succeeded", time(delivery.succeededAt)],
      ["Replay of", delivery.replayOf ? h("a", { href: `#/deliveries/${delivery.replayOf}` }, delivery.replayOf) : "—"],
      ["Created", time(delivery.createdAt)],
    ]),
  );
  if (session.can("developer")) root.append(h("div", { class: "row" }, replayButton(delivery)));
  // The exact bytes sent (every attempt sends the same body).
  const body = delivery.requestBody;
  const attempts = delivery.attempts.map((a) =>
    h(
      "li",
      { class: "attempt" },
      h("h3", {}, `Attempt ${a.number} `, badge(a.error ? "failed" : "succeeded"), " ", time(a.attemptedAt)),
      dl([
        ["Response status", a.responseStatus === null ? "—" : String(a.responseStatus)],
        ["Latency", a.latencyMs === null ? "—" : `${Math.round(a.latencyMs)} ms`],
        ["Error", a.error ? code(a.error) : "—"],
      ]),
      h("details", {}, h("summary", {}, "Request headers and body as sent"),
        pre(headerLines(a.requestHeaders || {})), pre(body)),
      h("details", { open: Boolean(a.error) }, h("summary", {}, "Response (first 4 KiB)"),
        pre(a.responseBody ?? "")),
    ),
  );
  root.append(
    section("Attempts", attempts.length ? h("ol", { class: "attempts" }, attempts) : h("p", { class: "muted" }, "No attempt yet.")),
    section("Event as sent", pre(delivery.event)),
  );
}
