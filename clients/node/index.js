'use strict';
/**
 * Verify Settle webhook deliveries.
 *
 *   const { verify, WebhookVerificationError } = require('settle-webhooks');
 *   app.post('/hook', express.raw({ type: 'application/json' }), (req, res) => {
 *     let event;
 *     try {
 *       event = verify(process.env.SETTLE_WEBHOOK_SECRET, req.headers, req.body); // raw Buffer
 *     } catch (err) {
 *       if (err instanceof WebhookVerificationError) return res.sendStatus(400);
 *       throw err;
 *     }
 *     // deduplicate on event.id, then act on event.type and event.data
 *     res.sendStatus(204);
 *   });
 *
 * A delivery carries `x-service-timestamp` (unix seconds) and `x-service-signature`:
 * `v1=<hex HMAC-SHA256>` keyed with the endpoint secret's UTF-8 bytes, over
 * `<timestamp>.<raw body>`. During a secret rotation it holds one `v1=` value per valid
 * secret (`v1=<new>,v1=<old>`); any match is enough. Deliveries whose timestamp is more
 * than `tolerance` seconds (300) from this machine's clock are refused.
 *
 * No dependencies beyond Node's `crypto`.
 */
const crypto = require('node:crypto');

const SIGNATURE_HEADER = 'x-service-signature';
const TIMESTAMP_HEADER = 'x-service-timestamp';
const DEFAULT_TOLERANCE_S = 300;
const SCHEME = 'v1';
/** Longest header value read: a rotation carries two values, leave room for more. */
const MAX_HEADER = 4096;

/** The delivery is not authentic or not fresh: answer 400 and drop it. */
class WebhookVerificationError extends Error {
  constructor(code, message) {
    super(message);
    this.name = 'WebhookVerificationError';
    /** One of: missing_header, malformed_header, timestamp_out_of_tolerance, invalid_signature. */
    this.code = code;
  }
}

function checkSecret(secret) {
  if (typeof secret !== 'string' || secret.length === 0) {
    // An empty key would let anyone sign: this is a configuration error, not a bad delivery.
    throw new TypeError('the endpoint secret is empty: set it to the whsec_... value');
  }
}

function asBuffer(body) {
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  if (Buffer.isBuffer(body)) return body;
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  throw new TypeError(
    'body must be the raw request body (a Buffer); a parsed and re-serialised body will not match',
  );
}

/** The hex HMAC-SHA256 Settle puts after `v1=` (useful in your own tests). */
function sign(secret, timestamp, body) {
  checkSecret(secret);
  return crypto
    .createHmac('sha256', Buffer.from(secret, 'utf8'))
    .update(Buffer.from(`${timestamp}.`, 'ascii'))
    .update(asBuffer(body))
    .digest('hex');
}

function header(headers, name) {
  let value;
  if (headers && typeof headers.get === 'function') {
    value = headers.get(name); // fetch's Headers, or a Map with lower-case keys
  } else if (headers && typeof headers === 'object') {
    for (const key of Object.keys(headers)) {
      if (key.toLowerCase() === name) {
        value = headers[key];
        break;
      }
    }
  }
  if (Array.isArray(value)) value = value.join(',');
  if (value === undefined || value === null) {
    throw new WebhookVerificationError('missing_header', `missing header ${name}`);
  }
  value = String(value);
  if (value.length > MAX_HEADER) {
    throw new WebhookVerificationError('malformed_header', `${name} is too long`);
  }
  return value;
}

function checkedTimestamp(raw, tolerance, now) {
  const text = raw.trim();
  if (!/^[0-9]{1,12}$/.test(text)) {
    throw new WebhookVerificationError('malformed_header', `${TIMESTAMP_HEADER} must be unix seconds`);
  }
  const timestamp = Number(text);
  const clock = now === undefined ? Date.now() / 1000 : now;
  const skew = Math.abs(clock - timestamp);
  if (skew > tolerance) {
    throw new WebhookVerificationError(
      'timestamp_out_of_tolerance',
      `timestamp ${timestamp} is ${Math.round(skew)}s from this clock (more than ${tolerance}s)`,
    );
  }
  return text;
}

function offeredSignatures(raw) {
  const values = [];
  for (const part of raw.split(',')) {
    const item = part.trim();
    const eq = item.indexOf('=');
    if (eq > 0 && item.slice(0, eq) === SCHEME && eq < item.length - 1) {
      values.push(Buffer.from(item.slice(eq + 1), 'utf8'));
    }
  }
  if (values.length === 0) {
    throw new WebhookVerificationError('malformed_header', `${SIGNATURE_HEADER} has no ${SCHEME}= value`);
  }
  return values;
}

