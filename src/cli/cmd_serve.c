/*
 * cmd_serve.c — `qwenrt serve -m MODEL [--host H] [--port P] ...`: the OpenAI-compatible
 * HTTP server (src/server/server.h). Reads the flags, loads the model, starts the server,
 * then waits for SIGINT or SIGTERM (blocked in every thread and taken with sigwait, so no
 * handler and no global flag) and shuts down cleanly: no new connections, running and queued
 * requests cancelled (streams get a final error event), every thread joined, memory freed.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "server/server.h"

static int usage(void)
{
    fprintf(stderr,
            "usage: qwenrt serve -m MODEL [--host ADDR] [--port N] [--api-key KEY]\n"
            "                    [--parallel N] [--ctx-size N] [--cache-mb N] [--queue N]\n"
            "                    [--max-tokens N] [--max-prompt N] [--max-body-kb N]\n"
            "                    [--timeout S] [--top-k K] [--alias NAME] [--threads N]\n"
            "                    [--backend cpu|cuda] [--precision default|exact] [--kv-type default|f32|f16]\n"
            "                    [--profile ID|FILE] [--no-log] [--keep-layer-types]\n"
            "  --host ADDR      address to bind (default 127.0.0.1; 0.0.0.0 for every interface)\n"
            "  --port N         port (default 8080; 0 = any free port, printed at start)\n"
            "  --api-key KEY    require 'Authorization: Bearer KEY' on /v1/* and /metrics\n"
            "  --parallel N     requests generating at once (slots, default 4)\n"
            "  --ctx-size N     context per slot (default 4096)\n"
            "  --cache-mb N     prompt cache budget in MiB (default 256, 0 = off)\n"
            "  --queue N        requests waiting for a slot before 429 (default 64)\n"
            "  --max-tokens N   default and cap of generated tokens per request (default 2048)\n"
            "  --max-prompt N   prompt tokens per request at most (default ctx-size - 1)\n"
            "  --max-body-kb N  request body size at most (default 4096)\n"
            "  --timeout S      close connections idle for S seconds (default 60)\n"
            "  --top-k K        top_k of requests that set none (default 40; 0 = off)\n"
            "  --alias NAME     model name in /v1/models (default: the model file's name)\n"
            "  --precision P    GPU prompt products: default (bf16, as llama.cpp) or exact (f32)\n"
            "  --kv-type T      the KV cache: default (f16 with 16-bit or quantised weights in\n"
            "                   the default precision, on the GPU and on CPUs with AVX2; else\n"
            "                   f32), f32 or f16\n"
            "  --profile P      a runtime profile: kernels, or a CUDA calibration's decode shapes\n"
            "                   (qwenrt calibrate --backend cuda -o P)\n"
            "  --no-log         no request log lines on stderr\n"
            "  --keep-layer-types  where the backend converts some layer matrices to F16 (Q5_K_M\n"
            "                   on cuda), keep the others as stored (less memory, a slower decode)\n");
    return 2;
}

/* The model id: the file or directory name without .gguf. */
static void default_id(const char *path, char *out, size_t n)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    size_t start = len;
    while (start && path[start - 1] != '/')
        start--;
    size_t k = len - start;
    if (k > 5 && !strncmp(path + len - 5, ".gguf", 5))
        k -= 5;
    snprintf(out, n, "%.*s", (int)k, path + start);
}

static int parse_int_opt(int argc, char **argv, int *i, long lo, long hi, long *out)
{
    const char *v = cli_value(argc, argv, i);
    return v && cli_parse_int(argv[*i - 1], v, lo, hi, out) ? 1 : -1;
}

static int parse_server_opt(struct server_params *p, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    long n = 0;
    int r;
    if (!strcmp(a, "--host"))
        return (p->host = cli_value(argc, argv, i)) ? 1 : -1;
    if (!strcmp(a, "--api-key"))
        return (p->api_key = cli_value(argc, argv, i)) ? 1 : -1;
    if (!strcmp(a, "--alias"))
        return (p->model_id = cli_value(argc, argv, i)) ? 1 : -1;
    if (!strcmp(a, "--no-log")) {
        p->log_requests = false;
        return 1;
    }
    static const struct {
        const char *name;
        long lo, hi;
    } ints[] = {
        {"--port", 0, 65535},          {"--parallel", 1, 256},       {"--cache-mb", 0, 1 << 20},
        {"--queue", 1, 1 << 16},       {"--max-tokens", 1, 1 << 22}, {"--max-prompt", 1, 1 << 22},
        {"--max-body-kb", 1, 1 << 20}, {"--timeout", 1, 86400},      {"--top-k", 0, 1 << 30}};
    for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
        if (strcmp(a, ints[k].name))
            continue;
        if ((r = parse_int_opt(argc, argv, i, ints[k].lo, ints[k].hi, &n)) < 0)
            return r;
        switch (k) {
        case 0:
            p->port = (int)n;
            break;
        case 1:
            p->n_parallel = (int)n;
            break;
        case 2:
            p->cache_bytes = (size_t)n << 20;
            break;
        case 3:
            p->queue_max = (int)n;
            break;
        case 4:
            p->max_tokens = (int32_t)n;
            break;
        case 5:
            p->max_prompt = (int32_t)n;
            break;
        case 6:
            p->max_body = (size_t)n << 10;
            break;
        case 7:
            p->timeout_s = (int)n;
            break;
        default:
            p->top_k = (int32_t)n;
            break;
        }
        return 1;
    }
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    struct server_params p = server_default_params();
    char id[256];
    p.model_id = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        }
        int r = cli_parse_model_opt(&mo, argc, argv, &i);
        if (!r)
            r = parse_server_opt(&p, argc, argv, &i);
        if (r < 0)
            return 2;
        if (!r) {
            fprintf(stderr, "qwenrt: serve: unknown option '%s'\n", argv[i]);
            return usage();
        }
    }
    if (!mo.model)
        return usage();
    if (mo.ctx)
        p.n_ctx = mo.ctx;
    p.n_threads = mo.threads;
    p.precision = mo.precision;
    p.kv_type = mo.kv_type;
    if (!p.model_id) {
        default_id(mo.model, id, sizeof(id));
        p.model_id = id;
    }
    /* block the signals before any thread starts, so that only sigwait below takes them */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that hangs up is an error return, not a signal */
    struct qwenrt_model *m = cli_load_model(&mo);
    if (!m)
        return 1;
    struct server *s = NULL;
    struct qwenrt_error err = {0};
    if (server_start(m, &p, &s, &err)) {
        fprintf(stderr, "qwenrt: %s\n", err.message);
        qwenrt_model_free(m);
        return 1;
    }
    fprintf(stderr, "qwenrt: serving '%s' on http://%s:%d (%d slots, context %d, cache %zu MiB)\n",
            p.model_id, p.host, server_port(s), p.n_parallel, p.n_ctx, p.cache_bytes >> 20);
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "qwenrt: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server_stop(s);
    qwenrt_model_free(m);
    fprintf(stderr, "qwenrt: stopped\n");
    return 0;
}
