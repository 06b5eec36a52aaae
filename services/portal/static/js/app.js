// The portal: the navigation and the router (who is signed in: session.js) (routes live in the
// URL's fragment: #/deliveries?status=failed, #/endpoints/we_..., ...).

import { api, rememberCsrf, whenSignedOut } from "./api.js";
import { go, session } from "./session.js";
import { h, message } from "./ui.js";
import * as access from "./pages/access.js";
import * as accounts from "./pages/accounts.js";
import * as audit from "./pages/audit.js";
import * as deliveries from "./pages/deliveries.js";
import * as deposits from "./pages/deposits.js";
import * as endpoints from "./pages/endpoints.js";
import * as events from "./pages/events.js";
import * as overview from "./pages/overview.js";
import * as security from "./pages/security.js";
import * as signin from "./pages/signin.js";
import * as statements from "./pages/statements.js";

// [pattern, page module, title, nav path (or null), who sees it]
const ROUTES = [
  [/^\/$/, overview, "Overview", "/", "member"],
  [/^\/deposits$/, deposits, "Deposits", "/deposits", "member"],
  [/^\/deposits\/(.+)$/, deposits, "Deposit", null, "member"],
  [/^\/statements$/, statements, "Statements", "/statements", "member"],
  [/^\/accounts$/, accounts, "Accounts", "/accounts", "member"],
  [/^\/accounts\/(.+)$/, accounts, "Account", null, "member"],
  [/^\/policy$/, accounts, "Destination policy", "/policy", "member"],
  [/^\/endpoints$/, endpoints, "Webhook endpoints", "/endpoints", "any"],
  [/^\/endpoints\/(.+)$/, endpoints, "Webhook endpoint", null, "any"],
  [/^\/deliveries$/, deliveries, "Deliveries", "/deliveries", "any"],
  [/^\/deliveries\/(.+)$/, deliveries, "Delivery", null, "any"],
  [/^\/events$/, events, "Event catalog", "/events", "any"],
  [/^\/keys$/, access, "API keys", "/keys", "admin"],
  [/^\/members$/, access, "Members", "/members", "admin"],
  [/^\/audit$/, audit, "Audit log", "/audit", "admin"],
  [/^\/security$/, security, "Security", "/security", "member"],
];
//: The one page of a member who must set up two-factor sign-in first.
const ENROL = "/security";
//: Navigation labels (the page titles, shorter where they are long).
const NAV_LABELS = { "/": "Overview", "/policy": "Policy", "/endpoints": "Endpoints" };

function allowed(who, path) {
  if (session.current && session.current.mfaEnrolmentRequired) return path === ENROL;
  if (who === "any") return true;
  if (session.link) return false;
  return who === "member" || session.can(who);
}

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, search] = raw.split("?");
  return { path: path || "/", params: new URLSearchParams(search || "") };
}

function renderNav(active) {
  const nav = document.getElementById("nav");
  nav.replaceChildren();
  if (!session.current) return;
  const list = h("ul");
  for (const [, , title, path, who] of ROUTES) {
    if (!path || !allowed(who, path)) continue;
    const current = active === path || (path !== "/" && active.startsWith(path + "/"));
    const label = NAV_LABELS[path] || title;
    list.append(h("li", {}, h("a", { href: "#" + path, "aria-current": current ? "page" : null }, label)));
  }
  nav.append(list);
  const who = document.getElementById("who");
  const signOut = h("button", { type: "button" }, "Sign out");
  signOut.addEventListener("click", async () => {
    try {
      await api("DELETE", "/v1/sessions/current");
    } catch (err) {
      // Already ended: signing out still forgets it here.
    }
    signedOut();
  });
  const name = session.current.email || "Portal link";
  who.replaceChildren(
    h("span", {}, name, " · ", h("strong", { class: "role" }, session.current.role)),
    signOut,
  );
}

function signedOut() {
  session.current = null;
  rememberCsrf(null);
  document.getElementById("who").replaceChildren();
  renderNav("/");
  location.hash = "#/signin";
  render();
}

//: Counts renders: a render that a newer one overtook (another click, a hashchange while
//: its data loads) must neither clear aria-busy nor move focus; the newest owns the page.
let renders = 0;

async function render() {
  const mine = ++renders;
  const main = document.getElementById("main");
  const { path, params } = parseHash();
  if (path === "/signin" || !session.current) {
    if (session.link) {
      main.replaceChildren(message("This portal link's session has ended. Ask for a new link."));
      return;
    }
    renderNav("/");
    document.title = "Sign in · Settle";
    main.replaceChildren(signin.page(signedIn));
    main.querySelector("input")?.focus();
    return;
  }
  if (session.current.mfaEnrolmentRequired && path !== ENROL) {
    go(ENROL);
    return;
  }
  for (const [pattern, page, title, navPath, who] of ROUTES) {
    const match = path.match(pattern);
    if (!match) continue;
    renderNav(path);
    document.title = `${title} · Settle`;
    if (!allowed(who, navPath || path)) {
      main.replaceChildren(h("h1", {}, title), message("Your role cannot see this page."));
      return;
    }
    const root = h("div", { class: "page" });
    main.replaceChildren(root);
    // Busy while the page loads its data: assistive technology (and tests) wait for it.
    main.setAttribute("aria-busy", "true");
    try {
      await page.render(root, { path, params, id: match[1] ? decodeURIComponent(match[1]) : null, title });
    } catch (err) {
      root.append(message(err.message || String(err)));
    } finally {
      if (mine === renders) main.setAttribute("aria-busy", "false");
    }
    if (mine !== renders) return;
    const heading = main.querySelector("h1");
    if (heading) {
      heading.setAttribute("tabindex", "-1");
      heading.focus();
    }
    return;
  }
  main.replaceChildren(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/" }, "Overview")));
}

async function signedIn(body) {
  session.current = body.session;
  rememberCsrf(body.session.csrfToken);
  // Changing the hash renders (hashchange); render by hand only when it is already there.
  const target = session.link ? "#/endpoints" : "#/";
  if (location.hash === target) await render();
  else location.hash = target;
}

async function openLink() {
  // The token is in the fragment (never sent to a server log); trade it once.
  const token = location.hash.replace(/^#/, "");
  history.replaceState(null, "", "/portal/#/endpoints");
  const main = document.getElementById("main");
  try {
    const body = await api("POST", "/v1/sessions/portal-link", { token });
    session.current = body.session;
    rememberCsrf(body.session.csrfToken);
  } catch (err) {
    session.current = null;
    main.replaceChildren(
      h("h1", {}, "Portal link"),
      message("This portal link has expired or was already used. Ask for a new link."),
    );
    return false;
  }
  return true;
}

async function start() {
  whenSignedOut(() => {
    if (session.current) signedOut();
  });
  if (location.pathname === "/portal/link") {
    if (!(await openLink())) return;
  } else {
    try {
      const body = await api("GET", "/v1/sessions/current");
      session.current = body.session;
    } catch (err) {
      session.current = null;
    }
  }
  window.addEventListener("hashchange", render);
  await render();
}

start();
