// The JSON APIs, called with the session cookie (same origin) and the CSRF token.
// The token is kept in localStorage: the cookie is HttpOnly, and other tabs need it too.

const CSRF_KEY = "settle.csrf";
const SAFE = new Set(["GET", "HEAD", "OPTIONS"]);
//: Calls whose 401 says the credentials given were wrong, not that the session ended.
const NOT_SIGNED_OUT = new Set(["/v1/sessions", "/v1/sessions/current/step-up"]);

export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error : `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code ? body.code : "http_" + status;
    this.details = body && body.details ? body.details : null;
  }
}

export function rememberCsrf(token) {
  if (token) localStorage.setItem(CSRF_KEY, token);
  else localStorage.removeItem(CSRF_KEY);
}

let onSignedOut = () => {};
/** Called when a request answers 401: the session ended. */
export function whenSignedOut(handler) {
  onSignedOut = handler;
}

/** One API call: JSON in, JSON out; an error answer throws ApiError. */
export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (!SAFE.has(method)) {
    const csrf = localStorage.getItem(CSRF_KEY);
    if (csrf) headers["X-CSRF-Token"] = csrf;
  }
  const init = { method, headers, credentials: "same-origin", redirect: "error" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch (err) {
    data = null;
  }
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    // A wrong password at sign-in or step-up is a 401 too, with the session (if any) alive.
    if (response.status === 401 && !NOT_SIGNED_OUT.has(path)) onSignedOut(error);
    throw error;
  }
  return data;
}

/** A query string of the values that are set. */
export function query(params) {
  const out = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") out.set(name, String(value));
  }
  const text = out.toString();
  return text ? "?" + text : "";
}

export function enc(value) {
  return encodeURIComponent(value);
}
