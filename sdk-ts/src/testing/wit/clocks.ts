/** `slotgate:policy/clocks@2.0.0` under Node: the fake host's manual clock. */

import type * as Wit from 'slotgate:policy/clocks@2.0.0';

import { fakeHost } from '../fake-host.js';

export const monotonicMs: typeof Wit.monotonicMs = () => fakeHost.monotonicMs();
export const wallMs: typeof Wit.wallMs = () => fakeHost.wallMs();
