/** Deliveries further than this from the receiver's clock are refused (seconds). */
export const DEFAULT_TOLERANCE_S: 300;
export const SIGNATURE_HEADER: 'x-service-signature';
export const TIMESTAMP_HEADER: 'x-service-timestamp';

export type VerificationErrorCode =
  | 'missing_header'
  | 'malformed_header'
  | 'timestamp_out_of_tolerance'
  | 'invalid_signature';

/** The delivery is not authentic or not fresh: answer 400 and drop it. */
export class WebhookVerificationError extends Error {
  readonly code: VerificationErrorCode;
}

/** The event envelope every delivery carries. */
export interface SettleEvent<Data = Record<string, unknown>> {
  id: string;
  type: string;
  createdAt: string;
  tenantId: string;
  data: Data;
}

export type HeaderSource =
  | Record<string, string | string[] | undefined>
  | { get(name: string): string | null | undefined };

/** Check a delivery and return its event; throws WebhookVerificationError. */
export function verify<Data = Record<string, unknown>>(
  secret: string,
  headers: HeaderSource,
  body: Buffer | Uint8Array | string,
  options?: { tolerance?: number; now?: number },
): SettleEvent<Data>;

/** The hex HMAC-SHA256 Settle puts after `v1=`. */
export function sign(secret: string, timestamp: number | string, body: Buffer | Uint8Array | string): string;

/** Check a delivery by its Standard Webhooks headers (an endpoint with signatureScheme "standard"). */
export function verifyStandard<Data = Record<string, unknown>>(
  secret: string,
  headers: HeaderSource,
  body: Buffer | Uint8Array | string,
  options?: { tolerance?: number; now?: number },
): SettleEvent<Data>;

/** The base64 HMAC-SHA256 Standard Webhooks puts after `v1,`. */
export function signStandard(
  secret: string,
  id: string,
  timestamp: number | string,
  body: Buffer | Uint8Array | string,
): string;

