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

import { CALLER_HEADER } from '../identity.js';
import { errorMessage } from '../settings.js';
import { fakeHost } from './fake-host.js';

/** What a test states of a request (see {@link request}). */
export type RequestPatch = Partial<Omit<Request, 'queue'>> & { queue?: Partial<QueueState>; caller?: string };

/**
 * A request: `patch` over the defaults (`queue` merged field by field). `caller` is the identity the
 * host named (its header `x-slotgate-caller`, after `headers`; default `anonymous`): a test states
 * it, as the host would have named the request's key, uid or tenant.
 */
export function request(patch: RequestPatch = {}): Request {
  const { queue, caller, headers, ...rest } = patch;
  return {
    method: 'POST',
    path: '/v1/chat/completions',
    dialect: 'chat',
    stream: false,
    promptChars: 0n,
    promptTokensEstimate: 0n,
    bodyBytes: 0n,
    headers: [...(headers ?? []), [CALLER_HEADER, caller ?? 'anonymous']],
    ...rest,
    queue: { depth: 0, capacity: 8, inFlight: 0, estimatedWaitSeconds: 0, ...queue },
  };
}

/** An evaluation of `request(patch.request)`, now by the fake host's wall clock. */
export function evaluation(
  patch: {
    request?: RequestPatch;
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
    request?: RequestPatch;
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
