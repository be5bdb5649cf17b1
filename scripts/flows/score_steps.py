#!/usr/bin/env python3
"""Per-rank table of `whyslow flows analyze --format json` against a truth.json
written by timeline_to_flows.py: rank | steps found / true | mean period found
vs true | error %. A rank can show at most steps_true - 1 complete steps (a
step spans two consecutive step ends).

    score_steps.py report.json truth.json [--max-err 0.3]
Exit 1 when a rank's step count is off by more than one or its period error
exceeds --max-err (%)."""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("report")
    p.add_argument("truth")
    p.add_argument("--max-err", type=float, default=0.3)
    a = p.parse_args()
    rep = json.load(open(a.report))
    truth = json.load(open(a.truth))["ranks"]
    found = {r["address"]: r for r in rep["ranks"]}
    bad = 0
    print("| rank | address | stage | steps found / true | mean period found vs true (s) | error % |")
    print("|---|---|---|---|---|---|")
    for addr, t in sorted(truth.items(), key=lambda kv: kv[1]["rank"]):
        r = found.get(addr)
        n = len(r["steps"]) if r else 0
        per = r.get("mean_step_us") if r else None
        err = abs(per - t["mean_period_us"]) / t["mean_period_us"] * 100 if per else float("inf")
        ok = abs(n - (t["steps_true"] - 1)) <= 1 and err <= a.max_err
        bad += not ok
        per_s = f"{per / 1e6:.3f}" if per else "-"
        print(f"| {t['rank']} | {addr} | {t['stage']} | {n} / {t['steps_true']} | "
              f"{per_s} vs {t['mean_period_us'] / 1e6:.3f} | {err:.3f}{'' if ok else '  FAIL'} |")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
