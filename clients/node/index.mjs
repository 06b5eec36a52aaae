// ES module entry: the same functions as index.js.
import verifier from './index.js';

export const {
  DEFAULT_TOLERANCE_S,
  SIGNATURE_HEADER,
  TIMESTAMP_HEADER,
  WebhookVerificationError,
  sign,
  verify,
} = verifier;
export default verifier;
