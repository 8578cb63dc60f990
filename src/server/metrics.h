/*
 * metrics.h — the server's counters, gauges and latency histograms, rendered as Prometheus
 * text for GET /metrics. Written by the HTTP threads and the scheduler, under one mutex; the
 * values are plain integers and doubles, no atomics, as updates are a few per request/step.
 */
#ifndef QWENRT_SERVER_METRICS_H
#define QWENRT_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define METRICS_MAX_CODES 48 /* distinct (endpoint, status) pairs counted */
#define METRICS_N_BUCKETS 14 /* latency histogram buckets, the last is +Inf */

struct histogram {
    uint64_t counts[METRICS_N_BUCKETS]; /* observations <= bucket bound (not cumulative) */
    double sum;                         /* sum of all observations, seconds */
    uint64_t n;                         /* observations */
};

struct metrics {
    pthread_mutex_t mu;
    struct {
        char endpoint[32]; /* "chat", "completions", "models", ... */
        int code;          /* HTTP status */
        uint64_t n;
    } requests[METRICS_MAX_CODES];
    int n_requests;
    uint64_t prompt_tokens;            /* prompt tokens of finished requests */
    uint64_t cached_tokens;            /* of which restored from the prompt cache */
    uint64_t completion_tokens;        /* generated tokens */
    uint64_t cache_hits, cache_misses; /* requests that did / did not reuse a cached prefix */
    uint64_t gpu_step_tokens;          /* tokens drawn on the GPU several per submission */
    uint64_t rejected;                 /* 429: queue full */
    uint64_t cancelled;                /* requests whose client went away before the end */
    int64_t queue_depth;               /* gauge: waiting for a slot */
    int64_t slots_busy;                /* gauge: generating */
    int64_t slots_total;               /* gauge: --parallel */
    int64_t cache_entries;             /* gauge: prompt cache checkpoints */
    int64_t cache_bytes;               /* gauge: their bytes */
    struct histogram request_s;        /* whole request, arrival to last byte queued */
    struct histogram ttft_s;           /* arrival to first generated token */
    struct histogram queue_s;          /* arrival to getting a slot */
};

void metrics_init(struct metrics *m);
void metrics_free(struct metrics *m);
void metrics_count_request(struct metrics *m, const char *endpoint, int code);
void metrics_observe(struct metrics *m, struct histogram *h, double seconds);
/* Prometheus text exposition (version 0.0.4); *out is xmalloc'd. NULL on out of memory. */
char *metrics_render(struct metrics *m, size_t *len);

#endif
