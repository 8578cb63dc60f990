/*
 * http.c — the HTTP side of `qwenrt serve` (server.h): libmicrohttpd daemon, routing, auth,
 * body limits, request parsing into jobs, JSON and server-sent-event responses, the request
 * log line and metrics.
 *
 * Per connection (thread-per-connection mode) the access handler is called first with the
 * headers, then with body pieces, then once more to answer: struct req_ctx accumulates the
 * body (beyond max_body it is counted, dropped and answered 413; a Content-Length over the
 * limit is answered at once). Non-streaming generation blocks the handler until the job ends;
 * streaming returns a callback response whose reader blocks until the job has text. The
 * completion callback writes the log line, counts the request and frees the context; a job
 * whose client went away is cancelled there too (its slot is freed at the next scheduler step).
 */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timer.h"
#include "chat_page.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/scheduler.h"
#include "server/stream.h"
#include "server/tokens.h"
#include "server/tool_calls.h"
#include "tools/textgen.h"

struct server {
    struct server_params p;
    struct qwenrt_model *model; /* borrowed */
    struct tokenizer *tok;
    struct sched *sched;
    struct metrics metrics;
    struct oai_limits lim;
    struct MHD_Daemon *daemon;
    int port;
    long long created; /* the model's "created" in /v1/models */
    pthread_mutex_t mu;
    uint64_t next_id; /* request ids, under mu */
    bool stopping;    /* under mu */
    int streams;      /* event streams not yet freed by MHD, under mu (shutdown waits) */
    pthread_cond_t streams_cv;
};

struct req_ctx {
    struct server *srv;
    char *body;
    size_t len, cap;
    bool too_large;
    double t0;
    int status;           /* answered HTTP status */
    const char *endpoint; /* metrics label */
    char method[8];
    char path[96];
    char client[64];
    struct job *job; /* generation requests */
    struct job *more[OAI_JOBS_MAX - 1]; /* the other answers' jobs: choices 1.. of prompt 0,
                                           then every choice of prompt 1, ... */
    int n_more;
    int per_prompt; /* choices per prompt ("n") */
    bool stream;
};

struct server_params server_default_params(void)
{
    return (struct server_params){.host = "127.0.0.1",
                                  .port = 8080,
                                  .model_id = "qwenrt",
                                  .n_parallel = 4,
                                  .n_ctx = 4096,
                                  .queue_max = 64,
                                  .cache_bytes = 256u << 20,
                                  .max_tokens = 2048,
                                  .top_k = 40,
                                  .max_prompt = 0,
                                  .max_body = 4u << 20,
                                  .timeout_s = 60,
                                  .max_connections = 512,
                                  .log_requests = true};
}

/* ------------------------------------------------------------------ responses */

static enum MHD_Result send_buf(struct req_ctx *rc, struct MHD_Connection *c, int status,
                                const char *ctype, const char *buf, size_t len,
                                enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)buf, mode);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    if (status == 429)
        MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    rc->status = status;
    return ok;
}

