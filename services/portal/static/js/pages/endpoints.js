// Webhook endpoints: create (secret shown once), edit, test, rotate, disable/enable,
// delete, recover a time window.

import { api, enc, query } from "../api.js";
import { go, session } from "../session.js";
import {
  badge,
  checkboxes,
  code,
  confirmButton,
  dl,
  field,
  form,
  h,
  input,
  localToIso,
  message,
  pager,
  secretBox,
  section,
  select,
  table,
  time,
  toast,
} from "../ui.js";
import { subscriptionChoices } from "./shared.js";
import { confirmSensitive } from "../stepup.js";

const listState = { stack: [], cursor: null };

export async function render(root, route) {
  if (route.id) return renderOne(root, route.id);
  return renderList(root, route.params);
}

async function renderList(root, params) {
  listState.cursor = params.get("cursor");
  if (!listState.cursor) listState.stack = [];
  root.append(h("h1", {}, "Webhook endpoints"));
  if (session.can("developer")) root.append(await createSection(root));
  const body = await api("GET", "/v1/webhook-endpoints" + query({ limit: params.get("limit") || 50, cursor: listState.cursor }));
  root.append(
    table("Webhook endpoints, newest first", [
      { label: "Created", time: "createdAt", render: (e) => time(e.createdAt) },
      {
        label: "Name",
        render: (e) => [
          h("a", { href: `#/endpoints/${e.id}` }, e.name),
          // settle listen's: gone once listen stops renewing it; not counted in the limit
          e.ephemeral ? [" ", h("span", { class: "badge", title: `settle listen's endpoint: expires unless renewed (${e.expiresAt})` }, "ephemeral")] : "",
        ],
      },
      { label: "URL", render: (e) => code(e.url) },
      { label: "Event types", render: (e) => h("span", { title: "Receives: " + e.receives.join(", ") }, e.eventTypes.join(", ")) },
      { label: "Status", render: (e) => badge(e.status) },
    ], body.webhookEndpoints, { empty: "No webhook endpoints yet." }),
    pager(listState, body.nextCursor, (cursor) => go("/endpoints", { cursor, limit: params.get("limit") })),
  );
}

async function createSection() {
  const types = await subscriptionChoices();
  const name = input({ name: "name", maxlength: 200 });
  const url = input({ name: "url", type: "url", placeholder: "https://…", spellcheck: false });
  const [typesField, chosen] = checkboxes("Event types", types, ["deposit.credited", "deposit.failed"]);
  const result = h("div");
  const create = form("Create endpoint", [field("Name", name), field("URL", url), typesField], "Create endpoint", async () => {
    const body = await api("POST", "/v1/webhook-endpoints", {
      name: name.value.trim(),
      url: url.value.trim(),
      eventTypes: chosen(),
    });
    const endpoint = body.webhookEndpoint;
    result.replaceChildren(
      message(`Endpoint ${endpoint.name} created.`, "info"),
      secretBox("Signing secret", body.secret),
      h("p", {}, h("a", { href: `#/endpoints/${endpoint.id}` }, "Open the endpoint")),
    );
    create.reset();
    result.querySelector("input")?.focus();
  });
  return h("details", { class: "create", open: true }, h("summary", {}, "Create an endpoint"), create, result);
}

async function renderOne(root, endpointId) {
  const { webhookEndpoint: endpoint } = await api("GET", `/v1/webhook-endpoints/${enc(endpointId)}`);
  const recent = await api("GET", `/v1/webhook-deliveries?endpointId=${enc(endpoint.id)}&limit=20`);
  root.append(
    h("p", {}, h("a", { href: "#/endpoints" }, "← Webhook endpoints")),
    h("h1", {}, "Endpoint ", endpoint.name),
    dl([
      ["Id", code(endpoint.id)],
      ["URL", code(endpoint.url)],
      ["Status", [badge(endpoint.status), endpoint.disabledReason ? ` (${endpoint.disabledReason})` : ""]],
      ...(endpoint.ephemeral ? [["Ephemeral", ["settle listen's endpoint, not counted in the limit; expires unless renewed at ", time(endpoint.expiresAt)]]] : []),
      ["Event types", endpoint.eventTypes.join(", ")],
      // Patterns ("*", "deposit.*") spelled out: the types it receives today.
      ...(endpoint.receives.join() === endpoint.eventTypes.join() ? [] : [["Receives today", endpoint.receives.join(", ")]]),
      ["Signature scheme", endpoint.signatureScheme === "standard" ? "Standard Webhooks (and Settle's headers)" : "Settle"],
      ["Ordering", endpoint.ordering === "per_account" ? "per account: an account's events one at a time, in order" : "none"],
      ["Previous secret valid until", time(endpoint.previousSecretExpiresAt)],
      ["Created", time(endpoint.createdAt)],
      ["Updated", time(endpoint.updatedAt)],
    ]),
  );
  if (session.can("developer")) root.append(await actions(endpoint));
  root.append(
    section(
      "Recent deliveries",
      table("Recent deliveries to this endpoint", [
        { label: "Created", time: "createdAt", render: (d) => time(d.createdAt) },
        { label: "Delivery", render: (d) => h("a", { href: `#/deliveries/${d.id}` }, d.id) },
        { label: "Event type", render: (d) => d.eventType },
        { label: "Status", render: (d) => badge(d.status) },
        { label: "Attempts", render: (d) => String(d.attemptCount) },
      ], recent.webhookDeliveries, { empty: "No deliveries yet." }),
      h("p", {}, h("a", { href: `#/deliveries?endpointId=${enc(endpoint.id)}` }, "All deliveries to this endpoint")),
    ),
  );
}

