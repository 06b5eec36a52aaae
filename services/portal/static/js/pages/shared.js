// Things several pages show: statuses, chains, endpoints, event types.

import { api } from "../api.js";
import { h } from "../ui.js";

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

/**
 * A USD figure exactly as the API sent it (a fee of 0.00065 stays 0.00065, a net of
 * 9.99935 stays 9.99935: rounding to cents showed 0.00 and 10.00), with at least two
 * decimals. JSON numbers read back as the shortest text that is the same number, so
 * `String` is the API's own digits; an exponent (1e-7) is written out in full.
 */
export function usd(value) {
  if (value === null || value === undefined) return "—";
  let text = String(value);
  const exp = text.match(/^(-?)(\d+)(?:\.(\d+))?e([+-]\d+)$/i);
  if (exp) {
    const [, sign, whole, frac = "", power] = exp;
    const digits = whole + frac;
    const point = whole.length + Number(power);
    text =
      point <= 0
        ? `${sign}0.${"0".repeat(-point)}${digits}`
        : point >= digits.length
          ? `${sign}${digits}${"0".repeat(point - digits.length)}`
          : `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
  }
  const [whole, frac = ""] = text.split(".");
  return `${whole}.${frac.padEnd(2, "0")}`;
}

/** A transaction hash, linked to its page on the chain's block explorer (GET /v1/chains). */
export function txLink(list, chainId, hash) {
  if (!hash) return "—";
  const chain = list.find((c) => c.chainId === chainId);
  const shown = h("code", {}, hash);
  if (!chain || !chain.explorerTxUrl) return shown;
  const href = chain.explorerTxUrl.replace("{txHash}", encodeURIComponent(hash));
  return h("a", { href, target: "_blank", rel: "noopener noreferrer" }, shown);
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