/* Sends a JSON body we own (xmalloc'd; freed here). */
static enum MHD_Result send_json(struct req_ctx *rc, struct MHD_Connection *c, int status,
                                 char *json)
{
    if (!json)
        return send_buf(rc, c, 500, "application/json",
                        "{\"error\":{\"message\":\"out of "
                        "memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}",
                        84, MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ok =
        send_buf(rc, c, status, "application/json", json, strlen(json), MHD_RESPMEM_MUST_COPY);
    xfree(json);
    return ok;
}

static enum MHD_Result send_error(struct req_ctx *rc, struct MHD_Connection *c,
                                  const struct oai_error *e)
{
    return send_json(rc, c, e->status, oai_error_json(e));
}

static enum MHD_Result fail(struct req_ctx *rc, struct MHD_Connection *c, int status,
                            const char *type, const char *code, const char *msg)
{
    struct oai_error e;
    oai_fail(&e, status, type, code, NULL, "%s", msg);
    return send_error(rc, c, &e);
}

/* ------------------------------------------------------------------ simple endpoints */

static enum MHD_Result get_models(struct req_ctx *rc, struct MHD_Connection *c, const char *one)
{
    struct server *s = rc->srv;
    json_t *m = json_pack("{s:s,s:s,s:I,s:s}", "id", s->p.model_id, "object", "model", "created",
                          s->created, "owned_by", "qwenrt");
    if (one && strcmp(one, s->p.model_id)) {
        json_decref(m);
        return fail(rc, c, 404, "invalid_request_error", "model_not_found",
                    "The model does not exist");
    }
    json_t *root = one ? m : json_pack("{s:s,s:[o]}", "object", "list", "data", m);
    char *txt = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    char *out = txt ? xstrdup(txt) : NULL;
    free(txt);
    return send_json(rc, c, 200, out);
}

/* POST /tokenize, /detokenize (tokens.h). */
static enum MHD_Result post_tokens(struct req_ctx *rc, struct MHD_Connection *c, bool encode)
{
    struct oai_error e;
    char *json = NULL;
    if (rc->too_large)
        return fail(rc, c, 413, "invalid_request_error", "request_too_large",
                    "the request body is larger than the server accepts");
    const char *body = rc->body ? rc->body : "";
    bool ok = encode ? tokens_tokenize(rc->srv->tok, body, rc->len, &json, &e)
                     : tokens_detokenize(rc->srv->tok, body, rc->len, &json, &e);
    return ok ? send_json(rc, c, 200, json) : send_error(rc, c, &e);
}

static enum MHD_Result get_metrics(struct req_ctx *rc, struct MHD_Connection *c)
{
    size_t len = 0;
    char *txt = metrics_render(&rc->srv->metrics, &len);
    if (!txt)
        return fail(rc, c, 500, "server_error", NULL, "out of memory");
    enum MHD_Result ok =
        send_buf(rc, c, 200, "text/plain; version=0.0.4", txt, len, MHD_RESPMEM_MUST_COPY);
    xfree(txt);
    return ok;
}

static bool server_stopping(struct server *s)
{
    pthread_mutex_lock(&s->mu);
    bool st = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ------------------------------------------------------------------ generation */

static void make_meta(struct server *s, enum oai_kind kind, struct oai_meta *m)
{
    pthread_mutex_lock(&s->mu);
    uint64_t id = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    m->kind = kind;
    m->index = 0;
    m->tools = false;
    m->created = (long long)time(NULL);
    m->model = s->p.model_id;
    snprintf(m->id, sizeof(m->id), "%s-%llx%08llx", kind == OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)m->created, (unsigned long long)id);
}

/* The whole response of one finished job (one choice), logprobs attached. */
static char *job_response(struct server *s, const struct oai_meta *meta, struct job *j)
{
    struct oai_usage u = job_usage(j);
    char *json = oai_response_json(meta, j->out, j->out_len, job_finish_name(j->finish), &u);
    if (json && j->logprobs && !oai_attach_logprobs(&json, meta->kind, j->lp, j->n_lp, s->tok, NULL)) {
        xfree(json);
        json = NULL;
    }
    return json;
}

/* Non-streaming: waits for the end of the job (of every choice's job) and answers with the
 * whole text. */
static enum MHD_Result answer_whole(struct req_ctx *rc, struct MHD_Connection *c,
                                    const struct oai_meta *meta)
{
    struct job *jobs[OAI_JOBS_MAX];
    int n = 1 + rc->n_more;
    jobs[0] = rc->job;
    memcpy(jobs + 1, rc->more, (size_t)rc->n_more * sizeof(jobs[0]));
    /* the idle timeout is for clients, not for our own queue and generation time */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&jobs[i]->mu);
        while (jobs[i]->finish == JOB_RUNNING)
            pthread_cond_wait(&jobs[i]->cv, &jobs[i]->mu);
        pthread_mutex_unlock(&jobs[i]->mu); /* the scheduler is done with out/finish now */
    }
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)rc->srv->p.timeout_s);
    for (int i = 0; i < n; i++) {
        struct job *j = jobs[i];
        if (j->finish == JOB_CANCELLED && !j->error[0])
            return MHD_NO; /* the client went away */
        if (j->finish == JOB_ERROR || j->finish == JOB_CANCELLED) {
            int st = j->finish == JOB_CANCELLED ? 503 : 500;
            return fail(rc, c, st, "server_error", NULL, j->error);
        }
    }
    char *json[OAI_JOBS_MAX] = {NULL};
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        struct oai_meta mi = *meta;
        mi.index = i; /* tool call ids stay unique across the choices */
        ok = (json[i] = job_response(rc->srv, &mi, jobs[i])) != NULL;
    }
    char *all = NULL;
    int32_t prompt_tokens = 0; /* each prompt once */
    for (int i = 0; i < n; i += rc->per_prompt > 0 ? rc->per_prompt : 1)
        prompt_tokens += jobs[i]->n_prompt;
    if (ok && n > 1)
        all = oai_merge_choices(json, n, prompt_tokens);
    else if (ok)
        all = json[0], json[0] = NULL;
    for (int i = 0; i < n; i++)
        xfree(json[i]);
    return send_json(rc, c, 200, all);
}

