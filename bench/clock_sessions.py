#!/usr/bin/env python3
"""clock_sessions.py — lines up `cuda_bench --screen-sessions` rows with the GPU's clock log
(bench/cuda_device_run.sh screen), standard library only:

  clock_sessions.py SESSIONS.log [SESSIONS.log ...] CLOCKS.csv

SESSIONS.log: cuda_bench's table, whose rows carry the time each session ended (UTC).
CLOCKS.csv: `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,
clocks_event_reasons.active --format=csv,noheader -lms 100`.
Prints each session's tok/s beside the SM clock, memory clock, power and temperature sampled
while it ran (from the previous row's end to its own), and the clock-event reasons seen then:
a session that runs slow on a slower clock is the GPU, not the code.
"""
import sys


def seconds(stamp):
    """cuda_bench's '2026-12-05T18:50:40.123456+00:00' or nvidia-smi's '2026/12/05 18:50:40.123'
    -> seconds of the day (both UTC)."""
    hms = stamp.split()[-1].split("T")[-1].split("+")[0]
    h, m, s = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def number(field):
    try:
        return float(field.split()[0])
    except (ValueError, IndexError):
        return None


def read_clocks(path):
    samples = []
    for line in open(path, encoding="utf-8", errors="replace"):
        f = [x.strip() for x in line.split(",")]
        if len(f) < 6 or ":" not in f[0]:
            continue
        try:
            t = seconds(f[0])
        except ValueError:
            continue
        samples.append((t, number(f[1]), number(f[2]), number(f[3]), number(f[4]), f[5]))
    return samples


def read_sessions(path):
    rows = []
    for line in open(path, encoding="utf-8", errors="replace"):
        f = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(f) >= 4 and f[0].isdigit() and ":" in f[1]:
            rows.append((int(f[0]), seconds(f[1]), f[2], float(f[3])))
    return rows


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    clocks = read_clocks(sys.argv[-1])
    for path in sys.argv[1:-1]:
        rows = read_sessions(path)
        print("%s: %d sessions, %d clock samples" % (path, len(rows), len(clocks)))
        print("| session | screen | tok/s | SM MHz | mem MHz | W | C | reasons |")
        start = rows[0][1] - 0.5 if rows else 0
        for session, end, screen, tok_s in rows:
            seen = [c for c in clocks if start <= c[0] <= end]
            reasons = sorted({c[5] for c in seen})
            print("| %d | %s | %.1f | %.0f | %.0f | %.0f | %.0f | %s |" % (
                session, screen, tok_s, mean(c[1] for c in seen), mean(c[2] for c in seen),
                mean(c[3] for c in seen), mean(c[4] for c in seen), " ".join(reasons) or "no samples"))
            start = end


if __name__ == "__main__":
    main()
