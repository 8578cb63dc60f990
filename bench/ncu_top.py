#!/usr/bin/env python3
"""ncu_top.py — the hottest rows of an Nsight Compute source-page CSV (ncu --page source --csv):
sorted by warp-stall samples, with each row's share and its largest stall columns.
Usage: ncu_top.py FILE.csv [N]"""
import csv
import sys


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return None


def main():
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(path, newline="", errors="replace") as f:
        rows = [r for r in csv.reader(f)]
    head_i = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
    if head_i is None:
        print(f"{path}: no sampling columns; first lines:")
        for r in rows[:8]:
            print("  ", ",".join(r)[:200])
        return
    head = rows[head_i]
    body = [r for r in rows[head_i + 1:] if len(r) == len(head)]
    key = next((i for i, c in enumerate(head) if "Sampling (All" in c), None)
    if key is None:
        key = next(i for i, c in enumerate(head) if "Sampling" in c)
    text = [i for i, c in enumerate(head) if c in ("#", "Line", "Address", "Source")]
    stall_cols = [i for i, c in enumerate(head) if c.lower().startswith("stall") or "stall_" in c.lower()]
    total = sum(num(r[key]) or 0 for r in body) or 1
    print(f"== {path}: {len(body)} rows, column '{head[key]}', total {total:.0f}")
    print("   stall columns:", ", ".join(head[i] for i in stall_cols)[:300])
    body.sort(key=lambda r: -(num(r[key]) or 0))
    for r in body[:n]:
        v = num(r[key]) or 0
        top = sorted(((num(r[i]) or 0, head[i]) for i in stall_cols), reverse=True)[:3]
        tops = " ".join(f"{name}={val:.0f}" for val, name in top if val > 0)
        label = " | ".join(r[i].strip()[:90] for i in text)
        print(f"{100 * v / total:5.1f}% {label}  [{tops}]")


if __name__ == "__main__":
    main()
