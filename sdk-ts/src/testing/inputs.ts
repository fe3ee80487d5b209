/**
 * Inputs for unit tests, stated partially: each builder fills in the rest from the Rust SDK's
 * default input (a POST to `/v1/chat/completions` over TCP with no key, an empty queue of 8), so a
 * test says only what matters to it. And `validate`, which reads `validateSettings`'s WIT result
 * back from the exception componentize-js maps it onto.
 */

import type {
  Allow,
  Completion,
  Earlier,
  Evaluation,
  QueueState,
  Request,
  SettingsVerdict,
} from 'slotgate:policy/types@2.0.0';

import { errorMessage } from '../settings.js';
import { fakeHost } from './fake-host.js';

/** A request: `patch` over the defaults (`queue` merged field by field). */
export function request(patch: Partial<Omit<Request, 'queue'>> & { queue?: Partial<QueueState> } = {}): Request {
  const { queue, ...rest } = patch;
  return {
    method: 'POST',
    path: '/v1/chat/completions',
    dialect: 'chat',
    stream: false,
    promptChars: 0n,
    promptTokensEstimate: 0n,
    bodyBytes: 0n,
    headers: [],
    ...rest,
    queue: { depth: 0, capacity: 8, inFlight: 0, estimatedWaitSeconds: 0, ...queue },
  };
}

/** An evaluation of `request(patch.request)`, now by the fake host's wall clock. */
export function evaluation(
  patch: {
    request?: Parameters<typeof request>[0];
    earlier?: Partial<Earlier>;
    nowUnixMs?: bigint;
  } = {},
): Evaluation {
  return {
    request: request(patch.request),
    earlier: { policies: 0, ...patch.earlier },
    nowUnixMs: patch.nowUnixMs ?? fakeHost.wallMs(),
  };
}

/** A completion of `request(patch.request)`: allowed, answered 200 with no usage, evaluated now. */
export function completion(
  patch: Partial<Omit<Completion, 'request' | 'decision'>> & {
    request?: Parameters<typeof request>[0];
    decision?: Partial<Allow>;
  } = {},
): Completion {
  const { request: r, decision, ...rest } = patch;
  return {
    chainAllowed: true,
    status: 200,
    outcome: 'ok',
    promptTokens: 0n,
    completionTokens: 0n,
    queueWaitMs: 0n,
    upstreamMs: 0n,
    evaluatedUnixMs: fakeHost.wallMs(),
    ...rest,
    request: request(r),
    decision: {
      disablePromptCache: false,
      stripIdSlot: false,
      responseHeaders: [],
      rateLimits: {},
      ...decision,
    },
  };
}

/** The WIT `result<settings-verdict, string>` of `validateSettings(settings)`, as a value. */
export type Validation = { tag: 'ok'; val: SettingsVerdict } | { tag: 'err'; val: string };

/**
 * Calls `validateSettings` with `settings` (an object, serialised as the host would, or JSON text)
 * and returns its result: an exception is the `err` (a string, as componentize-js requires; any
 * other exception would trap in slotgate, and is rethrown here).
 */
export function validate(
  validateSettings: (settings: string) => SettingsVerdict,
  settings: unknown,
): Validation {
  const text = typeof settings === 'string' ? settings : JSON.stringify(settings ?? null);
  try {
    return { tag: 'ok', val: validateSettings(text) };
  } catch (e) {
    if (typeof e === 'string') return { tag: 'err', val: e };
    throw new Error(`validateSettings threw ${errorMessage(e)}: only a string becomes the WIT error`, { cause: e });
  }
}
