// Sign in: email and password (and, for a member with two-factor sign-in, a code from
// their authenticator app or a recovery code), a session cookie and a CSRF token.

import { api } from "../api.js";
import { field, form, h, input } from "../ui.js";

export function page(signedIn) {
  const email = input({ type: "email", name: "email", autocomplete: "username", required: true });
  const password = input({
    type: "password",
    name: "password",
    autocomplete: "current-password",
    required: true,
  });
  const code = input({
    name: "code",
    autocomplete: "one-time-code",
    inputmode: "numeric",
    spellcheck: false,
  });
  const codeField = field(
    "Authentication code",
    code,
    "The 6-digit code your authenticator app shows, or one of your recovery codes.",
  );
  codeField.hidden = true;
  // Only for one person who is a member of several tenants with one email and password.
  const tenant = input({ name: "tenantId", spellcheck: false });
  const tenantField = field(
    "Tenant ID",
    tenant,
    "You are a member of several tenants with this email: the ID of the one to sign in to.",
  );
  tenantField.hidden = true;
  const signInForm = form(
    "Sign in",
    [field("Email", email), field("Password", password), tenantField, codeField],
    "Sign in",
    async () => {
      const body = { email: email.value.trim(), password: password.value };
      if (!codeField.hidden && code.value.trim()) body.code = code.value.trim();
      if (!tenantField.hidden && tenant.value.trim()) body.tenantId = tenant.value.trim();
      let answer;
      try {
        answer = await api("POST", "/v1/sessions", body);
      } catch (err) {
        if (err.code === "mfa_required") {
          // The password was right: the same call again with a code.
          codeField.hidden = false;
          code.focus();
          throw new Error("Enter the code from your authenticator app (or a recovery code).");
        }
        const fields = (err.details && err.details.fields) || {};
        if (err.status === 400 && "tenantId" in fields) {
          tenantField.hidden = false;
          tenant.focus();
          throw new Error("This email is a member of several tenants: enter the tenant's ID.");
        }
        code.value = "";
        if (err.status === 401 && !codeField.hidden) {
          throw new Error("The code is wrong or was used already (or the password is wrong).");
        }
        password.value = "";
        if (err.status === 401) throw new Error("Email or password is wrong.");
        throw err;
      }
      await signedIn(answer);
    },
  );
  return h(
    "div",
    { class: "signin" },
    h("h1", {}, "Sign in to Settle"),
    h("p", { class: "muted" }, "Members of a tenant sign in here. A portal link signs you in by itself."),
    signInForm,
  );
}
