// Overview: delivery health per endpoint, what needs attention, recent deposits.

import { api } from "../api.js";
import { badge, code, h, section, table, time } from "../ui.js";
import { allEndpoints, chainList, chainName } from "./shared.js";

//: Deliveries per endpoint the health figures are computed over.
const SAMPLE = 200;

async function health(endpoint) {
  const body = await api(
    "GET",
    `/v1/webhook-deliveries?endpointId=${encodeURIComponent(endpoint.id)}&limit=${SAMPLE}`,
  );
  const list = body.webhookDeliveries;
  const finished = list.filter((d) => d.status === "succeeded" || d.status === "failed");
  const succeeded = finished.filter((d) => d.status === "succeeded").length;
  const lastFailure = list.find((d) => d.lastError && d.status !== "succeeded");
  return {
    endpoint,
    looked: list.length,
    rate: finished.length ? Math.round((1000 * succeeded) / finished.length) / 10 : null,
    lastFailureAt: lastFailure ? lastFailure.lastAttemptAt : null,
    lastError: lastFailure ? lastFailure.lastError : null,
  };
}

/** "1 deposit in manual review", "50+ deposits in manual review" (more pages exist). */
function counted(n, more, one, many, what) {
  return `${n}${more ? "+" : ""} ${n === 1 && !more ? one : many} ${what}`;
}

export async function render(root) {
  root.append(h("h1", {}, "Overview"));
  const [endpoints, retrying, review, recent, chains] = await Promise.all([
    allEndpoints(),
    api("GET", "/v1/webhook-deliveries?status=retrying&limit=50"),
    api("GET", "/v1/deposits?status=manual_review_required&limit=50"),
    api("GET", "/v1/deposits?limit=10"),
    chainList(),
  ]);
  const healths = await Promise.all(endpoints.map(health));

  const disabled = endpoints.filter((e) => e.status === "disabled");
  const attention = [];
  for (const e of disabled) {
    attention.push(
      h("li", {}, "Endpoint ", h("a", { href: `#/endpoints/${e.id}` }, e.name), " is disabled",
        e.disabledReason ? ` (${e.disabledReason})` : ""),
    );
  }
  if (retrying.webhookDeliveries.length) {
    attention.push(
      h("li", {}, h("a", { href: "#/deliveries?status=retrying" },
        counted(retrying.webhookDeliveries.length, retrying.nextCursor, "delivery", "deliveries", "retrying"))),
    );
  }
  if (review.deposits.length) {
    attention.push(
      h("li", {}, h("a", { href: "#/deposits?status=manual_review_required" },
        counted(review.deposits.length, review.nextCursor, "deposit", "deposits", "in manual review"))),
    );
  }
  root.append(
    section(
      "Needs attention",
      attention.length ? h("ul", { class: "attention" }, attention) : h("p", { class: "muted" }, "Nothing needs attention."),
    ),
    section(
      "Delivery health",
      h("p", { class: "muted" }, `Over each endpoint's last ${SAMPLE} deliveries.`),
      table("Delivery health per endpoint", [
        { label: "Endpoint", render: (r) => h("a", { href: `#/endpoints/${r.endpoint.id}` }, r.endpoint.name) },
        { label: "Status", render: (r) => badge(r.endpoint.status) },
        { label: "Success rate", render: (r) => (r.rate === null ? "—" : `${r.rate}%`) },
        { label: "Last failure", time: "lastFailureAt", render: (r) => time(r.lastFailureAt) },
        { label: "Last error", render: (r) => (r.lastError ? code(r.lastError) : "—") },
        { label: "Deliveries", render: (r) => String(r.looked) },
      ], healths, { empty: "No webhook endpoints yet." }),
    ),
    section(
      "Recent deposits",
      table("Recent deposits", [
        { label: "Created", time: "createdAt", render: (d) => time(d.createdAt) },
        { label: "Deposit", render: (d) => h("a", { href: `#/deposits/${d.id}` }, d.id) },
        { label: "External user", render: (d) => d.externalUserId },
        { label: "Chain", render: (d) => chainName(chains, d.chainId) },
        { label: "Amount", render: (d) => `${d.amount} ${d.asset || ""}` },
        { label: "Status", render: (d) => badge(d.status) },
      ], recent.deposits, { empty: "No deposits yet." }),
    ),
  );
}
