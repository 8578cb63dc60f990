#!/usr/bin/env python3
"""cuda_serve_check.py — `qwenrt serve --backend cuda` on the GPU machine (issue 8): run by
hand there (bench/cuda_device_run.sh serve), standard library only.

  cuda_serve_check.py QWENRT MODEL.gguf [--parallel 4] [--requests 8] [--backend cuda]
                      [--precision default|exact]

1. The same greedy chat requests (temperature 0) one at a time and all at once: the
   concurrent ones are decoded together (continuous batching on the GPU) and must give the
   same answers. Prints completion tokens/s of both.
2. A two-turn chat: the second request must be served from the prompt cache (usage
   prompt_tokens_details.cached_tokens > 0; checkpoints of CUDA sessions).
3. /metrics has the request and cache counters; SIGTERM ends the server with status 0.
Exit status 0 when every check holds.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def start(qwenrt, model, parallel, backend, precision):
    log = tempfile.NamedTemporaryFile(prefix="qwenrt-serve-", suffix=".log", delete=False)
    proc = subprocess.Popen([qwenrt, "serve", "-m", model, "--backend", backend, "--port", "0",
                             "--parallel", str(parallel), "--precision", precision],
                            stderr=log, stdout=subprocess.DEVNULL)
    for _ in range(600):
        text = open(log.name, encoding="utf-8", errors="replace").read()
        if "serving" in text:
            port = text.split("http://", 1)[1].split(":", 1)[1].split("/", 1)[0].split()[0]
            return proc, "http://127.0.0.1:%d" % int(port.rstrip(".,)")), log.name
        if proc.poll() is not None:
            sys.exit("server exited: " + text)
        time.sleep(0.1)
    proc.kill()
    sys.exit("server did not start")


def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


MODEL = {"id": ""}


def chat(url, messages, max_tokens=24):
    return post(url, {"model": MODEL["id"], "messages": messages, "max_tokens": max_tokens,
                      "temperature": 0})


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    qwenrt, model = args[0], args[1]
    parallel = int(args[args.index("--parallel") + 1]) if "--parallel" in args else 4
    n_req = int(args[args.index("--requests") + 1]) if "--requests" in args else 8
    backend = args[args.index("--backend") + 1] if "--backend" in args else "cuda"
    precision = args[args.index("--precision") + 1] if "--precision" in args else "default"
    proc, url, log = start(qwenrt, model, parallel, backend, precision)
    ok = True
    try:
        models = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=30).read())
        MODEL["id"] = models["data"][0]["id"]
        prompts = ["Tell me something about the number %d." % i for i in range(n_req)]
        msgs = [[{"role": "user", "content": p}] for p in prompts]
        chat(url, msgs[0], 4)  # warm-up
        t0 = time.time()
        alone = [chat(url, m) for m in msgs]
        t_alone = time.time() - t0
        together = [None] * n_req

        def one(i):
            together[i] = chat(url, msgs[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n_req)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_together = time.time() - t0
        toks = sum(r["usage"]["completion_tokens"] for r in alone)
        same = sum(a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
                   for a, b in zip(alone, together))
        print("%s: %d requests, %d completion tokens: one at a time %.1f tok/s, %d at once %.1f tok/s;"
              " same answers %d/%d" % (os.path.basename(model), n_req, toks, toks / t_alone, n_req,
                                       toks / t_together, same, n_req))
        ok &= same == n_req
        r1 = chat(url, msgs[0])
        m2 = msgs[0] + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                        {"role": "user", "content": "And another one?"}]
        r2 = chat(url, m2)
        cached = r2["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        print("two-turn chat: turn 2 prompt %d tokens, %d from the prompt cache" %
              (r2["usage"]["prompt_tokens"], cached))
        ok &= cached > 0
        metrics = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
        keep = [l for l in metrics.splitlines() if l.startswith(("qwenrt_requests_total",
                "qwenrt_prompt_cache_hits_total", "qwenrt_completion_tokens_total"))]
        print("metrics: " + "; ".join(keep))
    except Exception as e:  # a failed request: report it with the server's log below
        print("request failed: %r" % e)
        ok = False
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed after 30 s"
    print("server exit status after SIGTERM: %s" % rc)
    ok &= rc == 0
    if not ok:
        print("server log (end):\n" + open(log, encoding="utf-8", errors="replace").read()[-3000:])
    print("cuda_serve_check: %s" % ("ok" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
