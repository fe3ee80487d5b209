/**
 * `slotgate:policy/state@2.0.0` under Node: the fake host's state. Each function is typed by the
 * generated declaration of the import, so a change of the WIT fails the build here first.
 */

import type * as Wit from 'slotgate:policy/state@2.0.0';

import { fakeHost as h } from '../fake-host.js';

export const bucketTake: typeof Wit.bucketTake = (key, capacity, refill, amount) =>
  h.bucketTake(key, capacity, refill, amount);
export const bucketRefund: typeof Wit.bucketRefund = (key, capacity, refill, amount) =>
  h.bucketRefund(key, capacity, refill, amount);
export const bucketLevel: typeof Wit.bucketLevel = (key, capacity, refill) =>
  h.bucketLevel(key, capacity, refill);
export const windowAdd: typeof Wit.windowAdd = (key, windowMs, amount) =>
  h.windowAdd(key, windowMs, amount);
export const quotaTake: typeof Wit.quotaTake = (key, period, limit, amount) =>
  h.quotaTake(key, period, limit, amount);
export const quotaRefund: typeof Wit.quotaRefund = (key, period, limit, amount, at) =>
  h.quotaRefund(key, period, limit, amount, at);
export const quotaLevel: typeof Wit.quotaLevel = (key, period, limit) => h.quotaLevel(key, period, limit);
export const quotaLimit: typeof Wit.quotaLimit = (key, period, limit) => h.quotaLimit(key, period, limit);
export const quotaResetMs: typeof Wit.quotaResetMs = (period) => h.quotaResetMs(period);
export const event: typeof Wit.event = (name) => h.event(name);
