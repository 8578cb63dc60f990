#!/usr/bin/env python3
"""cpu_vs_llamacpp.py — qwenrt (bench/cpu_pp_tg.c) against llama-bench on the same GGUF files,
interleaved on this shared 2-core machine, medians; writes bench/results/cpu-<model>.json.

Each round runs every lane once per model (pp P and tg N in one process each, one warm-up
inside), and the lane order rotates from round to round so that drift in the machine's load
hits every lane alike. Lanes: qwenrt with libgomp's default wait policy, qwenrt with
OMP_WAIT_POLICY=active (what llama.cpp's spinning thread pool does), optionally an older qwenrt
binary (--old), and llama-bench. Load average is recorded before every run.

  cc -O2 -fopenmp -Iinclude -Isrc bench/cpu_pp_tg.c build-x/libqwenrt.a \\
     $(pkg-config --libs jansson libutf8proc) -lcrypto -lm -o /tmp/cpu_pp_tg
  bench/cpu_vs_llamacpp.py --qwenrt /tmp/cpu_pp_tg --rounds 3 MODEL.gguf...
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LLAMA_BENCH = "/work/ext/llama.cpp-new/build/bin/llama-bench"


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_qwenrt(binary, model, p, n, threads, env_extra):
    env = dict(os.environ, **env_extra)
    out = subprocess.run([binary, model, str(p), str(n), str(threads), "1"], env=env,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["pp_median"], r["tg_median"]


def run_llama(model, p, n, threads):
    out = subprocess.run([LLAMA_BENCH, "-m", model, "-p", str(p), "-n", str(n), "-t",
                          str(threads), "-r", "1", "-o", "json"], capture_output=True, text=True,
                         timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip()[-500:])
    pp = tg = None
    for t in json.loads(out.stdout):
        if t["n_prompt"] == p and t["n_gen"] == 0:
            pp = t["avg_ts"]
        if t["n_gen"] == n and t["n_prompt"] == 0:
            tg = t["avg_ts"]
    return pp, tg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwenrt", required=True, help="cpu_pp_tg binary")
    ap.add_argument("--old", help="cpu_pp_tg binary of an older qwenrt (optional lane)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    lanes = [("qwenrt", lambda m: run_qwenrt(a.qwenrt, m, a.p, a.n, a.threads, {})),
             ("qwenrt-active", lambda m: run_qwenrt(a.qwenrt, m, a.p, a.n, a.threads,
                                                    {"OMP_WAIT_POLICY": "active"})),
             ("llama.cpp", lambda m: run_llama(m, a.p, a.n, a.threads))]
    if a.old:
        lanes.insert(2, ("qwenrt-old-active",
                         lambda m: run_qwenrt(a.old, m, a.p, a.n, a.threads,
                                              {"OMP_WAIT_POLICY": "active"})))
    rows = []
    for model in a.models:
        runs = {name: [] for name, _ in lanes}
        for rnd in range(a.rounds):
            order = lanes[rnd % len(lanes):] + lanes[:rnd % len(lanes)]
            for name, fn in order:
                la = loadavg()
                t0 = time.time()
                pp, tg = fn(model)
                runs[name].append({"pp": pp, "tg": tg, "load": la,
                                   "seconds": round(time.time() - t0, 1)})
                print(f"{os.path.basename(model)} round {rnd} {name}: pp {pp:.1f} tg {tg:.2f} "
                      f"(load {la:.2f})", file=sys.stderr, flush=True)
        med = {name: {"pp": statistics.median(r["pp"] for r in rs),
                      "tg": statistics.median(r["tg"] for r in rs)} for name, rs in runs.items()}
        rec = {"model": model, "p": a.p, "n": a.n, "threads": a.threads, "rounds": a.rounds,
               "llama_bench": LLAMA_BENCH, "runs": runs, "medians": med,
               "cpu": "2 vCPU, AVX-512 VNNI (shared VM)"}
        base = os.path.basename(model).replace(".gguf", "")
        with open(os.path.join(a.out_dir, f"cpu-{base}.json"), "w") as f:
            json.dump(rec, f, indent=1)
        rows.append((base, med))
    names = [n for n, _ in lanes]
    print("| model | " + " | ".join(f"{n} pp{a.p} / tg{a.n}" for n in names) +
          " | ratio pp / tg (qwenrt-active / llama.cpp) |")
    print("|---" * (len(names) + 2) + "|")
    for base, med in rows:
        cells = [f"{med[n]['pp']:.1f} / {med[n]['tg']:.2f}" for n in names]
        rp = med["qwenrt-active"]["pp"] / med["llama.cpp"]["pp"]
        rt = med["qwenrt-active"]["tg"] / med["llama.cpp"]["tg"]
        print(f"| {base} | " + " | ".join(cells) + f" | {rp:.2f} / {rt:.2f} |")


if __name__ == "__main__":
    main()
