'use strict';
// settle-webhooks: fixed vectors (computed with openssl), hostile inputs, real deliveries.
//
// Real deliveries: SETTLE_WEBHOOK_VECTORS names a JSON file of deliveries Settle made
// (Settle's test suite writes it and runs this suite). Without it that test skips,
// except in CI (CI set), where a missing file fails.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');

const { verify, sign, WebhookVerificationError } = require('..');

const TS = 1700000000;
const BODY = Buffer.from('{"id":"evt_1","type":"webhook.test"}');
const SECRET = 'whsec_test_secret';
// printf '1700000000.{"id":"evt_1","type":"webhook.test"}' | openssl dgst -sha256 -hmac whsec_test_secret
const EXPECTED = '300fe9a62e4c5c166d1ecf49f67cd28c64436b147d91784ac110bd597486ec23';

const headers = (signature, timestamp = TS) => ({
  'x-service-signature': signature,
  'x-service-timestamp': String(timestamp),
});

function refused(code, fn) {
  assert.throws(fn, (err) => err instanceof WebhookVerificationError && err.code === code);
}

test('sign matches an independent HMAC, also for non-ASCII secrets and bodies', () => {
  assert.equal(sign(SECRET, TS, BODY), EXPECTED);
  const body = Buffer.from('{"id":"evt_1","note":"grüße"}', 'utf8');
  assert.equal(
    sign('whsec_tëst', TS, body),
    'a525968241b2798bece81b582f96da67c2925ae683dbbd4efb8bb7e12f5a889f',
  );
});

test('a genuine delivery returns its event', () => {
  const event = verify(SECRET, headers(`v1=${EXPECTED}`), BODY, { now: TS + 5 });
  assert.deepEqual(event, { id: 'evt_1', type: 'webhook.test' });
});

test('header names in any case, fetch Headers, string and Uint8Array bodies', () => {
  const mixed = { 'X-Service-Signature': `v1=${EXPECTED}`, 'X-SERVICE-TIMESTAMP': String(TS) };
  assert.equal(verify(SECRET, mixed, BODY.toString(), { now: TS }).id, 'evt_1');
  const fetchHeaders = new Headers(mixed);
  assert.equal(verify(SECRET, fetchHeaders, new Uint8Array(BODY), { now: TS }).id, 'evt_1');
});

test('any matching v1 value is enough (rotation), in any position', () => {
  for (const value of [
    `v1=${EXPECTED},v1=${'0'.repeat(64)}`,
    `v1=${'0'.repeat(64)},v1=${EXPECTED}`,
    ` v1=${'0'.repeat(64)} , v1=${EXPECTED} `,
    `v0=abc,v1=${EXPECTED}`,
  ]) {
    assert.equal(verify(SECRET, headers(value), BODY, { now: TS }).id, 'evt_1', value);
  }
});

test('forged and broken deliveries are refused', () => {
  const cases = [
    ['invalid_signature', SECRET, headers(`v1=${EXPECTED}`), Buffer.concat([BODY, Buffer.from(' ')])],
    ['invalid_signature', 'whsec_other', headers(`v1=${EXPECTED}`), BODY],
    ['invalid_signature', SECRET, headers(`v1=${EXPECTED.toUpperCase()}`), BODY],
    ['invalid_signature', SECRET, headers(`v1=${EXPECTED.slice(0, 32)}`), BODY],
    ['invalid_signature', SECRET, headers('v1=ééé'), BODY],
    ['malformed_header', SECRET, headers(`v2=${EXPECTED}`), BODY],
    ['malformed_header', SECRET, headers('v1='), BODY],
    ['malformed_header', SECRET, headers(EXPECTED), BODY],
    ['missing_header', SECRET, { 'x-service-timestamp': String(TS) }, BODY],
    ['missing_header', SECRET, { 'x-service-signature': `v1=${EXPECTED}` }, BODY],
    ['malformed_header', SECRET, headers(`v1=${EXPECTED}`, 'soon'), BODY],
    ['malformed_header', SECRET, headers(`v1=${EXPECTED}`, '1700000000.0'), BODY],
    ['malformed_header', SECRET, headers(`v1=${EXPECTED}`, '-1700000000'), BODY],
    ['malformed_header', SECRET, headers(`v1=${EXPECTED}`, '0x6553f100'), BODY],
    ['malformed_header', SECRET, headers(`v1=${'a'.repeat(10000)}`), BODY],
  ];
  for (const [code, secret, hdrs, body] of cases) {
    refused(code, () => verify(secret, hdrs, body, { now: TS }));
  }
});

test('the timestamp must be within tolerance both ways', () => {
  const good = headers(`v1=${EXPECTED}`);
  assert.equal(verify(SECRET, good, BODY, { now: TS + 300 }).id, 'evt_1');
  assert.equal(verify(SECRET, good, BODY, { now: TS - 300 }).id, 'evt_1');
  for (const now of [TS + 301, TS - 301, TS + 1e9]) {
    refused('timestamp_out_of_tolerance', () => verify(SECRET, good, BODY, { now }));
  }
  refused('timestamp_out_of_tolerance', () => verify(SECRET, good, BODY, { now: TS + 61, tolerance: 60 }));
  // Without `now`, the real clock: a delivery from 2023 is stale
  refused('timestamp_out_of_tolerance', () => verify(SECRET, good, BODY));
});

test('an empty or missing secret is a configuration error, never a pass', () => {
  const anySignature = sign('x', TS, BODY);
  for (const secret of ['', undefined, null, Buffer.from('whsec_bytes')]) {
    assert.throws(() => verify(secret, headers(`v1=${anySignature}`), BODY, { now: TS }), TypeError);
  }
});

test('a parsed body (not the raw bytes) is refused with a hint', () => {
  assert.throws(() => verify(SECRET, headers(`v1=${EXPECTED}`), { id: 'evt_1' }, { now: TS }), /raw request body/);
});

test('a genuine signature over a non-JSON body is still refused', () => {
  const body = Buffer.from('not json');
  refused('malformed_header', () => verify(SECRET, headers(`v1=${sign(SECRET, TS, body)}`), body, { now: TS }));
});

test('every real delivery verifies and every forgery fails', (t) => {
  const path = process.env.SETTLE_WEBHOOK_VECTORS;
  if (!path) {
    if (process.env.CI) assert.fail('SETTLE_WEBHOOK_VECTORS is not set (CI must test real deliveries)');
    t.skip('SETTLE_WEBHOOK_VECTORS not set: no real deliveries to check');
    return;
  }
  const vectors = JSON.parse(fs.readFileSync(path, 'utf8'));
  assert.ok(vectors.some((v) => v.valid) && vectors.some((v) => !v.valid));
  for (const vector of vectors) {
    const body = Buffer.from(vector.body, 'base64');
    if (vector.valid) {
      const event = verify(vector.secret, vector.headers, body, { now: vector.now });
      assert.equal(event.id, vector.headers['x-service-event-id'], vector.name);
    } else {
      assert.throws(
        () => verify(vector.secret, vector.headers, body, { now: vector.now }),
        WebhookVerificationError,
        vector.name,
      );
    }
  }
});
