/**
 * Calendar windows of the quota host functions, for the fake host: the rules of the host's
 * `sdk/src/calendar.rs`. A period is `hour`, `day`, `week` (ISO weeks, from Monday) or `month`,
 * optionally `@` an IANA time zone (`day@Europe/Paris`); without one it is UTC. A window starts at
 * the period's start in that zone's local time and ends where the next begins, so a day may last 23
 * or 25 hours. Zones come from Node's own ICU data (`Intl`), not from the host's database: they
 * agree for any zone both know.
 */

export type Span = 'hour' | 'day' | 'week' | 'month';

export interface Period {
  span: Span;
  /** The IANA zone; undefined for UTC. */
  zone?: string;
}

/** Parses `day`, `week@Europe/Paris`, ...; throws the host's message for a bad one. */
export function parsePeriod(s: string): Period {
  const at = s.indexOf('@');
  const span = at < 0 ? s : s.slice(0, at);
  const zone = at < 0 ? undefined : s.slice(at + 1);
  if (span !== 'hour' && span !== 'day' && span !== 'week' && span !== 'month') {
    throw `quota period \`${span}\`: expected hour, day, week or month ` +
      '(optionally @ and an IANA time zone, as in `day@Europe/Paris`)';
  }
  if (zone === undefined || zone === 'UTC') return { span };
  if (!/^[A-Za-z0-9/_+-]{1,64}$/.test(zone)) {
    throw `quota period \`${s}\`: \`${zone}\` is not an IANA time zone name`;
  }
  return { span, zone };
}

const HOUR = 3_600_000;
const DAY = 24 * HOUR;

/**
 * The window of `period` that holds `unixMs`: its start and its end (the next window's start), in
 * Unix milliseconds. Throws on a zone Node does not know.
 */
export function periodWindow(period: Period, unixMs: number): [number, number] {
  const offset = offsetOf(period);
  // Local civil time, written as if it were UTC, so Date's UTC calendar arithmetic applies.
  const local = new Date(unixMs + offset(unixMs));
  const [y, mo, d, h] = [local.getUTCFullYear(), local.getUTCMonth(), local.getUTCDate(), local.getUTCHours()];
  let start: number;
  let next: number;
  switch (period.span) {
    case 'hour':
      start = Date.UTC(y, mo, d, h);
      next = start + HOUR;
      break;
    case 'day':
      start = Date.UTC(y, mo, d);
      next = start + DAY;
      break;
    case 'week': {
      const back = (local.getUTCDay() + 6) % 7; // days since Monday
      start = Date.UTC(y, mo, d - back);
      next = start + 7 * DAY;
      break;
    }
    case 'month':
      start = Date.UTC(y, mo, 1);
      next = Date.UTC(y, mo + 1, 1);
      break;
  }
  const [s, e] = [instant(start, offset), instant(next, offset)];
  // An hour that a transition cuts short or stretches still holds `unixMs`.
  return [Math.min(s, unixMs), Math.max(e, unixMs + 1)];
}

/** The zone's offset from UTC at an instant, in milliseconds. */
function offsetOf(period: Period): (unixMs: number) => number {
  if (period.zone === undefined) return () => 0;
  let format: Intl.DateTimeFormat;
  try {
    format = new Intl.DateTimeFormat('en-US', {
      timeZone: period.zone,
      hourCycle: 'h23',
      year: 'numeric',
      month: 'numeric',
      day: 'numeric',
      hour: 'numeric',
      minute: 'numeric',
      second: 'numeric',
    });
  } catch {
    throw `quota period \`${period.span}@${period.zone}\`: unknown time zone`;
  }
  return (unixMs) => {
    const parts: Record<string, number> = {};
    for (const p of format.formatToParts(new Date(unixMs))) parts[p.type] = Number(p.value);
    const asUtc = Date.UTC(parts.year!, parts.month! - 1, parts.day!, parts.hour!, parts.minute!, parts.second!);
    return asUtc - (unixMs - (((unixMs % 1000) + 1000) % 1000));
  };
}

/**
 * The instant of a local civil time (written as UTC). A time the zone skips (a spring-forward gap)
 * is moved forward by the gap; one it repeats is its first occurrence: jiff's `compatible`, as the
 * host does.
 */
function instant(local: number, offset: (unixMs: number) => number): number {
  // The offsets in force a day either side bracket any single transition near `local`.
  const before = offset(local - DAY);
  const after = offset(local + DAY);
  const fits = [before, after].filter((o) => offset(local - o) === o);
  if (fits.length === 0) return local - before; // in a gap
  return local - Math.max(...fits); // the earlier instant when both fit
}