async function actions(endpoint) {
  const path = `/v1/webhook-endpoints/${enc(endpoint.id)}`;
  const reload = () => go(`/endpoints/${endpoint.id}`);
  const out = h("div", { class: "actions" });

  // Send a test, enable or disable, delete.
  const buttons = h("div", { class: "row" });
  const test = h("button", { type: "button" }, "Send test");
  test.addEventListener("click", async () => {
    try {
      const body = await api("POST", `${path}/test`);
      toast("Test sent");
      go(`/deliveries/${body.webhookDelivery.id}`);
    } catch (err) {
      toast(err.message);
    }
  });
  const enable = endpoint.status === "disabled";
  const toggle = h("button", { type: "button" }, enable ? "Enable" : "Disable");
  toggle.addEventListener("click", async () => {
    try {
      await api("PATCH", path, { status: enable ? "enabled" : "disabled" });
      toast(enable ? "Endpoint enabled" : "Endpoint disabled");
      reload();
    } catch (err) {
      toast(err.message);
    }
  });
  const remove = confirmButton("Delete", "Delete this endpoint? Unfinished deliveries stop.", async () => {
    await api("DELETE", path);
    toast("Endpoint deleted");
    go("/endpoints");
  });
  buttons.append(test, toggle, remove);
  out.append(section("Actions", buttons));

  // Edit name, URL and event types.
  const types = await subscriptionChoices();
  const name = input({ value: endpoint.name, maxlength: 200 });
  const url = input({ type: "url", value: endpoint.url, spellcheck: false });
  const [typesField, chosen] = checkboxes("Event types", types, endpoint.eventTypes);
  out.append(
    section(
      "Edit",
      form("Edit endpoint", [field("Name", name), field("URL", url), typesField], "Save changes", async () => {
        await api("PATCH", path, { name: name.value.trim(), url: url.value.trim(), eventTypes: chosen() });
        toast("Endpoint saved");
        reload();
      }),
    ),
  );

  // Rotate the secret, with an overlap.
  const overlap = select(
    [["0", "None: the old secret stops now"], ["3600", "1 hour"], ["86400", "24 hours"]],
    "86400",
  );
  const rotated = h("div");
  out.append(
    section(
      "Rotate secret",
      form("Rotate secret", field("Keep the old secret valid for", overlap), "Rotate secret", async () => {
        const keep = overlap.options[overlap.selectedIndex].textContent;
        const body = await confirmSensitive({
          title: "Rotate the signing secret",
          intro: `Deliveries to ${endpoint.url} are signed with a new secret from now on.`,
          changes: [["Signing secret", "The current one", "A new one (shown once)"], ["The current one keeps signing", null, keep]],
          confirmText: "Rotate secret",
          action: () => api("POST", `${path}/rotate-secret`, { previousSecretExpiresInSeconds: Number(overlap.value) }),
        });
        if (!body) return;
        rotated.replaceChildren(secretBox("New signing secret", body.secret));
        rotated.querySelector("input")?.focus();
      }),
      rotated,
    ),
  );

  // Recover a window: send again what failed in it.
  const since = input({ type: "datetime-local", required: true });
  const until = input({ type: "datetime-local" });
  const recovered = h("div");
  out.append(
    section(
      "Recover a time window",
      h("p", { class: "muted" }, "Sends again every event whose delivery to this endpoint failed in the window (at most 30 days)."),
      form("Recover", [field("From", since), field("Until (empty: now)", until)], "Recover", async () => {
        const body = await api("POST", `${path}/recover`, {
          since: localToIso(since.value),
          ...(until.value ? { until: localToIso(until.value) } : {}),
        });
        const count = body.webhookDeliveries.length;
        recovered.replaceChildren(message(`${count} deliver${count === 1 ? "y" : "ies"} sent again.`, "info"));
      }),
      recovered,
    ),
  );
  return out;
}
