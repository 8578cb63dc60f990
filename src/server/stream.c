/*
 * stream.c — server-sent events of a generation request ("stream": true), stream.h.
 *
 * Every choice has its own job and state (choice_stream: tool-call hold-back, logprobs not yet
 * sent, code-point offsets). libmicrohttpd pulls the body through stream_read; stream_refill
 * waits for text or an end on any choice, formats what came as "data:" events (each chunk
 * names its choice's index), and after the last choice the usage chunk and [DONE].
 */
#include "server/stream.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/timer.h"
#include "server/tool_calls.h"

/* One choice of a stream ("n" > 1: one per choice, each its own job). */
struct choice_stream {
    struct job *job;
    struct oai_meta meta; /* the request's, with this choice's index */
    bool done, tool_calls_sent;
    struct tool_stream ts; /* with tools: the answer so far and how much went out as content */
    struct oai_token_logprob *lp; /* logprobs taken from the job, not yet sent */
    int32_t n_lp, lp_taken;       /* ... how many; how many the job had when last taken */
    int64_t lp_offset;            /* completions: code points of text already covered */
};

struct stream_ctx {
    struct stream_params p; /* tokenizer, keep-alive, usage chunk, choices per prompt */
    bool started, ended;
    int n; /* choices */
    struct choice_stream ch[OAI_JOBS_MAX];
    char *pend; /* formatted events not yet handed to MHD */
    size_t pend_len, pend_off, pend_cap;
};

static bool pend_add(struct stream_ctx *sc, const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = b ? strlen(b) : 0, lc = c ? strlen(c) : 0;
    size_t need = sc->pend_len + la + lb + lc + 1;
    if (need > sc->pend_cap) {
        char *p = xrealloc(sc->pend, need * 2, 1);
        if (!p)
            return false;
        sc->pend = p;
        sc->pend_cap = need * 2;
    }
    memcpy(sc->pend + sc->pend_len, a, la);
    if (b)
        memcpy(sc->pend + sc->pend_len + la, b, lb);
    if (c)
        memcpy(sc->pend + sc->pend_len + la + lb, c, lc);
    sc->pend_len += la + lb + lc;
    return true;
}

/* One "data: JSON\n\n" event from a JSON text we own. */
static bool pend_event(struct stream_ctx *sc, char *json)
{
    bool ok = json && pend_add(sc, "data: ", json, "\n\n");
    xfree(json);
    return ok;
}

const char *job_finish_name(enum job_finish f)
{
    return f == JOB_LENGTH ? "length" : "stop";
}

struct oai_usage job_usage(struct job *j)
{
    return (struct oai_usage){.prompt = j->n_prompt, .cached = j->n_cached, .completion = j->n_gen};
}

/* json with the choice's pending logprobs attached (they are then sent). */
static char *with_logprobs(struct stream_ctx *sc, struct choice_stream *cs, char *json)
{
    if (!json || !cs->n_lp)
        return json;
    if (!oai_attach_logprobs(&json, cs->meta.kind, cs->lp, cs->n_lp, sc->p.tok, &cs->lp_offset)) {
        xfree(json);
        return NULL;
    }
    cs->n_lp = 0;
    return json;
}

/* Takes the job's new logprobs (caller holds j->mu). false: out of memory. */
static bool take_logprobs(struct choice_stream *cs, struct job *j)
{
    int32_t n = j->n_lp - cs->lp_taken;
    if (n <= 0)
        return true;
    struct oai_token_logprob *p = xrealloc(cs->lp, (size_t)(cs->n_lp + n), sizeof(*p));
    if (!p)
        return false;
    memcpy(p + cs->n_lp, j->lp + cs->lp_taken, (size_t)n * sizeof(*p));
    cs->lp = p;
    cs->n_lp += n;
    cs->lp_taken = j->n_lp;
    return true;
}

