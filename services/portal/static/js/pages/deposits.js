// Deposits: search (external user id, status, chain, time) and one deposit's timeline
// with the events and deliveries it caused.

import { api, query } from "../api.js";
import { go } from "../session.js";
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
} from "../ui.js";
import { DEPOSIT_STATUSES, allEndpoints, chainList, chainName, txLink, usd } from "./shared.js";

const listState = { stack: [], cursor: null, key: "" };

export async function render(root, route) {
  if (route.id) return renderOne(root, route.id);
  return renderList(root, route.params);
}

async function renderList(root, params) {
  const chains = await chainList();
  const filters = listFilters(
    params,
    ["externalUserId", "status", "chainId", "createdAfter", "createdBefore"],
    listState,
  );

  const user = input({ name: "externalUserId", value: filters.externalUserId });
  const status = select([["", "Any status"], ...DEPOSIT_STATUSES], filters.status);
  const chain = select(
    [["", "Any chain"], ...chains.map((c) => [String(c.chainId), chainName(chains, c.chainId)])],
    filters.chainId,
  );
  const after = input({ type: "datetime-local", value: isoToLocal(filters.createdAfter) });
  const before = input({ type: "datetime-local", value: isoToLocal(filters.createdBefore) });
  const search = form(
    "Search deposits",
    h(
      "div",
      { class: "filters" },
      field("External user id", user),
      field("Status", status),
      field("Chain", chain),
      field("Created after", after),
      field("Created before", before),
    ),
    "Search",
    async () =>
      go("/deposits", {
        externalUserId: user.value.trim(),
        status: status.value,
        chainId: chain.value,
        createdAfter: localToIso(after.value),
        createdBefore: localToIso(before.value),
        limit: filters.limit,
      }),
  );
  root.append(h("h1", {}, "Deposits"), search);
  const body = await api(
    "GET",
    "/v1/deposits" + query({ ...filters, limit: filters.limit || 50, cursor: listState.cursor }),
  );
  root.append(
    table("Deposits, newest first", [
      { label: "Created", time: "createdAt", render: (d) => time(d.createdAt) },
      { label: "Deposit", render: (d) => h("a", { href: `#/deposits/${d.id}` }, d.id) },
      { label: "External user", render: (d) => d.externalUserId },
      { label: "Chain", render: (d) => chainName(chains, d.chainId) },
      { label: "Amount", render: (d) => `${d.amount} ${d.asset || ""}` },
      { label: "Net USD", render: (d) => usd(d.netAmountUsd) },
      { label: "Status", render: (d) => badge(d.status) },
    ], body.deposits, { empty: "No deposits match." }),
    pager(listState, body.nextCursor, (cursor) => go("/deposits", { ...filters, cursor })),
  );
}

async function renderOne(root, depositId) {
  // The timeline is what the deposit's events recorded (each status, its time, its event),
  // read from the API: the page never works times out of the deposit's fields.
  const path = `/v1/deposits/${encodeURIComponent(depositId)}`;
  const [{ deposit }, { timeline: steps }, chains] = await Promise.all([
    api("GET", path),
    api("GET", `${path}/timeline`),
    chainList(),
  ]);
  root.append(
    h("p", {}, h("a", { href: "#/deposits" }, "← Deposits")),
    h("h1", {}, "Deposit ", code(deposit.id)),
    dl([
      ["Status", badge(deposit.status)],
      ["External user", h("a", { href: `#/accounts/${encodeURIComponent(deposit.externalUserId)}` }, deposit.externalUserId)],
      ["Chain", chainName(chains, deposit.chainId)],
      ["Amount", `${deposit.amount} ${deposit.asset || deposit.tokenAddress}`],
      ["Amount (USD)", usd(deposit.amountUsd)],
      ["Settlement fee (USD)", usd(deposit.settlementGasFeeUsd)],
      ["Net (USD)", usd(deposit.netAmountUsd)],
      ["Deposit address", code(deposit.depositAddress)],
      ["Source transaction", txLink(chains, deposit.chainId, deposit.sourceTxHash)],
      ["Confirmations", `${deposit.confirmations} of ${deposit.requiredConfirmations ?? "?"}`],
      ["Destination", code(`${deposit.destination.address} on ${deposit.destination.chainId}`)],
      ["Credit transaction", txLink(chains, deposit.destination.chainId, deposit.creditTxHash)],
      ["Failure reason", deposit.failureReason || "—"],
      ["Review reason", deposit.reviewReason || "—"],
    ]),
  );
  const list = h("ol", { class: "timeline", "aria-label": "Timeline" });
  for (const step of steps) {
    list.append(h("li", {}, badge(step.status), " ", time(step.at), " ", code(step.eventId)));
  }
  root.append(section("Timeline", list));

  const caused = section("Events and deliveries");
  root.append(caused);
  const eventIds = steps.map((s) => s.eventId);
  const [endpoints, ...found] = await Promise.all([
    allEndpoints(),
    ...eventIds.map((id) => api("GET", `/v1/webhook-deliveries?eventId=${encodeURIComponent(id)}&limit=50`)),
  ]);
  const names = new Map(endpoints.map((e) => [e.id, e.name]));
  const rows = found.flatMap((b) => b.webhookDeliveries);
  caused.append(
    table("Deliveries of this deposit's events", [
      { label: "Created", time: "createdAt", render: (d) => time(d.createdAt) },
      { label: "Delivery", render: (d) => h("a", { href: `#/deliveries/${d.id}` }, d.id) },
      { label: "Event type", render: (d) => d.eventType },
      {
        label: "Endpoint",
        render: (d) => h("a", { href: `#/endpoints/${d.endpointId}` }, names.get(d.endpointId) || d.endpointId),
      },
      { label: "Status", render: (d) => badge(d.status) },
      { label: "Attempts", render: (d) => String(d.attemptCount) },
    ], rows, { empty: "No deliveries: no endpoint is subscribed to these events." }),
  );
  root.append(h("details", {}, h("summary", {}, "The deposit object (as in events)"), pre(deposit)));
}