static void stream_done(void *user) /* stream_params.on_free: shutdown waits for streams */
{
    struct server *srv = user;
    pthread_mutex_lock(&srv->mu);
    srv->streams--;
    pthread_cond_broadcast(&srv->streams_cv);
    pthread_mutex_unlock(&srv->mu);
}

static enum MHD_Result answer_stream(struct req_ctx *rc, struct MHD_Connection *c,
                                     const struct oai_meta *meta, bool include_usage)
{
    struct job *jobs[OAI_JOBS_MAX];
    int n = 1 + rc->n_more;
    jobs[0] = rc->job;
    memcpy(jobs + 1, rc->more, (size_t)rc->n_more * sizeof(jobs[0]));
    struct stream_params p = {.tok = rc->srv->tok,
                              .keepalive_s = rc->srv->p.timeout_s > 2 ? rc->srv->p.timeout_s / 2 : 1,
                              .include_usage = include_usage,
                              .per_prompt = rc->per_prompt > 0 ? rc->per_prompt : 1,
                              .on_free = stream_done,
                              .user = rc->srv};
    pthread_mutex_lock(&rc->srv->mu);
    rc->srv->streams++;
    pthread_mutex_unlock(&rc->srv->mu);
    struct MHD_Response *r = stream_response(jobs, n, meta, &p);
    if (!r)
        return MHD_NO;
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    rc->status = 200;
    return ok;
}

static int client_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Tokenizes, checks the limits, builds the job. false fills e. */
/* The ids of a prompt text, within the server's prompt limit. false fills e. */
static bool tokenize_prompt(struct server *s, const struct oai_request *req, const char *text,
                            int32_t **ids, size_t *n, struct oai_error *e)
{
    struct qwenrt_error err = {0};
    *ids = NULL, *n = 0;
    if (tokenizer_encode(s->tok, text, strlen(text), ids, n, &err))
        return oai_fail(e, 500, "server_error", NULL, NULL, "%s", err.message);
    int32_t max_prompt =
        s->p.max_prompt > 0 && s->p.max_prompt < s->p.n_ctx - 1 ? s->p.max_prompt : s->p.n_ctx - 1;
    if (!*n || (int64_t)*n > max_prompt) {
        xfree(*ids);
        *ids = NULL;
        return oai_fail(e, 400, "invalid_request_error", *n ? "context_length_exceeded" : NULL,
                        req->kind == OAI_CHAT ? "messages" : "prompt",
                        "the prompt has %zu tokens; this server takes 1 to %d", *n, max_prompt);
    }
    return true;
}

/* max_tokens for a prompt of n tokens: what fits in the context. */
static int32_t max_tokens_for(const struct server *s, int32_t want, size_t n)
{
    return want > s->p.n_ctx - (int32_t)n ? s->p.n_ctx - (int32_t)n : want;
}

