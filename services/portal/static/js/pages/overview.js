// Overview: delivery health per endpoint, what needs attention, recent deposits.

import { api } from "../api.js";
import { badge, code, h, section, table, time } from "../ui.js";
import { allEndpoints, chainList, chainName } from "./shared.js";

//: The window of the delivery figures: the same numbers as
//: GET /v1/webhook-endpoints/{id}/stats and `settle sla` (services/notifier/sla.py).
const WINDOW = "7d";
//: Recent deliveries looked at for an endpoint's last failure.
const RECENT = 50;

async function health(endpoint) {
  const id = encodeURIComponent(endpoint.id);
  const [stats, recent] = await Promise.all([
    api("GET", `/v1/webhook-endpoints/${id}/stats?since=${WINDOW}`),
    api("GET", `/v1/webhook-deliveries?endpointId=${id}&limit=${RECENT}`),
  ]);
  const lastFailure = recent.webhookDeliveries.find((d) => d.lastError && d.status !== "succeeded");
  return {
    endpoint,
    stats: stats.stats,
    lastFailureAt: lastFailure ? lastFailure.lastAttemptAt : null,
    lastError: lastFailure ? lastFailure.lastError : null,
  };
}

/** 0.9731 -> "97.3%"; null -> "—". */
function percent(rate) {
  return rate === null ? "—" : `${Math.round(rate * 1000) / 10}%`;
}

/** Seconds for a person: "85 ms", "2.4 s", "3 min", "2.5 h"; null -> "—". */
function duration(seconds) {
  if (seconds === null) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${Math.round(seconds * 10) / 10} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  return `${Math.round(seconds / 360) / 10} h`;
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
      h("p", { class: "muted" },
        "Deliveries made in the last 7 days (GET /v1/webhook-endpoints/{id}/stats). Success rate: of the finished ones; latency: first attempts; commit to success: from the event to its delivery."),
      table("Delivery health per endpoint", [
        { label: "Endpoint", render: (r) => h("a", { href: `#/endpoints/${r.endpoint.id}` }, r.endpoint.name) },
        { label: "Status", render: (r) => badge(r.endpoint.status) },
        { label: "Success rate", render: (r) => percent(r.stats.successRate) },
        { label: "Deliveries", render: (r) => String(r.stats.deliveries) },
        { label: "Gave up", render: (r) => String(r.stats.exhausted) },
        { label: "Pending", render: (r) => String(r.stats.pending) },
        { label: "Latency p50 / p99", render: (r) =>
          `${duration(r.stats.firstAttemptLatencyP50Seconds)} / ${duration(r.stats.firstAttemptLatencyP99Seconds)}` },
        { label: "Commit to success p50 / p99", render: (r) =>
          `${duration(r.stats.commitToSuccessP50Seconds)} / ${duration(r.stats.commitToSuccessP99Seconds)}` },
        { label: "Oldest pending", render: (r) => duration(r.stats.oldestPendingAgeSeconds) },
        { label: "Last failure", time: "lastFailureAt", render: (r) => time(r.lastFailureAt) },
        { label: "Last error", render: (r) => (r.lastError ? code(r.lastError) : "—") },
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
