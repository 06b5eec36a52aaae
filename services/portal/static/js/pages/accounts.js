// Accounts (list, find, one account with its addresses, change its destination) and the
// tenant's destination policy.

import { api, enc, query } from "../api.js";
import { go, session } from "../session.js";
import {
  code,
  dl,
  field,
  form,
  h,
  input,
  message,
  pager,
  pre,
  section,
  select,
  table,
  time,
  toast,
} from "../ui.js";
import { chainList, chainName } from "./shared.js";
import { confirmSensitive } from "../stepup.js";

const listState = { stack: [], cursor: null };

export async function render(root, route) {
  if (route.path === "/policy") return renderPolicy(root);
  if (route.id) return renderOne(root, route.id);
  return renderList(root, route.params);
}

async function renderList(root, params) {
  listState.cursor = params.get("cursor");
  if (!listState.cursor) listState.stack = [];
  const user = input({ name: "externalUserId", spellcheck: false });
  const find = form(
    "Find an account",
    field(
      "External user id or deposit address",
      user,
      "The tenant's own id of the user, exactly, or one of its deposit addresses (any case).",
    ),
    "Open account",
    async () => {
      const text = user.value.trim();
      if (!text) throw new Error("Type an external user id or a deposit address.");
      go(`/accounts/${enc(await findAccount(text))}`);
    },
  );
  const chains = await chainList();
  const body = await api("GET", "/v1/deposit-accounts" + query({ limit: params.get("limit") || 50, cursor: listState.cursor }));
  root.append(
    h("h1", {}, "Accounts"),
    find,
    table("Deposit accounts, newest first", [
      { label: "Created", time: "createdAt", render: (a) => time(a.createdAt) },
      {
        label: "External user",
        render: (a) => h("a", { href: `#/accounts/${enc(a.externalUserId)}` }, a.externalUserId),
      },
      { label: "Destination", render: (a) => `${chainName(chains, a.destination.chainId)} ${a.destination.address}` },
      { label: "Status", render: (a) => a.status },
    ], body.depositAccounts, { empty: "No accounts yet." }),
    pager(listState, body.nextCursor, (cursor) => go("/accounts", { cursor, limit: params.get("limit") })),
  );
}

/** The externalUserId of the account `text` names: its own id first, else its address. */
async function findAccount(text) {
  try {
    const { depositAccount } = await api("GET", `/v1/deposit-accounts/${enc(text)}`);
    return depositAccount.externalUserId;
  } catch (err) {
    if (!/^0x[0-9a-fA-F]{40}$/.test(text)) throw err;
  }
  const { depositAccounts } = await api("GET", "/v1/deposit-accounts" + query({ depositAddress: text }));
  if (!depositAccounts.length) throw new Error(`No account has the deposit address ${text}.`);
  return depositAccounts[0].externalUserId;
}

/** A destination's token as people read it: its symbol on that chain, and the address. */
function tokenName(chains, destination) {
  const chain = chains.find((c) => c.chainId === destination.chainId);
  const asset = chain && chain.assets.find((a) => a.tokenAddress.toLowerCase() === destination.tokenAddress.toLowerCase());
  return asset ? `${asset.symbol} (${destination.tokenAddress})` : destination.tokenAddress;
}

/** The rows of a destination change for the step-up dialog: chain, address, token. */
function destinationChange(chains, before, after) {
  return [
    ["Chain", before ? chainName(chains, before.chainId) : null, chainName(chains, after.chainId)],
    ["Wallet address", before ? before.address : null, after.address],
    ["Token", before ? tokenName(chains, before) : null, tokenName(chains, after)],
  ];
}

/** Fields of a destination, the token offered from the chain's assets. */
function destinationFields(chains, current) {
  const active = chains.filter((c) => c.status === "active");
  const chain = select(
    active.map((c) => [String(c.chainId), chainName(chains, c.chainId)]),
    current ? String(current.chainId) : String(active[0]?.chainId ?? ""),
  );
  const address = input({ value: current ? current.address : "", placeholder: "0x…", spellcheck: false });
  const token = select([]);
  const fillTokens = () => {
    const c = active.find((x) => String(x.chainId) === chain.value);
    token.replaceChildren();
    for (const asset of c ? c.assets : []) {
      token.append(
        h("option", { value: asset.tokenAddress, selected: current && asset.tokenAddress === current.tokenAddress },
          `${asset.symbol} (${asset.tokenAddress})`),
      );
    }
  };
  chain.addEventListener("change", fillTokens);
  fillTokens();
  const controls = [field("Chain", chain), field("Wallet address", address), field("Token", token)];
  const value = () => ({ chainId: Number(chain.value), address: address.value.trim(), tokenAddress: token.value });
  return [controls, value];
}

