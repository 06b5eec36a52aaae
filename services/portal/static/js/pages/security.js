// Security: the member's two-factor sign-in (set up an authenticator app, recovery codes,
// turn it off) and, for owners, requiring it of every member.

import { api } from "../api.js";
import { refreshSession, session } from "../session.js";
import { field, form, h, input, message, section, time, toast } from "../ui.js";
import { confirmSensitive } from "../stepup.js";

export async function render(root) {
  const { mfa } = await api("GET", "/v1/me/mfa");
  root.append(h("h1", {}, "Security"));
  if (session.current.mfaEnrolmentRequired) {
    root.append(
      message("Your tenant requires two-factor sign-in. Set it up to continue: the other pages open once it is on.", "info"),
    );
  }
  root.append(twoFactor(mfa));
  if (session.can("owner")) root.append(rules(mfa));
}

function twoFactor(mfa) {
  const out = section("Two-factor sign-in");
  if (!mfa.enabled) {
    const area = h("div");
    const start = h("button", { type: "button", class: "primary" }, "Set up two-factor sign-in");
    start.addEventListener("click", async () => {
      const enrolment = await confirmSensitive({
        title: "Set up two-factor sign-in",
        intro: "From now on, signing in will also ask for a code from an authenticator app on your phone.",
        changes: [["Two-factor sign-in", "Off", "On (once you confirm a code)"]],
        confirmText: "Continue",
        action: async () => (await api("POST", "/v1/me/mfa/enrolment")).enrolment,
      });
      if (enrolment) area.replaceChildren(enrolmentSteps(enrolment));
    });
    area.append(
      h("p", {}, "Off: you sign in with your password alone."),
      h("p", {}, start),
    );
    out.append(area);
    return out;
  }
  const left = mfa.recoveryCodesLeft;
  const codesArea = h("div");
  const renew = h("button", { type: "button" }, "New recovery codes");
  renew.addEventListener("click", async () => {
    const codes = await confirmSensitive({
      title: "New recovery codes",
      changes: [["Recovery codes", `${left} left`, "10 new ones; the old ones stop working"]],
      confirmText: "Make new codes",
      action: async () => (await api("POST", "/v1/me/mfa/recovery-codes")).recoveryCodes,
    });
    if (codes) codesArea.replaceChildren(recoveryCodes(codes));
  });
  const off = h("button", { type: "button", class: "danger", disabled: mfa.requiredByTenant }, "Turn off");
  off.addEventListener("click", async () => {
    const done = await confirmSensitive({
      title: "Turn off two-factor sign-in",
      changes: [["Two-factor sign-in", "On", "Off: the password alone signs in"]],
      confirmText: "Turn off",
      danger: true,
      action: () => api("DELETE", "/v1/me/mfa"),
    });
    if (done) {
      toast("Two-factor sign-in is off");
      await refreshSession("/security");
    }
  });
  out.append(
    h("p", {}, "On since ", time(mfa.enabledAt), `. Recovery codes left: ${left}.`),
    mfa.requiredByTenant ? h("p", { class: "muted" }, "Your tenant requires it, so it stays on.") : null,
    h("div", { class: "row" }, renew, off),
    codesArea,
  );
  return out;
}

function enrolmentSteps(enrolment) {
  const code = input({ name: "code", autocomplete: "one-time-code", inputmode: "numeric", maxlength: 6, spellcheck: false });
  const confirm = form(
    "Confirm two-factor sign-in",
    field("Code from your app", code, "The 6-digit code the app shows for Settle."),
    "Turn on",
    async () => {
      const body = await api("POST", "/v1/me/mfa/enrolment/confirm", { code: code.value.trim() });
      const finished = h("button", { type: "button", onclick: () => refreshSession("/security") }, "Done");
      confirm.replaceWith(
        message("Two-factor sign-in is on.", "info"),
        recoveryCodes(body.recoveryCodes),
        h("p", {}, finished),
      );
      finished.focus();
    },
  );
  return h(
    "div",
    { class: "enrolment" },
    h("p", {}, "1. Scan this QR code with an authenticator app (or enter the key by hand)."),
    h("img", { src: enrolment.qrCode, alt: "QR code of your two-factor secret for an authenticator app", class: "qr", width: 220, height: 220 }),
    h("p", {}, "Key: ", h("code", { class: "totp-secret" }, enrolment.secret)),
    h("p", {}, "2. Type the code it shows to turn two-factor sign-in on."),
    confirm,
  );
}

function recoveryCodes(codes) {
  const text = codes.join("\n");
  const copy = h("button", { type: "button" }, "Copy codes");
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text);
    } catch (err) {
      // Clipboard refused: the codes stay on screen to write down.
    }
    copy.textContent = "Copied";
  });
  return h(
    "div",
    { class: "secret-box" },
    h("p", {}, h("strong", {}, "Recovery codes"), ": each signs you in once if you lose your phone. Shown once: keep them somewhere safe."),
    h("ul", { class: "recovery-codes", "aria-label": "Recovery codes" }, codes.map((c) => h("li", {}, h("code", {}, c)))),
    copy,
  );
}

function rules(mfa) {
  const required = mfa.requiredByTenant;
  const box = h("input", { type: "checkbox", id: "require-mfa", checked: required });
  const save = h("button", { type: "button" }, "Save");
  save.addEventListener("click", async () => {
    const want = box.checked;
    if (want === required) return;
    const done = await confirmSensitive({
      title: "Sign-in rules",
      changes: [["Two-factor sign-in for every member", required ? "Required" : "Not required", want ? "Required" : "Not required"]],
      confirmText: "Save",
      action: () => api("PUT", `/v1/tenants/${session.current.tenantId}/security`, { requireMfa: want }),
    });
    if (done) {
      toast(want ? "Two-factor sign-in is required" : "Two-factor sign-in is optional");
      await refreshSession("/security");
    } else {
      box.checked = required;
    }
  });
  return section(
    "Sign-in rules",
    h("p", { class: "muted" }, "Members without two-factor sign-in are asked to set it up before anything else."),
    h("div", { class: "check" }, box, h("label", { for: "require-mfa" }, "Require two-factor sign-in for every member")),
    h("p", {}, save),
  );
}