/* With tools: content that cannot belong to a call goes out at once; at the end the calls
 * go out as one tool_calls chunk (tool_calls.h). */
static bool stream_tools_add(struct stream_ctx *sc, struct choice_stream *cs, const char *text, size_t len,
                             bool last)
{
    const char *content;
    size_t n;
    struct tool_calls tc;
    bool calls;
    if (!tool_stream_add(&cs->ts, text, len, last, &content, &n, &tc, &calls))
        return false;
    bool ok = !n || pend_event(sc, oai_chunk_json(&cs->meta, content, n, false, NULL, NULL));
    if (calls) {
        ok = ok && pend_event(sc, oai_chunk_tool_calls_json(&cs->meta, &tc));
        cs->tool_calls_sent = true;
        tool_calls_free(&tc);
    }
    return ok;
}

static bool choice_ready(struct job *j)
{
    return j->out_len || j->finish != JOB_RUNNING || j->cancel;
}

/* Waits until a choice that has not ended has text or an end. false: keepalive_s passed
 * first. One choice waits on its job's condition variable; several poll every 5 ms (a
 * choice's job wakes the wait early when it is the first one still running). */
static bool stream_wait(struct stream_ctx *sc)
{
    double t_wait = time_now_s();
    for (;;) {
        struct job *first = NULL;
        for (int i = 0; i < sc->n; i++) {
            struct job *j = sc->ch[i].job;
            if (sc->ch[i].done)
                continue;
            pthread_mutex_lock(&j->mu);
            bool ready = choice_ready(j);
            pthread_mutex_unlock(&j->mu);
            if (ready)
                return true;
            first = first ? first : j;
        }
        if (!first || time_now_s() - t_wait >= sc->p.keepalive_s)
            return !first;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long step_ns = sc->n > 1 ? 5000000L : 1000000000L;
        ts.tv_nsec += step_ns;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_mutex_lock(&first->mu);
        if (!choice_ready(first))
            pthread_cond_timedwait(&first->cv, &first->mu, &ts);
        pthread_mutex_unlock(&first->mu);
    }
}

/* What choice cs has now as events: its text, and at its end the finish chunk (an error
 * event instead when its job failed, then *fatal). false: close the connection (the client
 * went away or memory ran out). */
static bool choice_refill(struct stream_ctx *sc, struct choice_stream *cs, bool *fatal)
{
    struct job *j = cs->job;
    pthread_mutex_lock(&j->mu);
    char *text = NULL;
    size_t len = j->out_len;
    if (len && (text = xmalloc(len, 1)))
        memcpy(text, j->out, len);
    j->out_len = 0;
    bool lp_ok = take_logprobs(cs, j);
    enum job_finish fin = j->finish;
    bool client_gone = j->cancel && !j->error[0];
    char errmsg[512];
    snprintf(errmsg, sizeof(errmsg), "%s", j->error);
    pthread_mutex_unlock(&j->mu);
    bool ok = (!len || text) && lp_ok;
    if (ok && len && cs->meta.tools)
        ok = stream_tools_add(sc, cs, text, len, fin != JOB_RUNNING);
    else if (ok && len)
        ok = pend_event(sc, with_logprobs(sc, cs, oai_chunk_json(&cs->meta, text, len, false, NULL, NULL)));
    else if (ok && cs->meta.tools && fin != JOB_RUNNING)
        ok = stream_tools_add(sc, cs, "", 0, true);
    xfree(text);
    if (!ok || fin == JOB_RUNNING)
        return ok;
    if (fin == JOB_CANCELLED && client_gone)
        return false;
    cs->done = true;
    if (fin == JOB_ERROR || fin == JOB_CANCELLED) {
        struct oai_error e;
        oai_fail(&e, 500, "server_error", NULL, NULL, "%s",
                 errmsg[0] ? errmsg : "the request was cancelled");
        *fatal = true;
        return pend_event(sc, oai_error_json(&e));
    }
    const char *fname = cs->tool_calls_sent ? "tool_calls" : job_finish_name(fin);
    return pend_event(sc, with_logprobs(sc, cs, oai_chunk_json(&cs->meta, NULL, 0, false, fname, NULL)));
}

