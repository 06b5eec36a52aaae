// Sensitive changes (destinations, the policy, API keys, roles, secret rotation, two-factor
// settings): a dialog shows the change, before and after, and asks for the password (or,
// with two-factor sign-in, a code) when the session has not given one in 5 minutes. The
// API is what enforces it (403 step_up_required); the dialog makes it one step.

import { api } from "./api.js";
import { session } from "./session.js";
import { field, h, input, message } from "./ui.js";

/** Whether the session gave a password or code recently enough (10 s of margin). */
function fresh() {
  const until = session.current && session.current.stepUpExpiresAt;
  return Boolean(until) && Date.parse(until) - Date.now() > 10_000;
}

/**
 * Ask before a sensitive change. `changes`: rows [what, now, after] (after may be
 * null for a change with no new value). `action()` makes the change; it runs only when
 * the person confirms. Resolves with action's result, or null when cancelled.
 */
export function confirmSensitive({ title, intro, changes, confirmText, action, danger = false }) {
  return new Promise((resolve) => {
    const mfa = Boolean(session.current && session.current.mfaEnabled);
    const factor = input(
      mfa
        ? { name: "stepUpCode", autocomplete: "one-time-code", inputmode: "numeric", spellcheck: false }
        : { type: "password", name: "stepUpPassword", autocomplete: "current-password" },
    );
    const factorLabel = mfa ? "Authentication code (or a recovery code)" : "Your password";
    const factorField = field(factorLabel, factor, "Sensitive changes need it again after 5 minutes.");
    factorField.hidden = fresh();
    const errors = h("div", { class: "form-errors" });
    const confirm = h("button", { type: "submit", class: danger ? "danger" : "primary" }, confirmText);
    const cancel = h("button", { type: "button" }, "Cancel");
    const rows = changes.map(([what, now, after]) =>
      h("tr", {}, h("th", { scope: "row" }, what), h("td", {}, now ?? "—"), h("td", {}, after ?? "—")),
    );
    const headingId = `dialog-${Math.random().toString(36).slice(2)}`;
    const formEl = h(
      "form",
      { method: "dialog", "aria-labelledby": headingId },
      h("h2", { id: headingId }, title),
      intro ? h("p", {}, intro) : null,
      changes.length
        ? h(
            "div",
            { class: "table-wrap" },
            h(
              "table",
              { class: "change" },
              h("caption", {}, "The change"),
              h("thead", {}, h("tr", {}, h("th", { scope: "col" }, ""), h("th", { scope: "col" }, "Now"), h("th", { scope: "col" }, "After"))),
              h("tbody", {}, rows),
            ),
          )
        : null,
      factorField,
      errors,
      h("div", { class: "row" }, confirm, cancel),
    );
    const dialog = h("dialog", { class: "step-up", "aria-labelledby": headingId }, formEl);
    const close = (value) => {
      dialog.close();
      dialog.remove();
      resolve(value);
    };
    cancel.addEventListener("click", () => close(null));
    dialog.addEventListener("cancel", (event) => {
      event.preventDefault();
      close(null);
    });
    formEl.addEventListener("submit", async (event) => {
      event.preventDefault();
      errors.replaceChildren();
      confirm.disabled = true;
      try {
        if (!factorField.hidden) {
          const given = factor.value.trim();
          if (!given) throw new Error(mfa ? "Enter a code from your authenticator app." : "Enter your password.");
          const body = await api("POST", "/v1/sessions/current/step-up", mfa ? { code: given } : { password: factor.value });
          session.current = { ...session.current, ...body.session };
        }
        const result = await action();
        close(result === undefined ? true : result);
      } catch (err) {
        factor.value = "";
        if (err.code === "step_up_required") {
          factorField.hidden = false;
          errors.replaceChildren(message(mfa ? "Enter a code from your authenticator app to confirm." : "Enter your password to confirm."));
          factor.focus();
        } else if (err.code === "unauthorized" || err.code === "mfa_required") {
          errors.replaceChildren(message(mfa ? "That code is wrong or was used already." : "That password is wrong."));
          factor.focus();
        } else {
          errors.replaceChildren(message(err.message || String(err)));
        }
      } finally {
        confirm.disabled = false;
      }
    });
    document.body.append(dialog);
    dialog.showModal();
    (factorField.hidden ? confirm : factor).focus();
  });
}