static bool make_job(struct server *s, struct oai_request *req, struct job **out,
                     struct oai_error *e)
{
    int32_t *ids = NULL;
    size_t n = 0;
    *out = NULL;
    if (!tokenize_prompt(s, req, req->prompt, &ids, &n, e))
        return false;
    struct job *j = job_new(ids, (int32_t)n);
    if (!j) {
        xfree(ids);
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    j->sp = req->sp;
    j->bias = req->bias; /* moves ownership (j->sp.logit_bias points into it) */
    req->bias = NULL;
    j->chat_json = req->chat_json; /* moves ownership */
    req->chat_json = NULL;
    j->fmt = s->lim.fmt;
    j->logprobs = req->logprobs;
    if (req->echo && !job_echo(j, req->prompt, strlen(req->prompt))) {
        job_release(j);
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    j->tp.max_tokens = max_tokens_for(s, req->max_tokens, n);
    for (int i = 0; i < TEXTGEN_MAX_STOP; i++) {
        j->stops[i] = req->stops[i]; /* moves ownership */
        j->tp.stop[i] = req->stops[i];
        req->stops[i] = NULL;
    }
    *out = j;
    return true;
}

/* A job with j0's settings for the prompt ids (owned; freed on failure) and echo_text: its
 * sampling with seed + k (greedy answers stay equal, as OpenAI's do), logit bias, stops,
 * logprobs, client; max_tokens as given; no next-turn preparation. NULL on OOM. */
static struct job *job_like(struct job *j0, int32_t *ids, int32_t n_ids, const char *echo_text,
                            uint64_t k, int32_t max_tokens)
{
    struct job *j = job_new(ids, n_ids);
    if (!j) {
        xfree(ids);
        return NULL;
    }
    j->sp = j0->sp;
    j->sp.seed = j0->sp.seed + k;
    j->sp.logit_bias = NULL, j->sp.n_logit_bias = 0;
    if (j0->sp.n_logit_bias) {
        j->bias = xmalloc((size_t)j0->sp.n_logit_bias, sizeof(*j->bias));
        if (!j->bias) {
            job_release(j);
            return NULL;
        }
        memcpy(j->bias, j0->bias, (size_t)j0->sp.n_logit_bias * sizeof(*j->bias));
        j->sp.logit_bias = j->bias, j->sp.n_logit_bias = j0->sp.n_logit_bias;
    }
    j->fmt = j0->fmt;
    j->logprobs = j0->logprobs;
    j->tp = j0->tp;
    j->tp.max_tokens = max_tokens;
    j->fd = j0->fd;
    j->t_arrival = j0->t_arrival;
    bool ok = !j0->echo || job_echo(j, echo_text, strlen(echo_text));
    for (int k = 0; k < TEXTGEN_MAX_STOP; k++) {
        j->stops[k] = j0->stops[k] ? xstrdup(j0->stops[k]) : NULL;
        j->tp.stop[k] = j->stops[k];
        ok = ok && (!j0->stops[k] || j->stops[k]);
    }
    if (!ok) {
        job_release(j);
        return NULL;
    }
    return j;
}

/* Choice i (> 0) of prompt lead's answers: lead's input with seed + i, lead as its leader
 * (scheduler.h: it waits for lead's prompt, then restores it from the prompt cache). NULL on
 * OOM. */
static struct job *job_for_choice(struct job *lead, const char *echo_text, int i)
{
    int32_t *ids = xmalloc((size_t)lead->n_ids, sizeof(int32_t));
    if (!ids)
        return NULL;
    memcpy(ids, lead->ids, (size_t)lead->n_ids * sizeof(int32_t));
    struct job *j = job_like(lead, ids, lead->n_ids, echo_text, (uint64_t)i, lead->tp.max_tokens);
    if (j && !(lead->echo && lead->logprobs)) { /* those process their prompt from scratch */
        pthread_mutex_lock(&lead->mu);
        lead->refs++;
        pthread_mutex_unlock(&lead->mu);
        j->leader = lead;
    }
    return j;
}

/* Every answer's job after rc->job (prompt 0, choice 0): choices 1..n-1 of each prompt, and
 * each further prompt's first choice (seed + prompt x n). false fills e. */
static bool make_more_jobs(struct server *s, struct req_ctx *rc, const struct oai_request *req,
                           struct oai_error *e)
{
    rc->per_prompt = req->n;
    for (int p = 0; p < req->n_prompts; p++) {
        const char *text = p ? req->more_prompts[p - 1] : req->prompt;
        struct job *lead = rc->job;
        if (p > 0) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (!tokenize_prompt(s, req, text, &ids, &n, e))
                return false;
            lead = job_like(rc->job, ids, (int32_t)n, text, (uint64_t)p * (uint64_t)req->n,
                            max_tokens_for(s, req->max_tokens, n));
            if (!(rc->more[rc->n_more++] = lead))
                return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
        for (int i = 1; i < req->n; i++)
            if (!(rc->more[rc->n_more++] = job_for_choice(lead, text, i)))
                return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return true;
}

static enum MHD_Result post_generate(struct req_ctx *rc, struct MHD_Connection *c,
                                     enum oai_kind kind)
{
    struct server *s = rc->srv;
    struct oai_request req;
    struct oai_error e;
    if (rc->too_large)
        return fail(rc, c, 413, "invalid_request_error", "request_too_large",
                    "the request body is larger than the server accepts");
    if (!oai_parse(kind, rc->body ? rc->body : "", rc->len, &s->lim, &req, &e))
        return send_error(rc, c, &e);
    bool ok = make_job(s, &req, &rc->job, &e);
    if (ok) {
        rc->job->fd = client_fd(c);
        rc->job->t_arrival = rc->t0;
    }
    ok = ok && make_more_jobs(s, rc, &req, &e); /* "n" choices of each prompt */
    rc->stream = req.stream;
    bool tools = req.tools;
    bool include_usage = req.include_usage;
    oai_request_free(&req);
    if (!ok)
        return send_error(rc, c, &e);
    int sub = sched_submit(s->sched, rc->job);
    for (int i = 0; !sub && i < rc->n_more; i++)
        if ((sub = sched_submit(s->sched, rc->more[i])) != 0) /* the ones queued go too */
            for (int k = -1; k < i; k++)
                job_cancel(k < 0 ? rc->job : rc->more[k]);
    if (sub == -1)
        return fail(rc, c, 429, "rate_limit_exceeded", "queue_full",
                    "the server is busy: every slot is generating and the queue is full");
    if (sub)
        return fail(rc, c, 503, "server_error", "shutting_down", "the server is shutting down");
    struct oai_meta meta;
    make_meta(s, kind, &meta);
    meta.tools = tools;
    return rc->stream ? answer_stream(rc, c, &meta, include_usage) : answer_whole(rc, c, &meta);
}

/* ------------------------------------------------------------------ routing */

static bool authorized(struct server *s, struct MHD_Connection *c)
{
    if (!s->p.api_key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7))
        return false;
    const char *k = h + 7, *want = s->p.api_key;
    size_t lk = strlen(k), lw = strlen(want);
    unsigned diff = (unsigned)(lk != lw);
    for (size_t i = 0; i < lw; i++)
        diff |= (unsigned)(want[i] ^ (i < lk ? k[i] : 0)); /* constant time in the key */
    return !diff;
}

static enum MHD_Result route(struct req_ctx *rc, struct MHD_Connection *c, const char *url,
                             const char *method)
{
    struct server *s = rc->srv;
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(method, "OPTIONS")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        enum MHD_Result ok = MHD_queue_response(c, 204, r);
        MHD_destroy_response(r);
        rc->status = 204;
        return ok;
    }
    bool chat = !strcmp(url, "/v1/chat/completions"), compl = !strcmp(url, "/v1/completions");
    bool models = !strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11);
    bool tokz = !strcmp(url, "/tokenize"), detokz = !strcmp(url, "/detokenize");
    rc->endpoint = chat                       ? "chat"
                   : compl                    ? "completions"
                   : tokz                     ? "tokenize"
                   : detokz                   ? "detokenize"
                   : models                   ? "models"
                   : !strcmp(url, "/health")  ? "health"
                   : !strcmp(url, "/metrics") ? "metrics"
                   : !strcmp(url, "/")        ? "page"
                                              : "other";
    if ((!strncmp(url, "/v1/", 4) || !strcmp(url, "/metrics") || tokz || detokz) && !authorized(s, c))
        return fail(rc, c, 401, "invalid_request_error", "invalid_api_key",
                    "missing or wrong API key (expected 'Authorization: Bearer KEY')");
    if (chat || compl ) {
        if (!post)
            return fail(rc, c, 405, "invalid_request_error", "method_not_allowed",
                        "use POST for this endpoint");
        if (server_stopping(s))
            return fail(rc, c, 503, "server_error", "shutting_down", "the server is shutting down");
        return post_generate(rc, c, chat ? OAI_CHAT : OAI_COMPLETION);
    }
    if (tokz || detokz) {
        if (!post)
            return fail(rc, c, 405, "invalid_request_error", "method_not_allowed",
                        "use POST for this endpoint");
        return post_tokens(rc, c, tokz);
    }
    if (strcmp(rc->endpoint, "other") && !get)
        return fail(rc, c, 405, "invalid_request_error", "method_not_allowed",
                    "use GET for this endpoint");
    if (models)
        return get_models(rc, c, url[10] == '/' ? url + 11 : NULL);
    if (!strcmp(rc->endpoint, "health")) {
        bool stop = server_stopping(s);
        const char *b = stop ? "{\"status\":\"shutting down\"}" : "{\"status\":\"ok\"}";
        return send_buf(rc, c, stop ? 503 : 200, "application/json", b, strlen(b),
                        MHD_RESPMEM_PERSISTENT);
    }
    if (!strcmp(rc->endpoint, "metrics"))
        return get_metrics(rc, c);
    if (!strcmp(rc->endpoint, "page"))
        return send_buf(rc, c, 200, "text/html; charset=utf-8", (const char *)chat_page_html,
                        sizeof(chat_page_html), MHD_RESPMEM_PERSISTENT);
    return fail(rc, c, 404, "invalid_request_error", "not_found", "no such endpoint");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    struct server *s = cls;
    struct req_ctx *rc = *con_cls;
    (void)version;
    if (!rc) {
        if (!(rc = xcalloc(1, sizeof(*rc))))
            return MHD_NO;
        rc->srv = s;
        rc->t0 = time_now_s();
        rc->endpoint = "other";
        snprintf(rc->method, sizeof(rc->method), "%s", method);
        snprintf(rc->path, sizeof(rc->path), "%s", url);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr)
            getnameinfo(ci->client_addr, sizeof(struct sockaddr_storage), rc->client,
                        sizeof(rc->client), NULL, 0, NI_NUMERICHOST);
        *con_cls = rc;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body) {
            rc->too_large = true; /* answer now, without reading the body */
            return fail(rc, c, 413, "invalid_request_error", "request_too_large",
                        "the request body is larger than the server accepts");
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!rc->too_large && rc->len + *upload_size <= s->p.max_body) {
            if (rc->len + *upload_size + 1 > rc->cap) {
                size_t cap = (rc->len + *upload_size + 1) * 2;
                char *b = xrealloc(rc->body, cap, 1);
                if (!b)
                    return MHD_NO;
                rc->body = b;
                rc->cap = cap;
            }
            memcpy(rc->body + rc->len, upload, *upload_size);
            rc->len += *upload_size;
            rc->body[rc->len] = '\0';
        } else {
            rc->too_large = true;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (rc->status)
        return MHD_YES; /* answered already (413 before the body) */
    return route(rc, c, url, method);
}

