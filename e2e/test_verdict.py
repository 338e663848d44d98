"""The suite's judgement on made-up records: it must see a duplicate, a gap
and a failed routed request, and pass a clean run. Run: python3 -m unittest
discover e2e (CI does)."""

import unittest

from verdict import duplicated, judge, missed, table

I = 5.0


def every(pod, start, end, step=I):
    t, out = start, []
    while t <= end + 1e-9:
        out.append((round(t, 3), pod))
        t += step
    return out


def fault(kind, start, end, graceful=True):
    return {"kind": kind, "graceful": graceful, "start": start, "end": end}


class Verdict(unittest.TestCase):
    def judge(self, scrapes, faults, requests=()):
        return judge(scrapes, I, faults, lease_duration=15, retry_period=2, requests=requests)

    def test_a_clean_hand_over_passes_with_at_most_one_interval_missed(self):
        # a scrapes until 50, b from 57.5: one interval (55) missed.
        scrapes = every("a", 0, 50) + every("b", 57.5, 100)
        v = self.judge(scrapes, [fault("delete-leader", 49, 60)])
        self.assertEqual(v["failures"], [])
        self.assertEqual(v["totals"]["duplicated"], 0)
        self.assertEqual(v["totals"]["handovers"], 1)
        self.assertEqual(v["faults"][0]["missed"], 1)
        self.assertEqual(v["totals"]["longest_gap"], 7.5)
        # 7.5 s between the two pods' scrapes, one interval of it work.
        self.assertEqual(v["handovers"][0]["without_work"], 2.5)
        self.assertEqual(v["totals"]["graceful_without_work"], {"median": 2.5, "max": 2.5})

    def test_two_pods_scraping_at_once_are_duplicated_intervals(self):
        # b starts while a still scrapes: the Beats bug.
        scrapes = every("a", 0, 50) + every("b", 32.5, 100)
        v = self.judge(scrapes, [fault("delete-leader", 30, 60)])
        self.assertGreater(v["totals"]["duplicated"], 0)
        self.assertTrue(any("duplicated interval" in f for f in v["failures"]), v["failures"])

    def test_a_quick_take_over_right_after_the_last_scrape_is_not_a_duplicate(self):
        scrapes = every("a", 0, 50) + every("b", 50.5, 100)
        self.assertEqual(duplicated(scrapes, I), [])

    def test_a_long_gap_breaks_a_graceful_bound_but_not_a_forced_one(self):
        # 50 -> 71.0: floor((21 - 0.5) / 5) = 4 intervals missed.
        scrapes = every("a", 0, 50) + every("b", 71, 100)
        graceful = self.judge(scrapes, [fault("delete-leader", 49, 75)])
        self.assertEqual(graceful["faults"][0]["missed"], 4)
        self.assertTrue(any("4 intervals missed, bound 1" in f for f in graceful["failures"]), graceful["failures"])
        # Forced: ceil((15 + 2) / 5) + 1 = 5 per hand-over.
        forced = self.judge(scrapes, [fault("force-delete", 49, 75, graceful=False)])
        self.assertEqual(forced["faults"][0]["bound"], 5)
        self.assertEqual(forced["failures"], [])

    def test_a_graceful_fault_that_moved_nothing_may_miss_nothing(self):
        # A follower deleted, and yet a gap on the leader: a defect.
        scrapes = every("a", 0, 40) + every("a", 52, 100)
        v = self.judge(scrapes, [fault("delete-follower", 39, 60)])
        self.assertEqual(v["faults"][0]["handovers"], 0)
        self.assertEqual(v["faults"][0]["bound"], 0)
        self.assertTrue(v["failures"])

    def test_a_hand_over_outside_every_fault_is_unprovoked(self):
        scrapes = every("a", 0, 50) + every("b", 55, 100)
        v = self.judge(scrapes, [fault("delete-leader", 80, 90)])
        self.assertTrue(any("unprovoked" in f for f in v["failures"]), v["failures"])

    def test_failed_routed_requests_break_a_graceful_fault_only(self):
        scrapes = every("a", 0, 50, 0.25) + every("b", 50.25, 100, 0.25)
        requests = [(t, True, p) for t, p in scrapes] + [(50.1, False, None)]
        graceful = judge(scrapes, 1.0, [fault("delete-leader", 49, 60)], 15, 2, requests)
        self.assertTrue(any("routed requests failed" in f for f in graceful["failures"]), graceful["failures"])
        forced = judge(scrapes, 1.0, [fault("force-delete", 49, 60, graceful=False)], 15, 2, requests)
        self.assertEqual(forced["failures"], [])
        self.assertEqual(forced["totals"]["failed_requests"], 1)

    def test_missed_intervals_allow_the_scrape_loops_jitter(self):
        self.assertEqual(missed(5.0, I), 0)
        self.assertEqual(missed(5.4, I), 0)
        self.assertEqual(missed(9.9, I), 1)
        self.assertEqual(missed(10.6, I), 2)

    def test_time_without_cluster_work_counts_graceful_hand_overs_only(self):
        # a -> b graceful (7.5 s apart: 2.5 s), b -> a forced (97.5 -> 120: 17.5 s),
        # a -> b graceful (5.5 s: 0.5 s).
        scrapes = (every("a", 0, 50) + every("b", 57.5, 100) + every("a", 120, 150)
                   + every("b", 155.5, 200))
        faults = [fault("delete-leader", 49, 60), fault("force-delete", 99, 125, graceful=False),
                  fault("handover", 150, 160)]
        v = self.judge(scrapes, faults)
        self.assertEqual([h["without_work"] for h in v["handovers"]], [2.5, 17.5, 0.5])
        self.assertEqual(v["totals"]["graceful_without_work"], {"median": 1.5, "max": 2.5})
        self.assertIn("median 1.5 s, max 2.5 s", table({"prometheus-exec": v}, I))

    def test_the_table_has_a_row_per_fault_kind_and_a_total(self):
        scrapes = every("a", 0, 50) + every("b", 57.5, 100)
        v = self.judge(scrapes, [fault("delete-leader", 49, 60)])
        text = table({"prometheus-exec": v}, I)
        self.assertIn("delete-leader", text)
        self.assertIn("TOTAL", text)


if __name__ == "__main__":
    unittest.main()
