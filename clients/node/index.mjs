// ES module entry: the same functions as index.js.
import verifier from './index.js';

export const {
  DEFAULT_TOLERANCE_S,
  SIGNATURE_HEADER,
  TIMESTAMP_HEADER,
  WebhookVerificationError,
  sign,
  signStandard,
  verify,
  verifyStandard,
} = verifier;
export default verifier;
