/** `slotgate:policy/log@2.0.0` under Node: the fake host's. Typed by the generated declarations. */

import type * as Wit from 'slotgate:policy/log@2.0.0';

import { fakeHost } from '../fake-host.js';

export const log: typeof Wit.log = (level, message) => fakeHost.log(level, message);
