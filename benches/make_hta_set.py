"""Builds a multi-rank Kineto trace set for the HTA comparison by replaying a
real single-rank trace as N ranks (distributedInfo.rank rewritten).
Usage: python benches/make_hta_set.py SRC.json.gz OUT_DIR N"""
import gzip
import json
import os
import sys

src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with gzip.open(src, "rt") as f:
    trace = json.load(f)
os.makedirs(out, exist_ok=True)
for r in range(n):
    trace.setdefault("distributedInfo", {})["rank"] = r
    with gzip.open(os.path.join(out, f"rank-{r}.json.gz"), "wt", compresslevel=1) as f:
        json.dump(trace, f)
