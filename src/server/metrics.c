/*
 * metrics.c — counters and histograms of the server and their Prometheus text (metrics.h).
 */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"

static const double bucket_le[METRICS_N_BUCKETS - 1] = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25, 0.5,
                                                        1.0,   2.5,  5.0,   10.0, 30.0, 60.0};

void metrics_init(struct metrics *m)
{
    memset(m, 0, sizeof(*m));
    pthread_mutex_init(&m->mu, NULL);
}

void metrics_free(struct metrics *m)
{
    if (m)
        pthread_mutex_destroy(&m->mu);
}

void metrics_count_request(struct metrics *m, const char *endpoint, int code)
{
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_requests &&
           (m->requests[i].code != code || strcmp(m->requests[i].endpoint, endpoint)))
        i++;
    if (i == m->n_requests && i < METRICS_MAX_CODES) {
        snprintf(m->requests[i].endpoint, sizeof(m->requests[i].endpoint), "%s", endpoint);
        m->requests[i].code = code;
        m->n_requests++;
    }
    if (i < m->n_requests)
        m->requests[i].n++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe(struct metrics *m, struct histogram *h, double seconds)
{
    pthread_mutex_lock(&m->mu);
    int b = 0;
    while (b < METRICS_N_BUCKETS - 1 && seconds > bucket_le[b])
        b++;
    h->counts[b]++;
    h->sum += seconds;
    h->n++;
    pthread_mutex_unlock(&m->mu);
}

struct out {
    char *p;
    size_t n, cap;
    int oom;
};

static void outf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(struct out *o, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !o->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(o->p + o->n, o->cap - o->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            o->oom = 1;
            return;
        }
        if (o->n + (size_t)k < o->cap) {
            o->n += (size_t)k;
            return;
        }
        size_t cap = (o->cap + (size_t)k + 1) * 2;
        char *np = xrealloc(o->p, cap, 1);
        if (!np) {
            o->oom = 1;
            return;
        }
        o->p = np;
        o->cap = cap;
    }
}

static void counter(struct out *o, const char *name, const char *help, uint64_t v)
{
    outf(o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
         (unsigned long long)v);
}

static void gauge(struct out *o, const char *name, const char *help, int64_t v)
{
    outf(o, "# HELP %s %s\n# TYPE %s gauge\n%s %lld\n", name, help, name, name, (long long)v);
}

static void histo(struct out *o, const char *name, const char *help, const struct histogram *h)
{
    outf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < METRICS_N_BUCKETS; b++) {
        cum += h->counts[b];
        if (b < METRICS_N_BUCKETS - 1)
            outf(o, "%s_bucket{le=\"%g\"} %llu\n", name, bucket_le[b], (unsigned long long)cum);
        else
            outf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    outf(o, "%s_sum %.6f\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
}

char *metrics_render(struct metrics *m, size_t *len)
{
    struct out o = {0};
    o.cap = 8192;
    if (!(o.p = xmalloc(o.cap, 1)))
        return NULL;
    o.p[0] = '\0';
    pthread_mutex_lock(&m->mu);
    outf(&o, "# HELP qwenrt_requests_total HTTP requests by endpoint and status.\n"
             "# TYPE qwenrt_requests_total counter\n");
    for (int i = 0; i < m->n_requests; i++)
        outf(&o, "qwenrt_requests_total{endpoint=\"%s\",code=\"%d\"} %llu\n",
             m->requests[i].endpoint, m->requests[i].code, (unsigned long long)m->requests[i].n);
    counter(&o, "qwenrt_prompt_tokens_total", "Prompt tokens of finished requests.",
            m->prompt_tokens);
    counter(&o, "qwenrt_prompt_tokens_cached_total",
            "Prompt tokens restored from the prompt cache instead of processed.", m->cached_tokens);
    counter(&o, "qwenrt_completion_tokens_total", "Generated tokens.", m->completion_tokens);
    counter(&o, "qwenrt_prompt_cache_hits_total", "Requests that reused a cached prefix.",
            m->cache_hits);
    counter(&o, "qwenrt_gpu_step_tokens_total",
            "Tokens drawn on the GPU several per submission (a request alone on a CUDA server).",
            m->gpu_step_tokens);
    counter(&o, "qwenrt_prompt_cache_misses_total", "Requests that found no cached prefix.",
            m->cache_misses);
    counter(&o, "qwenrt_requests_rejected_total", "Requests refused with 429 (queue full).",
            m->rejected);
    counter(&o, "qwenrt_requests_cancelled_total", "Requests whose client went away.",
            m->cancelled);
    gauge(&o, "qwenrt_queue_depth", "Requests waiting for a slot.", m->queue_depth);
    gauge(&o, "qwenrt_slots_busy", "Slots generating.", m->slots_busy);
    gauge(&o, "qwenrt_slots_total", "Slots (--parallel).", m->slots_total);
    gauge(&o, "qwenrt_prompt_cache_entries", "Checkpoints in the prompt cache.", m->cache_entries);
    gauge(&o, "qwenrt_prompt_cache_bytes", "Bytes of the prompt cache.", m->cache_bytes);
    histo(&o, "qwenrt_request_duration_seconds", "Request arrival to its last byte.",
          &m->request_s);
    histo(&o, "qwenrt_time_to_first_token_seconds", "Request arrival to its first token.",
          &m->ttft_s);
    histo(&o, "qwenrt_queue_wait_seconds", "Request arrival to getting a slot.", &m->queue_s);
    pthread_mutex_unlock(&m->mu);
    if (o.oom) {
        xfree(o.p);
        return NULL;
    }
    *len = o.n;
    return o.p;
}