static void log_line(struct req_ctx *rc, double dt)
{
    char ts[32], extra[256] = "";
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
    struct job *j = rc->job;
    if (j) {
        pthread_mutex_lock(&j->mu);
        static const char *names[] = {"running", "eos", "length", "stop", "cancelled", "error"};
        snprintf(extra, sizeof(extra),
                 " prompt=%d cached=%d completion=%d ttft_ms=%.1f finish=%s stream=%d", j->n_prompt,
                 j->n_cached, j->n_gen, j->t_first ? (j->t_first - rc->t0) * 1e3 : 0,
                 names[j->finish], rc->stream);
        pthread_mutex_unlock(&j->mu);
    }
    fprintf(stderr, "%s %s \"%s %s\" %d %.1fms%s\n", ts, rc->client[0] ? rc->client : "-",
            rc->method, rc->path, rc->status, dt * 1e3, extra);
    fflush(stderr);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct server *s = cls;
    struct req_ctx *rc = *con_cls;
    (void)c;
    if (!rc)
        return;
    double dt = time_now_s() - rc->t0;
    if (rc->job && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        job_cancel(rc->job); /* the client left: free its slot */
    for (int i = 0; i < rc->n_more; i++) {
        if (rc->more[i] && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            job_cancel(rc->more[i]);
        job_release(rc->more[i]);
    }
    if (!rc->status)
        rc->status = 499; /* closed before an answer (nginx's convention) */
    metrics_count_request(&s->metrics, rc->endpoint, rc->status);
    metrics_observe(&s->metrics, &s->metrics.request_s, dt);
    if (s->p.log_requests)
        log_line(rc, dt);
    job_release(rc->job);
    xfree(rc->body);
    xfree(rc);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls, (void)fmt, (void)ap; /* connection-level noise (resets, timeouts) is not logged */
}

/* ------------------------------------------------------------------ lifecycle */

static qwenrt_status start_daemon(struct server *s, struct qwenrt_error *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE},
                    *ai = NULL;
    char port[16];
    snprintf(port, sizeof(port), "%d", s->p.port);
    int gai = getaddrinfo(s->p.host, port, &hints, &ai);
    if (gai)
        return err_set(err, QWENRT_ERR_IO, "serve: cannot resolve host '%s': %s", s->p.host,
                       gai_strerror(gai));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)s->p.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)s->p.timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->p.max_connections,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon)
        return err_set(err, QWENRT_ERR_IO,
                       "serve: cannot listen on %s:%d (in use, or no "
                       "permission)",
                       s->p.host, s->p.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->p.port;
    return QWENRT_OK;
}

