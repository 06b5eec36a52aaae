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
/** GET /v1/event-types (every type, its description, schema and example), once per page load. */
export async function eventTypes() {
  if (!catalog) catalog = (await api("GET", "/v1/event-types")).eventTypes;
  return catalog;
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
