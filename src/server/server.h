/*
 * server.h — `qwenrt serve`: an OpenAI-compatible HTTP/1.1 server on libmicrohttpd.
 *
 * Endpoints: POST /v1/chat/completions and /v1/completions (JSON or server-sent events),
 * GET /v1/models[/ID], /health, /metrics (Prometheus text), / (the chat page). Each connection
 * has its own thread (libmicrohttpd's thread-per-connection mode), which parses, renders and
 * tokenizes its request and hands a job to the scheduler (scheduler.h); a streaming response
 * blocks in its content callback until the scheduler has text for it. Errors use OpenAI's
 * JSON shape and status codes (400 bad request, 401 key, 404 model/path, 405 method, 413 body,
 * 429 queue full, 500 generation failed, 503 shutting down).
 */
#ifndef QWENRT_SERVER_SERVER_H
#define QWENRT_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qwenrt.h"

struct server_params {
    const char *host;     /* address to bind, default "127.0.0.1" */
    int port;             /* 0 = any free port (see server_port) */
    const char *api_key;  /* required as "Authorization: Bearer KEY" on /v1/ and /metrics;
                             NULL = no key */
    const char *model_id; /* name in /v1/models and the "model" field */
    int n_parallel;       /* slots generating at once */
    int32_t n_ctx;        /* context per slot */
    int n_threads;        /* kernel threads per session, 0 = the model's */
    int32_t precision;    /* enum qwenrt_precision of every slot's session */
    int32_t kv_type;      /* enum qwenrt_kv_type of every slot's session */
    int queue_max;        /* requests waiting for a slot before 429 */
    size_t cache_bytes;   /* prompt cache budget, 0 = off */
    int32_t max_tokens;   /* default and cap of generated tokens per request */
    int32_t top_k;        /* top_k of requests that give none (llama-server's 40); 0 = off */
    int32_t max_prompt;   /* prompt tokens per request at most (capped at n_ctx - 1) */
    size_t max_body;      /* request body bytes at most (413 beyond) */
    int timeout_s;        /* idle connection timeout (slow clients), seconds */
    int max_connections;  /* open connections at most */
    bool log_requests;    /* one line per request on stderr */
};

struct server_params server_default_params(void);

struct server;

/* Loads the tokenizer, starts the scheduler and the HTTP daemon. The model is borrowed and
 * must outlive the server. Errors: NOT_FOUND (no tokenizer), IO (cannot bind), NOMEM. */
qwenrt_status server_start(struct qwenrt_model *model, const struct server_params *p,
                           struct server **out, struct qwenrt_error *err);
/* The port actually bound. */
int server_port(const struct server *s);
/* Stops accepting, cancels queued and running requests (streams get a final error event),
 * closes connections, frees everything. NULL is fine. */
void server_stop(struct server *s);

#endif