qwenrt_status server_start(struct qwenrt_model *model, const struct server_params *p,
                           struct server **out, struct qwenrt_error *err)
{
    *out = NULL;
    struct server *s = xcalloc(1, sizeof(*s));
    if (!s)
        return err_set(err, QWENRT_ERR_NOMEM, "serve: out of memory");
    s->p = *p;
    s->model = model;
    s->created = (long long)time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->streams_cv, NULL);
    metrics_init(&s->metrics);
    qwenrt_status st = textgen_load_tokenizer(model, &s->tok, err);
    if (st)
        goto out_free;
    const char *warning = NULL;
    struct qwenrt_model_info info;
    qwenrt_model_get_info(model, &info);
    s->lim =
        (struct oai_limits){.model_id = p->model_id,
                            .max_tokens = p->max_tokens,
                            .top_k = p->top_k,
                            .n_vocab = info.n_vocab,
                            .fmt = chat_format_detect(tokenizer_chat_template(s->tok), &warning)};
    if (warning)
        fprintf(stderr, "qwenrt: %s\n", warning);
    struct sched_params sp = {.n_parallel = p->n_parallel,
                              .n_ctx = p->n_ctx,
                              .n_threads = p->n_threads,
                              .queue_max = p->queue_max,
                              .cache_bytes = p->cache_bytes,
                              .precision = p->precision,
                              .kv_type = p->kv_type};
    if ((st = sched_init(model, s->tok, &sp, &s->metrics, &s->sched, err)))
        goto out_free;
    if ((st = start_daemon(s, err)))
        goto out_free;
    *out = s;
    return QWENRT_OK;
out_free:
    server_stop(s);
    return st;
}

int server_port(const struct server *s)
{
    return s->port;
}

void server_stop(struct server *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    MHD_socket listen_fd = s->daemon ? MHD_quiesce_daemon(s->daemon) : MHD_INVALID_SOCKET;
    sched_shutdown(s->sched); /* ends every job: waiting handlers and streams finish */
    /* let the streams deliver their last events (the shutdown error, [DONE]) before the
     * daemon closes the connections: at most 5 s, for clients that stopped reading */
    pthread_mutex_lock(&s->mu);
    double t_end = time_now_s() + 5.0;
    while (s->streams > 0 && time_now_s() < t_end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->streams_cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    if (s->daemon)
        MHD_stop_daemon(s->daemon); /* closes connections, joins their threads */
    if (listen_fd != MHD_INVALID_SOCKET)
        close(listen_fd); /* quiesce hands the listening socket to us */
    sched_free(s->sched);
    tokenizer_free(s->tok);
    metrics_free(&s->metrics);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->streams_cv);
    xfree(s);
}