/* Waits for text or the end of a choice; formats what came as events; after the last
 * choice's end (or an error) the usage chunk and [DONE]. false: close the connection. */
static bool stream_refill(struct stream_ctx *sc)
{
    sc->pend_len = sc->pend_off = 0;
    if (!sc->started) {
        sc->started = true;
        bool ok = true;
        for (int i = 0; ok && sc->ch[0].meta.kind == OAI_CHAT && i < sc->n; i++)
            ok = pend_event(sc, oai_chunk_json(&sc->ch[i].meta, "", 0, true, NULL, NULL));
        return ok;
    }
    /* while queued or slow, a comment line every keepalive_s keeps the connection (and
     * proxies in front) from timing out and shows whether the client is still there */
    if (!stream_wait(sc))
        return pend_add(sc, ": keep-alive\n\n", NULL, NULL);
    bool fatal = false, ok = true, all_done = true;
    for (int i = 0; ok && !fatal && i < sc->n; i++)
        if (!sc->ch[i].done)
            ok = choice_refill(sc, &sc->ch[i], &fatal);
    for (int i = 0; i < sc->n; i++)
        all_done = all_done && sc->ch[i].done;
    if (!ok || (!all_done && !fatal))
        return ok;
    sc->ended = true;
    if (!fatal && sc->p.include_usage) {
        struct oai_usage u = job_usage(sc->ch[0].job); /* each prompt counts once */
        for (int i = 1; i < sc->n; i++) {
            struct oai_usage ui = job_usage(sc->ch[i].job);
            u.completion += ui.completion;
            if (sc->p.per_prompt <= 1 || i % sc->p.per_prompt == 0)
                u.prompt += ui.prompt, u.cached += ui.cached;
        }
        ok = pend_event(sc, oai_chunk_json(&sc->ch[0].meta, NULL, 0, false, NULL, &u));
    }
    return ok && pend_add(sc, "data: [DONE]\n\n", NULL, NULL);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream_ctx *sc = cls;
    (void)pos;
    while (sc->pend_off == sc->pend_len) {
        if (sc->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (!stream_refill(sc))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = sc->pend_len - sc->pend_off;
    if (n > max)
        n = max;
    memcpy(buf, sc->pend + sc->pend_off, n);
    sc->pend_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    struct stream_ctx *sc = cls;
    for (int i = 0; i < sc->n; i++) {
        job_cancel(sc->ch[i].job); /* no-op when it ended; frees the slot when the client left */
        job_release(sc->ch[i].job);
        tool_stream_free(&sc->ch[i].ts);
        xfree(sc->ch[i].lp);
    }
    xfree(sc->pend);
    if (sc->p.on_free)
        sc->p.on_free(sc->p.user);
    xfree(sc);
}

struct MHD_Response *stream_response(struct job *const *jobs, int n, const struct oai_meta *meta,
                                     const struct stream_params *p)
{
    struct stream_ctx *sc = n >= 1 && n <= OAI_JOBS_MAX ? xcalloc(1, sizeof(*sc)) : NULL;
    if (!sc) {
        if (p->on_free)
            p->on_free(p->user);
        return NULL;
    }
    sc->p = *p;
    sc->n = n;
    for (int i = 0; i < n; i++) {
        struct choice_stream *cs = &sc->ch[i];
        cs->job = jobs[i];
        pthread_mutex_lock(&cs->job->mu);
        cs->job->refs++;
        pthread_mutex_unlock(&cs->job->mu);
        cs->meta = *meta;
        cs->meta.index = i;
    }
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, sc, stream_free);
    if (!r) {
        stream_free(sc);
        return NULL;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no"); /* nginx: pass events at once */
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    return r;
}
