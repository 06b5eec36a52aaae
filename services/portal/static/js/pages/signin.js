// Sign in: email and password, a session cookie and a CSRF token.

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
  const signInForm = form(
    "Sign in",
    [field("Email", email), field("Password", password)],
    "Sign in",
    async () => {
      let body;
      try {
        body = await api("POST", "/v1/sessions", {
          email: email.value.trim(),
          password: password.value,
        });
      } catch (err) {
        password.value = "";
        if (err.status === 401) throw new Error("Email or password is wrong.");
        throw err;
      }
      await signedIn(body);
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
