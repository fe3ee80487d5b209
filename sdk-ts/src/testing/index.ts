/**
 * What a policy's unit tests import: the fake host behind the WIT imports, input builders and
 * `validate`. Run the tests with `node --import <sdk>/testing/register.js --test`, so that the
 * policy's own `slotgate:policy/...` imports resolve to the fake host.
 */

export { ComponentError, FakeHost, Trap, WALL_START_MS, fakeHost } from './fake-host.js';
export { completion, evaluation, request, validate, type RequestPatch, type Validation } from './inputs.js';
export { parsePeriod, periodWindow, type Period, type Span } from './calendar.js';
