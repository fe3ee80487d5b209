/**
 * slotgate's TypeScript SDK for policies v2: what a policy imports besides the WIT's own modules
 * (`slotgate:policy/types@2.0.0` for the records, `.../log`, `.../clocks`, `.../state` for the
 * host). Tests import `./testing/index.js` too.
 */

import './runtime.js';

export {
  allow,
  deny,
  forbidden,
  quotaExceeded,
  settingsOk,
  tooManyRequests,
  wholeSeconds,
} from './decision.js';
export {
  CALLER_HEADER,
  TENANT_HEADERS,
  TENANT_NAMED_HEADER,
  checkTenantHeader,
  header,
  identity,
  isHashedKey,
  promptTokensBest,
  tenantKey,
} from './identity.js';
export { checkSettings, errorMessage, kept, parseSettings } from './settings.js';
