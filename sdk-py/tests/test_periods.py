import unittest
from datetime import datetime

from slotgate_policy import periods


def ms(iso):
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def win(period, at):
    return periods.window(period, ms(at))


def have_zone(name):
    try:
        from zoneinfo import ZoneInfo

        ZoneInfo(name)
        return True
    except Exception:
        return False


class Periods(unittest.TestCase):
    def test_periods_parse(self):
        self.assertEqual(periods.parse_period("day"), ("day", None))
        self.assertEqual(periods.parse_period("day@UTC"), ("day", None))
        self.assertEqual(periods.parse_period("month@America/New_York"), ("month", "America/New_York"))
        for bad in ("", "days", "Day", "day@", "day@Europe Paris", "minute"):
            with self.assertRaises(ValueError, msg=bad):
                periods.parse_period(bad)

    def test_utc_windows_start_and_end_at_their_boundaries(self):
        self.assertEqual(
            win("day", "2026-12-04T23:59:59.999Z"), (ms("2026-12-04T00:00:00Z"), ms("2026-12-05T00:00:00Z"))
        )
        self.assertEqual(win("day", "2026-12-05T00:00:00Z")[0], ms("2026-12-05T00:00:00Z"))
        self.assertEqual(
            win("hour", "2026-12-04T10:42:00Z"), (ms("2026-12-04T10:00:00Z"), ms("2026-12-04T11:00:00Z"))
        )
        # 2026-12-04 is a Friday; ISO weeks start on Monday.
        self.assertEqual(
            win("week", "2026-12-04T12:00:00Z"), (ms("2026-11-30T00:00:00Z"), ms("2026-12-07T00:00:00Z"))
        )
        self.assertEqual(
            win("month", "2026-02-14T12:00:00Z"), (ms("2026-02-01T00:00:00Z"), ms("2026-03-01T00:00:00Z"))
        )
        self.assertEqual(
            win("month", "2026-12-31T23:00:00Z"), (ms("2026-12-01T00:00:00Z"), ms("2027-01-01T00:00:00Z"))
        )

    @unittest.skipUnless(have_zone("Europe/Paris"), "no time zone database")
    def test_zoned_windows_follow_local_time(self):
        # Paris is UTC+1 in December: its day starts at 23:00 UTC.
        self.assertEqual(
            win("day@Europe/Paris", "2026-12-04T23:30:00Z"),
            (ms("2026-12-04T23:00:00Z"), ms("2026-12-05T23:00:00Z")),
        )
        # Europe/Paris springs forward on 2026-03-29 and falls back on 2026-10-25.
        s, e = win("day@Europe/Paris", "2026-03-29T12:00:00Z")
        self.assertEqual(e - s, 23 * 3_600_000)
        s, e = win("day@Europe/Paris", "2026-10-25T12:00:00Z")
        self.assertEqual(e - s, 25 * 3_600_000)

    def test_an_unknown_zone_is_an_error_that_names_it(self):
        with self.assertRaisesRegex(ValueError, "day@Mars/Olympus_Mons"):
            periods.window("day@Mars/Olympus_Mons", 0)


if __name__ == "__main__":
    unittest.main()
