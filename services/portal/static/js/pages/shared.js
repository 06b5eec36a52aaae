// Things several pages show: statuses, chains, endpoints, event types.

import { api } from "../api.js";

export const DEPOSIT_STATUSES = [
  "source_seen",
  "source_confirmed",
  "credit_submitted",
  "credited",
  "failed",
  "manual_review_required",
];
export const DELIVERY_STATUSES = ["pending", "retrying", "succeeded", "failed", "skipped"];

let chains = null;
/** GET /v1/chains, once per page load. */
export async function chainList() {
  if (!chains) chains = (await api("GET", "/v1/chains")).chains;
  return chains;
}

export function chainName(list, chainId) {
  const chain = list.find((c) => c.chainId === chainId);
  return chain ? `${chain.name} (${chainId})` : String(chainId);
}

let catalog = null;
/** GET /v1/event-types, once per page load. */
async function catalogBody() {
  if (!catalog) catalog = await api("GET", "/v1/event-types");
  return catalog;
}

/** Every event type: its description, schema and example. */
export async function eventTypes() {
  return (await catalogBody()).eventTypes;
}

/** What an endpoint may subscribe to: the patterns ("*", "deposit.*", ...), then each type. */
export async function subscriptionChoices() {
  const body = await catalogBody();
  return [...body.patterns.map((p) => p.pattern), ...body.eventTypes.map((t) => t.type)];
}

/** Every endpoint of the tenant (walks the cursors; tenants have at most a few dozen). */
export async function allEndpoints() {
  const out = [];
  let cursor = null;
  for (let page = 0; page < 20; page += 1) {
    const path = "/v1/webhook-endpoints?limit=200" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
    const body = await api("GET", path);
    out.push(...body.webhookEndpoints);
    cursor = body.nextCursor;
    if (!cursor) break;
  }
  return out;
}
