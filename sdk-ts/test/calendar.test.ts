import assert from 'node:assert/strict';
import { test } from 'node:test';

import { parsePeriod, periodWindow } from '../src/testing/index.js';

const ms = (iso: string) => Date.parse(iso);
const win = (period: string, at: string) => periodWindow(parsePeriod(period), ms(at));

// The cases of sdk/src/calendar.rs, so the fake host's windows are the host's.
test('periods parse, and bad ones are refused', () => {
  assert.deepEqual(parsePeriod('day'), { span: 'day' });
  assert.deepEqual(parsePeriod('day@UTC'), { span: 'day' });
  assert.deepEqual(parsePeriod('month@America/New_York'), { span: 'month', zone: 'America/New_York' });
  for (const bad of ['', 'days', 'Day', 'day@', 'day@Europe Paris', 'minute']) {
    assert.throws(() => parsePeriod(bad), (e) => typeof e === 'string', bad);
  }
});

test('windows start and end at the zone’s boundaries', () => {
  assert.deepEqual(win('day', '2026-12-04T23:59:59.999Z'), [ms('2026-12-04T00:00:00Z'), ms('2026-12-05T00:00:00Z')]);
  assert.equal(win('day', '2026-12-05T00:00:00Z')[0], ms('2026-12-05T00:00:00Z'), 'midnight starts the next day');
  // Paris is UTC+1 in December: its day starts at 23:00 UTC.
  assert.deepEqual(win('day@Europe/Paris', '2026-12-04T23:30:00Z'), [
    ms('2026-12-04T23:00:00Z'),
    ms('2026-12-05T23:00:00Z'),
  ]);
  assert.deepEqual(win('hour', '2026-12-04T10:42:00Z'), [ms('2026-12-04T10:00:00Z'), ms('2026-12-04T11:00:00Z')]);
  // 2026-12-04 is a Friday; ISO weeks start on Monday.
  assert.deepEqual(win('week', '2026-12-04T12:00:00Z'), [ms('2026-11-30T00:00:00Z'), ms('2026-12-07T00:00:00Z')]);
  assert.deepEqual(win('week', '2026-11-30T00:00:00Z')[0], ms('2026-11-30T00:00:00Z'), 'a Monday starts its week');
  assert.deepEqual(win('month', '2026-02-14T12:00:00Z'), [ms('2026-02-01T00:00:00Z'), ms('2026-03-01T00:00:00Z')]);
  assert.deepEqual(win('month', '2026-12-31T12:00:00Z'), [ms('2026-12-01T00:00:00Z'), ms('2027-01-01T00:00:00Z')]);
});

test('a day with a clock change is 23 or 25 hours', () => {
  // Europe/Paris springs forward on 2026-03-29 and falls back on 2026-10-25.
  let [s, e] = win('day@Europe/Paris', '2026-03-29T12:00:00Z');
  assert.equal(e - s, 23 * 3_600_000);
  [s, e] = win('day@Europe/Paris', '2026-10-25T12:00:00Z');
  assert.equal(e - s, 25 * 3_600_000);
  assert.equal(s, ms('2026-10-24T22:00:00Z'));
});

test('an unknown zone is an error that names it', () => {
  assert.throws(() => win('day@Mars/Olympus_Mons', '2026-12-04T12:00:00Z'), /day@Mars\/Olympus_Mons/);
});
