// Statements: download a signed statement of a period (CSV or JSON), its detached
// signature and the public key that verifies it, for the tenant's books and auditors.

import { ApiError, api, query } from "../api.js";
import { code, dl, field, form, h, input, isoToLocal, localToIso, section, select } from "../ui.js";

//: The response headers of GET /v1/statements (docs/DEPOSITS.md, "Statements").
const SIGNATURE_HEADER = "x-service-statement-signature";
const KEY_ID_HEADER = "x-service-statement-key-id";
const ACCEPT = { csv: "text/csv", json: "application/json" };

/** A link that saves `blob` as `name` (the object URL lives as long as the page). */
function saveLink(blob, name, text) {
  return h("a", { href: URL.createObjectURL(blob), download: name, class: "download" }, text);
}

function fileName(response, fallback) {
  const disposition = response.headers.get("Content-Disposition") || "";
  const match = disposition.match(/filename="([^"]+)"/);
  return match ? match[1] : fallback;
}

/** The statement, as bytes: never parsed or re-encoded here, so its signature holds. */
async function fetchStatement(params) {
  const response = await fetch("/v1/statements" + query(params), {
    credentials: "same-origin",
    headers: { Accept: ACCEPT[params.format] },
    redirect: "error",
  });
  if (!response.ok) {
    let body = null;
    try {
      body = await response.json();
    } catch (err) {
      body = null;
    }
    throw new ApiError(response.status, body);
  }
  return response;
}

function signatureBytes(base64) {
  return Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
}

function startOfMonth() {
  const now = new Date();
  return new Date(now.getFullYear(), now.getMonth(), 1).toISOString();
}

export async function render(root) {
  const { key } = await api("GET", "/v1/statements/key");
  const from = input({ type: "datetime-local", value: isoToLocal(startOfMonth()) });
  const to = input({ type: "datetime-local" });
  const format = select([["csv", "CSV (spreadsheets)"], ["json", "JSON"]], "csv");
  const ready = h("div", { "aria-live": "polite" });
  const make = form(
    "Download a statement",
    h(
      "div",
      { class: "filters" },
      field("From", from, "Deposits credited at or after it."),
      field("To", to, "Credited before it; empty: now."),
      field("Format", format),
    ),
    "Download statement",
    async () => {
      const params = { from: localToIso(from.value), to: localToIso(to.value), format: format.value };
      if (!params.from) throw new Error("From: choose when the period starts.");
      ready.replaceChildren();
      const response = await fetchStatement(params);
      const blob = await response.blob();
      const signature = response.headers.get(SIGNATURE_HEADER);
      const keyId = response.headers.get(KEY_ID_HEADER);
      const name = fileName(response, `settle-statement.${params.format}`);
      const statementLink = saveLink(blob, name, `Save ${name} again`);
      const signatureLink = saveLink(
        new Blob([signatureBytes(signature)], { type: "application/octet-stream" }),
        `${name}.sig`,
        `Save the signature (${name}.sig)`,
      );
      ready.append(
        section(
          "Statement downloaded",
          dl([
            ["File", code(name)],
            ["Size", `${blob.size} bytes`],
            ["Signed by key", code(keyId)],
            ["Signature (Ed25519, base64)", code(signature)],
          ]),
          h("ul", { class: "links" }, h("li", {}, statementLink), h("li", {}, signatureLink)),
        ),
      );
      statementLink.click();
    },
  );
  const pem = new Blob([key.publicKeyPem], { type: "application/x-pem-file" });
  root.append(
    h("h1", {}, "Statements"),
    h(
      "p",
      {},
      "Every deposit credited in a period, with its amount, fee, net and transactions, and the " +
        "period's opening and closing totals per chain and asset. Settle signs each statement, " +
        "so your auditor can prove it came from Settle unaltered.",
    ),
    make,
    ready,
    section(
      "Verifying a statement",
      dl([
        ["Key id", code(key.keyId)],
        ["Algorithm", key.algorithm],
        ["Public key (base64)", code(key.publicKey)],
      ]),
      h("p", {}, saveLink(pem, "settle-statements.pem", "Save the public key (PEM)")),
      h("p", {}, "With OpenSSL 3, in the folder of the three files:"),
      h(
        "pre",
        { tabindex: "0" },
        "openssl pkeyutl -verify -pubin -inkey settle-statements.pem -rawin \\\n" +
          "  -in STATEMENT -sigfile STATEMENT.sig",
      ),
      h(
        "p",
        { class: "muted" },
        "The same key is served to anyone at /v1/statements/key; the statement names its key id.",
      ),
    ),
  );
}