/**
 * Check a delivery and return its event (the parsed body).
 *
 * @param {string} secret the endpoint's `whsec_...` secret
 * @param {object} headers `req.headers` (Node), a fetch `Headers`, or any object of headers
 * @param {Buffer|Uint8Array|string} body the raw body exactly as received
 * @param {{tolerance?: number, now?: number}} [options] tolerance in seconds (300); now in unix seconds
 * @returns {object} the event envelope `{id, type, createdAt, tenantId, data}`
 * @throws {WebhookVerificationError} when the delivery is not genuine or not fresh
 * @throws {TypeError} for an empty secret or a body that is not raw bytes
 */
function verify(secret, headers, body, options = {}) {
  checkSecret(secret);
  const raw = asBuffer(body);
  const tolerance = options.tolerance === undefined ? DEFAULT_TOLERANCE_S : options.tolerance;
  const timestamp = checkedTimestamp(header(headers, TIMESTAMP_HEADER), tolerance, options.now);
  const offered = offeredSignatures(header(headers, SIGNATURE_HEADER));
  const expected = Buffer.from(sign(secret, timestamp, raw), 'utf8');
  let matched = false;
  for (const value of offered) {
    // timingSafeEqual needs equal lengths; the expected length is public (64 hex digits).
    // Every value is compared, so the time taken does not tell which one matched.
    const same = value.length === expected.length && crypto.timingSafeEqual(value, expected);
    matched = same || matched;
  }
  if (!matched) {
    throw new WebhookVerificationError('invalid_signature', 'no v1= signature matches the body and the secret');
  }
  let event;
  try {
    event = JSON.parse(raw.toString('utf8'));
  } catch {
    throw new WebhookVerificationError('malformed_header', 'the body is not JSON');
  }
  if (event === null || typeof event !== 'object' || Array.isArray(event)) {
    throw new WebhookVerificationError('malformed_header', 'the body is not a JSON object');
  }
  return event;
}

// -- Standard Webhooks (an endpoint with signatureScheme "standard") ------------------

const STANDARD_ID_HEADER = 'webhook-id';
const STANDARD_TIMESTAMP_HEADER = 'webhook-timestamp';
const STANDARD_SIGNATURE_HEADER = 'webhook-signature';

/** The key of the standard scheme: the base64 after `whsec_`, decoded. */
function standardKey(secret) {
  checkSecret(secret);
  const text = secret.startsWith('whsec_') ? secret.slice('whsec_'.length) : secret;
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(text) || text.length % 4 !== 0) {
    throw new TypeError('the secret is not whsec_ followed by base64: rotate it (an old secret)');
  }
  return Buffer.from(text, 'base64');
}

/** The base64 HMAC-SHA256 Standard Webhooks puts after `v1,` (useful in your own tests). */
function signStandard(secret, id, timestamp, body) {
  return crypto
    .createHmac('sha256', standardKey(secret))
    .update(Buffer.from(`${id}.${timestamp}.`, 'utf8'))
    .update(asBuffer(body))
    .digest('base64');
}

/**
 * Check a delivery by its Standard Webhooks headers (webhook-id, webhook-timestamp,
 * webhook-signature: `v1,<base64>` values separated by spaces) and return its event.
 * Same options, errors and result as `verify`.
 */
function verifyStandard(secret, headers, body, options = {}) {
  const key = standardKey(secret);
  const raw = asBuffer(body);
  const tolerance = options.tolerance === undefined ? DEFAULT_TOLERANCE_S : options.tolerance;
  const id = header(headers, STANDARD_ID_HEADER);
  const timestamp = checkedTimestamp(header(headers, STANDARD_TIMESTAMP_HEADER), tolerance, options.now);
  const expected = Buffer.from(
    crypto.createHmac('sha256', key).update(Buffer.from(`${id}.${timestamp}.`, 'utf8')).update(raw).digest('base64'),
    'utf8',
  );
  let matched = false;
  let offered = 0;
  for (const part of header(headers, STANDARD_SIGNATURE_HEADER).split(' ')) {
    const comma = part.indexOf(',');
    if (comma <= 0 || part.slice(0, comma) !== SCHEME) continue;
    offered += 1;
    const value = Buffer.from(part.slice(comma + 1), 'utf8');
    const same = value.length === expected.length && crypto.timingSafeEqual(value, expected);
    matched = same || matched;
  }
  if (offered === 0) {
    throw new WebhookVerificationError('malformed_header', `${STANDARD_SIGNATURE_HEADER} has no v1, value`);
  }
  if (!matched) {
    throw new WebhookVerificationError('invalid_signature', 'no v1, signature matches the body and the secret');
  }
  let event;
  try {
    event = JSON.parse(raw.toString('utf8'));
  } catch {
    throw new WebhookVerificationError('malformed_header', 'the body is not JSON');
  }
  if (event === null || typeof event !== 'object' || Array.isArray(event)) {
    throw new WebhookVerificationError('malformed_header', 'the body is not a JSON object');
  }
  return event;
}

module.exports = {
  DEFAULT_TOLERANCE_S,
  SIGNATURE_HEADER,
  TIMESTAMP_HEADER,
  WebhookVerificationError,
  sign,
  signStandard,
  verify,
  verifyStandard,
};
