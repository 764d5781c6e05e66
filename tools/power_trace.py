#!/usr/bin/env python3
"""Writes the battery trace of a day used by tests/cli/test_power.sh and
docs/power.md (tests/data/power/day.csv): a 2000 mAh device from 100 % at
07:00, one row a minute (seconds,percent,watts), discharging at the rate of
what it does (idle, conversation, camera), charged at lunch (27 % -> 61 %: past t_high, not past its hysteresis;
watts negative) and run down to empty by night; with the readings a real
fuel gauge gives now and then: a -1, a 255, a missing value and a one-row
spike. Deterministic: no randomness.

usage: python3 tools/power_trace.py > tests/data/power/day.csv
"""
WH = 2.0 * 3.7  # 2000 mAh at 3.7 V


def main():
    print("seconds,percent,watts")
    pct, t = 100.0, 0
    # (minutes, watts): the activity of the day, in order
    plan = [(60, 0.35), (90, 1.9), (120, 0.40), (60, 1.2), (30, 0.35)]
    plan += [(60, -2.5)]                       # lunch: on the charger
    plan += [(90, 1.9), (180, 0.45), (120, 1.6), (300, 0.40), (600, 0.9)]
    glitches = {45: "-1", 400: "255", 401: "", 700: "15"}
    minute = 0
    for minutes, watts in plan:
        for _ in range(minutes):
            shown = glitches.get(minute, f"{pct:.2f}")
            print(f"{t},{shown},{watts:g}")
            pct -= watts / 60.0 / WH * 100.0
            pct = max(0.0, min(100.0, pct))
            t += 60
            minute += 1
            if pct <= 0.0:
                print(f"{t},0.00,{watts:g}")
                return


if __name__ == "__main__":
    main()
