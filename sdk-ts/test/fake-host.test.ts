import assert from 'node:assert/strict';
import { beforeEach, test } from 'node:test';

// The policy's view: the WIT imports, which `register.js` resolves to the fake host.
import { log } from 'slotgate:policy/log@2.0.0';
import { monotonicMs, wallMs } from 'slotgate:policy/clocks@2.0.0';
import {
  bucketLevel,
  bucketRefund,
  bucketTake,
  event,
  quotaLevel,
  quotaLimit,
  quotaRefund,
  quotaResetMs,
  quotaTake,
  windowAdd,
} from 'slotgate:policy/state@2.0.0';

import { errorMessage } from '../src/index.js';
import { ComponentError, Trap, WALL_START_MS, fakeHost } from '../src/testing/index.js';

beforeEach(() => fakeHost.reset());

const ms = (iso: string) => Date.parse(iso);

test('the clocks start where the Rust SDK’s do and move together', () => {
  assert.equal(monotonicMs(), 0n);
  assert.equal(wallMs(), BigInt(WALL_START_MS));
  fakeHost.advanceMs(1500);
  assert.equal(monotonicMs(), 1500n);
  assert.equal(wallMs(), BigInt(WALL_START_MS + 1500));
  fakeHost.setWallMs(ms('2026-12-04T10:00:00Z'));
  fakeHost.advanceMs(500);
  assert.equal(wallMs(), BigInt(ms('2026-12-04T10:00:00.500Z')));
  assert.equal(monotonicMs(), 2000n, 'setting the wall clock leaves the monotonic one');
});

test('a bucket starts full, refills over time, and says how long to wait', () => {
  assert.equal(bucketTake('k', 10, 1, 4), 0);
  assert.equal(bucketLevel('k', 10, 1), 6);
  assert.equal(bucketTake('k', 10, 1, 8), 2, 'two more tokens take two seconds');
  assert.equal(bucketLevel('k', 10, 1), 6, 'a refused take takes nothing');
  fakeHost.advanceMs(2000);
  assert.equal(bucketTake('k', 10, 1, 8), 0);
  assert.equal(bucketTake('k', 10, 1, 11), Infinity, 'more than the capacity: never');
  assert.equal(bucketTake('k', 10, 0, 5), Infinity, 'no refill: never');
  fakeHost.advanceMs(60_000);
  assert.equal(bucketLevel('k', 10, 1), 10, 'never above the capacity');
});

test('a refund gives back up to the capacity, and a negative one charges more', () => {
  bucketTake('k', 10, 0, 10);
  assert.equal(bucketRefund('k', 10, 0, 3), 3);
  assert.equal(bucketRefund('k', 10, 0, 30), 10);
  assert.equal(bucketRefund('k', 10, 0, -15), -5, 'a debt');
  assert.equal(bucketTake('k', 10, 0, 1), Infinity);
});

test('a window counts what was added within its span', () => {
  assert.equal(windowAdd('w', 1000n, 2n), 2n);
  fakeHost.advanceMs(600);
  assert.equal(windowAdd('w', 1000n, 3n), 5n);
  fakeHost.advanceMs(400);
  assert.equal(windowAdd('w', 1000n, 0n), 3n, 'the first two left the window');
  fakeHost.advanceMs(600);
  assert.equal(windowAdd('w', 1000n, 0n), 0n);
});

test('a quota is whole in each window and tells the wait until the next', () => {
  fakeHost.setWallMs(ms('2026-12-04T23:00:00Z'));
  assert.equal(quotaTake('team', 'day', 100, 60), 0);
  assert.equal(quotaLevel('team', 'day', 100), 40);
  assert.equal(quotaTake('team', 'day', 100, 50), 3600, 'an hour to midnight');
  assert.equal(quotaTake('team', 'day', 100, 500), Infinity, 'more than the limit: never');
  assert.equal(quotaResetMs('day'), BigInt(ms('2026-12-05T00:00:00Z')));
  fakeHost.advanceMs(3_600_000);
  assert.equal(quotaLevel('team', 'day', 100), 100, 'a new day');
  assert.equal(quotaTake('team', 'day', 100, 50), 0);
});

test('a refund settles into the window the charge was taken from, while it lasts', () => {
  fakeHost.setWallMs(ms('2026-12-04T22:00:00Z'));
  const evaluated = wallMs();
  quotaTake('team', 'day', 100, 60);
  fakeHost.advanceMs(1000);
  assert.equal(quotaRefund('team', 'day', 100, 20, evaluated), 60);
  fakeHost.advanceMs(2 * 3_600_000);
  assert.equal(quotaRefund('team', 'day', 100, 20, evaluated), 60, 'that day is over: nothing changes');
  assert.equal(quotaLevel('team', 'day', 100), 100);
});

test('an operator’s limit wins, and the window keeps what it used', () => {
  quotaTake('team', 'month', 100, 30);
  fakeHost.setQuotaLimit('team', 'month', 50);
  assert.equal(quotaLimit('team', 'month', 100), 50);
  assert.equal(quotaLevel('team', 'month', 100), 20);
  fakeHost.setQuotaLimit('team', 'month', undefined);
  assert.equal(quotaLimit('team', 'month', 100), 100);
});

test('a bad period is the WIT error, as a ComponentError with the payload', () => {
  assert.throws(
    () => quotaTake('team', 'fortnight', 1, 1),
    (e: unknown) => e instanceof ComponentError && /quota period `fortnight`/.test(errorMessage(e)),
  );
  assert.throws(() => quotaResetMs('day@Mars/Olympus_Mons'), /unknown time zone/);
});

test('logs and events are kept for the test, and a bad event name traps', () => {
  log('info', 'hello');
  log('warn', 'é'.repeat(3000));
  event('over_soft_limit');
  const logs = fakeHost.takeLogs();
  assert.deepEqual(logs[0], ['info', 'hello']);
  assert.equal(Buffer.byteLength(logs[1]![1]), 4096, 'cut at 4096 bytes, on a character boundary');
  assert.deepEqual(fakeHost.takeLogs(), []);
  assert.deepEqual(fakeHost.takeEvents(), ['over_soft_limit']);
  assert.throws(() => event('Over Limit'), Trap);
});

test('a state key over 4096 bytes traps', () => {
  assert.throws(() => bucketTake('k'.repeat(4097), 1, 1, 1), Trap);
  assert.equal(bucketTake('k'.repeat(4096), 1, 1, 1), 0);
});
