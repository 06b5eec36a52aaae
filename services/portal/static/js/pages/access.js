// API keys and members (admins and owners).

import { api, enc, query } from "../api.js";
import { go, session } from "../session.js";
import {
  badge,
  checkboxes,
  code,
  confirmButton,
  field,
  form,
  h,
  input,
  message,
  pager,
  secretBox,
  section,
  select,
  table,
  time,
  toast,
} from "../ui.js";
import { confirmSensitive } from "../stepup.js";

const ROLES = ["viewer", "developer", "admin", "owner"];
const RANK = Object.fromEntries(ROLES.map((r, i) => [r, i]));
const keyState = { stack: [], cursor: null };
const memberState = { stack: [], cursor: null };

export async function render(root, route) {
  if (route.path === "/members") return renderMembers(root, route.params);
  return renderKeys(root, route.params);
}

async function scopeNames() {
  const doc = await api("GET", "/v1/openapi.json");
  return doc.components.schemas.ApiKey.properties.scopes.items.enum;
}

async function renderKeys(root, params) {
  keyState.cursor = params.get("cursor");
  if (!keyState.cursor) keyState.stack = [];
  const [scopes, body] = await Promise.all([
    scopeNames(),
    api("GET", "/v1/api-keys" + query({ limit: params.get("limit") || 50, cursor: keyState.cursor })),
  ]);
  const name = input({ maxlength: 100 });
  const [scopeField, chosen] = checkboxes("Scopes", scopes, []);
  const made = h("div");
  const create = form("Create API key", [field("Name", name, "To tell keys apart."), scopeField], "Create key", async () => {
    const picked = chosen();
    if (!picked.length) throw new Error("Choose at least one scope.");
    const label = name.value.trim() || null;
    const result = await confirmSensitive({
      title: "Create an API key",
      intro: "Whoever holds the key can do what its scopes allow, without signing in.",
      changes: [["Name", null, label || "—"], ["Scopes", null, picked.join(", ")]],
      confirmText: "Create key",
      action: () => api("POST", "/v1/api-keys", { name: label, scopes: picked }),
    });
    if (!result) return;
    made.replaceChildren(
      message(`Key ${result.apiKey.prefix}… created.`, "info"),
      secretBox("API key", result.secret),
      h("p", {}, h("button", { type: "button", onclick: () => go("/keys") }, "Back to the list")),
    );
    create.reset();
    made.querySelector("input")?.focus();
  });
  root.append(
    h("h1", {}, "API keys"),
    h("details", { class: "create" }, h("summary", {}, "Create an API key"), create, made),
    table("API keys, newest first", [
      { label: "Created", time: "createdAt", render: (k) => time(k.createdAt) },
      { label: "Name", render: (k) => k.name || "—" },
      { label: "Key", render: (k) => code(`${k.prefix}…`) },
      { label: "Scopes", render: (k) => k.scopes.join(", ") },
      { label: "Status", render: (k) => (k.revokedAt ? [badge("revoked"), " ", time(k.revokedAt)] : badge("active")) },
      {
        label: "Revoke",
        render: (k) =>
          k.revokedAt
            ? "—"
            : confirmButton("Revoke", `Revoke ${k.prefix}…? Requests with it fail at once.`, async () => {
                await api("DELETE", `/v1/api-keys/${enc(k.id)}`);
                toast("Key revoked");
                go("/keys");
              }),
      },
    ], body.apiKeys),
    pager(keyState, body.nextCursor, (cursor) => go("/keys", { cursor, limit: params.get("limit") })),
  );
}

async function renderMembers(root, params) {
  memberState.cursor = params.get("cursor");
  if (!memberState.cursor) memberState.stack = [];
  const body = await api("GET", "/v1/members" + query({ limit: params.get("limit") || 50, cursor: memberState.cursor }));
  const mine = RANK[session.current.role];
  const givable = ROLES.filter((r) => RANK[r] <= mine);

  const email = input({ type: "email", autocomplete: "off" });
  const role = select(givable, "viewer");
  const password = input({ type: "password", autocomplete: "new-password", minlength: 12 });
  const add = form(
    "Add member",
    [field("Email", email), field("Role", role), field("First password", password, "12 characters or more; tell the person, who signs in with it.")],
    "Add member",
    async () => {
      await api("POST", "/v1/members", { email: email.value.trim(), role: role.value, password: password.value });
      toast("Member added");
      go("/members");
    },
  );
  const roleCell = (m) => {
    if (RANK[m.role] > mine) return badge(m.role);
    const choice = select(givable, m.role, { "aria-label": `Role of ${m.email}` });
    const save = h("button", { type: "button" }, "Change role");
    save.addEventListener("click", async () => {
      const role = choice.value;
      if (role === m.role) return;
      const done = await confirmSensitive({
        title: "Change a role",
        changes: [[`Role of ${m.email}`, m.role, role]],
        confirmText: "Change role",
        action: () => api("PATCH", `/v1/members/${enc(m.id)}`, { role }),
      });
      if (!done) return;
      toast(`${m.email} is now ${role}`);
      go("/members");
    });
    return h("span", { class: "row" }, choice, save);
  };
  root.append(
    h("h1", {}, "Members"),
    h("details", { class: "create" }, h("summary", {}, "Add a member"), add),
    table("Members, newest first", [
      { label: "Added", time: "createdAt", render: (m) => time(m.createdAt) },
      { label: "Email", render: (m) => m.email },
      { label: "Role", render: roleCell },
      {
        label: "Remove",
        render: (m) =>
          RANK[m.role] > mine
            ? "—"
            : confirmButton("Remove", `Remove ${m.email}? Their sessions end at once.`, async () => {
                try {
                  await api("DELETE", `/v1/members/${enc(m.id)}`);
                  toast("Member removed");
                } catch (err) {
                  toast(err.message);
                }
                go("/members");
              }),
      },
    ], body.members),
    pager(memberState, body.nextCursor, (cursor) => go("/members", { cursor, limit: params.get("limit") })),
  );
}