async function renderOne(root, externalUserId) {
  const [{ depositAccount: account }, chains] = await Promise.all([
    api("GET", `/v1/deposit-accounts/${enc(externalUserId)}`),
    chainList(),
  ]);
  root.append(
    h("p", {}, h("a", { href: "#/accounts" }, "← Accounts")),
    h("h1", {}, "Account ", code(account.externalUserId)),
    dl([
      ["Account id", code(account.id)],
      ["Status", account.status],
      ["Destination", `${chainName(chains, account.destination.chainId)}: ${account.destination.address}`],
      ["Destination token", code(account.destination.tokenAddress)],
      ["Created", time(account.createdAt)],
      ["Updated", time(account.updatedAt)],
    ]),
    section(
      "Deposit addresses",
      table("Deposit addresses", [
        { label: "Chain", render: (a) => chainName(chains, a.chainId) },
        { label: "Address", render: (a) => code(a.address) },
        { label: "Assets", render: (a) => a.assets.join(", ") },
      ], account.depositAddresses),
    ),
    section("Metadata", pre(account.metadata)),
    h("p", {}, h("a", { href: `#/deposits?externalUserId=${enc(account.externalUserId)}` }, "This account's deposits")),
  );
  if (session.can("developer")) {
    const [controls, value] = destinationFields(chains, account.destination);
    root.append(
      section(
        "Change destination",
        form("Change destination", controls, "Change destination", async () => {
          const destination = value();
          const done = await confirmSensitive({
            title: "Change the settlement destination",
            intro: `Deposits of ${account.externalUserId} settle to the new destination from now on.`,
            changes: destinationChange(chains, account.destination, destination),
            confirmText: "Change destination",
            action: () =>
              api("PATCH", `/v1/deposit-accounts/${enc(account.externalUserId)}/destination`, { destination }),
          });
          if (!done) return;
          toast("Destination changed");
          go(`/accounts/${enc(account.externalUserId)}`);
        }),
      ),
    );
  }
}

async function renderPolicy(root) {
  const [{ destinationPolicy: policy }, chains] = await Promise.all([
    api("GET", "/v1/destination-policy"),
    chainList(),
  ]);
  root.append(h("h1", {}, "Destination policy"));
  root.append(
    policy
      ? dl([
          ["Destination", `${chainName(chains, policy.destination.chainId)}: ${policy.destination.address}`],
          ["Token", code(policy.destination.tokenAddress)],
          ["Venue", policy.venue || "—"],
          ["Updated", time(policy.updatedAt)],
        ])
      : message("No policy: accounts must be created with a destination.", "info"),
    h("p", { class: "muted" }, "Accounts created without a destination copy the policy as it is then; changing it later does not move existing accounts."),
  );
  if (session.can("developer")) {
    const [controls, value] = destinationFields(chains, policy ? policy.destination : null);
    const venue = input({ value: policy && policy.venue ? policy.venue : "", maxlength: 120 });
    root.append(
      section(
        policy ? "Replace the policy" : "Set a policy",
        form("Destination policy", [...controls, field("Venue (optional)", venue)], "Save policy", async () => {
          const destination = value();
          const newVenue = venue.value.trim() || null;
          const done = await confirmSensitive({
            title: policy ? "Replace the destination policy" : "Set the destination policy",
            intro: "Accounts created from now on without a destination settle here; existing accounts keep theirs.",
            changes: [
              ...destinationChange(chains, policy ? policy.destination : null, destination),
              ["Venue", policy ? policy.venue || "—" : null, newVenue || "—"],
            ],
            confirmText: "Save policy",
            action: () => api("PUT", "/v1/destination-policy", { destination, venue: newVenue }),
          });
          if (!done) return;
          toast("Policy saved");
          go("/policy");
        }),
      ),
    );
  }
}
