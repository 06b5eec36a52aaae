// Who is signed in, and going to a route: what the pages share with the router (app.js),
// below both, so no page imports the router that imports it.

import { api } from "./api.js";

const RANK = { viewer: 0, developer: 1, admin: 2, owner: 3 };

/** What the signed-in session may do (the API decides; this only hides what it refuses). */
export const session = {
  current: null,
  get link() {
    return Boolean(this.current && this.current.memberId === null);
  },
  can(role) {
    return Boolean(this.current) && RANK[this.current.role] >= RANK[role];
  },
};

/** Go to a route (its query given as an object of set values). */
export function go(path, params) {
  const search = params ? new URLSearchParams(
    Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== ""),
  ).toString() : "";
  const target = "#" + path + (search ? "?" + search : "");
  // The same route again: the router renders on hashchange, which setting it would not fire.
  if (location.hash === target) window.dispatchEvent(new HashChangeEvent("hashchange"));
  else location.hash = target;
}

/** Read the session again (after a change to two-factor sign-in) and show `path`. */
export async function refreshSession(path) {
  const body = await api("GET", "/v1/sessions/current");
  session.current = body.session;
  go(path);
}
