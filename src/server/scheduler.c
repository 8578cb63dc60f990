/*
 * scheduler.c — slots, the wait queue and the step loop of continuous batching (scheduler.h).
 *
 * Locking: s->mu guards the queue, the slots' job pointers and shutdown; job->mu guards a
 * job's shared fields. Lock order: s->mu before job->mu. Sessions, samplers, the prompt cache
 * and slot token lists are touched only by the scheduler thread.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "server/scheduler.h"

#include <math.h>

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timer.h"
#include "runtime/session.h"
#include "server/prompt_cache.h"

#define SCHED_GONE_MAX 64 /* cancelled queued jobs dropped per iteration */

/* SLOT_NEXT: no job; prefilling the next turn of the chat it just answered (next_ids) */
enum slot_phase { SLOT_IDLE, SLOT_PREFILL, SLOT_GEN, SLOT_NEXT };

struct slot {
    struct qwenrt_session *sess;
    struct qwenrt_sampler *smp;
    struct job *job; /* NULL when free */
    enum slot_phase phase;
    int32_t *toks; /* [n_toks] the tokens the session holds, cap n_ctx */
    int32_t n_toks;
    int32_t boundary; /* prompt position to checkpoint at (last <|im_start|>), 0 = none */
    struct textgen_text text;
    bool text_open;
    int32_t *next_ids; /* [n_next] SLOT_NEXT: the next turn's prefix being prefilled */
    int32_t n_next;
    int32_t pending;   /* a token drawn on the GPU and taken, not yet fed (-1: none) */
    bool no_gpu_steps; /* session_generate refused this job's sampler or session */
};

struct sched {
    struct qwenrt_model *model;  /* borrowed */
    const struct tokenizer *tok; /* borrowed */
    struct metrics *metrics;     /* borrowed */
    struct sched_params p;
    int32_t n_vocab;
    struct slot *slots; /* [p.n_parallel] */
    struct pcache cache;
    struct qwenrt_batch *batch; /* batched decode of the generating slots, NULL = off */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job **queue; /* [p.queue_max] ring */
    int q_head, q_len;
    bool shutdown;
};

/* ------------------------------------------------------------------ jobs */

struct job *job_new(int32_t *ids, int32_t n_ids)
{
    struct job *j = xcalloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->ids = ids;
    j->n_ids = n_ids;
    j->fd = -1;
    j->refs = 1;
    j->tp.skip_special = true;
    j->sp = qwenrt_sampler_default_params();
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    return j;
}

void job_release(struct job *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left)
        return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    for (int i = 0; i < TEXTGEN_MAX_STOP; i++)
        xfree(j->stops[i]);
    job_release(j->leader);
    xfree(j->bias);
    xfree(j->ids);
    xfree(j->out);
    xfree(j->answer);
    xfree(j->chat_json);
    xfree(j->lp);
    xfree(j);
}

void job_cancel(struct job *j)
{
    pthread_mutex_lock(&j->mu);
    j->cancel = true;
    pthread_mutex_unlock(&j->mu);
}

static bool job_cancelled(struct job *j)
{
    pthread_mutex_lock(&j->mu);
    bool c = j->cancel;
    pthread_mutex_unlock(&j->mu);
    return c;
}

/* Appends generated text for the HTTP side (textgen_emit_fn); false stops generation. */
static bool job_emit(void *user, const char *text, size_t len)
{
    struct job *j = user;
    bool ok = true;
    pthread_mutex_lock(&j->mu);
    if (j->out_len + len + 1 > j->out_cap) {
        size_t cap = (j->out_len + len + 1) * 2;
        char *p = cap <= SCHED_MAX_PENDING ? xrealloc(j->out, cap, 1) : NULL;
        if (p) {
            j->out = p;
            j->out_cap = cap;
        } else {
            j->cancel = true; /* the client does not read, or no memory */
            ok = false;
        }
    }
    if (ok && j->chat_json && j->answer_len + len + 1 > j->answer_cap) {
        size_t cap = (j->answer_len + len + 1) * 2;
        char *p = xrealloc(j->answer, cap, 1);
        if (p) {
            j->answer = p;
            j->answer_cap = cap;
        } else {
            xfree(j->chat_json); /* no memory: just no next-turn prefix */
            j->chat_json = NULL;
        }
    }
    if (ok && j->chat_json) {
        memcpy(j->answer + j->answer_len, text, len);
        j->answer_len += len;
        j->answer[j->answer_len] = '\0';
    }
    if (ok) {
        memcpy(j->out + j->out_len, text, len);
        j->out_len += len;
        j->out[j->out_len] = '\0';
        pthread_cond_broadcast(&j->cv);
    }
    ok = ok && !j->cancel;
    pthread_mutex_unlock(&j->mu);
    return ok;
}

bool job_echo(struct job *j, const char *text, size_t len)
{
    j->echo = true;
    return job_emit(j, text, len);
}

/* Ends a job: records how, wakes the HTTP side, drops the scheduler's reference. */
static void job_end(struct sched *s, struct job *j, enum job_finish how, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    j->finish = how;
    if (msg)
        snprintf(j->error, sizeof(j->error), "%s", msg);
    int32_t np = j->n_prompt, nc = j->n_cached, ng = j->n_gen;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->metrics->mu);
    s->metrics->prompt_tokens += (uint64_t)np;
    s->metrics->cached_tokens += (uint64_t)nc;
    s->metrics->completion_tokens += (uint64_t)ng;
    s->metrics->cancelled += how == JOB_CANCELLED;
    pthread_mutex_unlock(&s->metrics->mu);
    job_release(j);
}

/* ------------------------------------------------------------------ slots */

static bool prepare_next_turn(struct sched *s, struct slot *sl, struct job *j);

static void slot_free_job(struct sched *s, struct slot *sl, enum job_finish how, const char *msg)
{
    sl->pending = -1; /* taken, never fed: neither the session nor toks holds it */
    if (sl->text_open) {
        if (how == JOB_EOS || how == JOB_LENGTH)
            textgen_text_finish(&sl->text, job_emit, sl->job);
        textgen_text_free(&sl->text);
        sl->text_open = false;
    }
    /* remember where the conversation ended: the next turn of this chat starts with it */
    if (how != JOB_ERROR && sl->n_toks > 0)
        pcache_insert(&s->cache, sl->sess, sl->toks, sl->n_toks, NULL);
    struct job *j = sl->job;
    bool next_turn = j->chat_json && (how == JOB_EOS || how == JOB_STOP || how == JOB_LENGTH);
    if (next_turn) {
        pthread_mutex_lock(&j->mu);
        j->refs++; /* keep chat_json and answer after the HTTP side lets go */
        pthread_mutex_unlock(&j->mu);
    }
    job_end(s, j, how, msg);
    bool next = false;
    if (next_turn) {
        next = prepare_next_turn(s, sl, j);
        job_release(j);
    }
    pthread_mutex_lock(&s->mu);
    sl->job = NULL;
    sl->phase = next ? SLOT_NEXT : SLOT_IDLE;
    pthread_mutex_unlock(&s->mu);
}

/* Leaves SLOT_NEXT (done, failed, or taken over by the turn it was preparing). */
static void next_done(struct sched *s, struct slot *sl)
{
    xfree(sl->next_ids);
    sl->next_ids = NULL;
    sl->n_next = 0;
    pthread_mutex_lock(&s->mu);
    sl->phase = SLOT_IDLE;
    pthread_mutex_unlock(&s->mu);
}

/* One chunk of the next turn's prefix; at its end, the checkpoint. */
static void slot_next_step(struct sched *s, struct slot *sl)
{
    struct qwenrt_error err = {0};
    int32_t n = sl->n_next - sl->n_toks;
    if (n > SCHED_PREFILL_CHUNK)
        n = SCHED_PREFILL_CHUNK;
    if (n > 0 && qwenrt_session_prefill(sl->sess, sl->next_ids + sl->n_toks, n, NULL, &err)) {
        qwenrt_session_reset(sl->sess);
        sl->n_toks = 0;
        next_done(s, sl);
        return;
    }
    memcpy(sl->toks + sl->n_toks, sl->next_ids + sl->n_toks, (size_t)n * sizeof(*sl->toks));
    sl->n_toks += n;
    if (sl->n_toks == sl->n_next) {
        pcache_insert(&s->cache, sl->sess, sl->toks, sl->n_toks, NULL);
        next_done(s, sl);
    }
}

static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
    int32_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

/* Brings the slot's session to the longest cached prefix of ids: its own state when that is
 * a prefix, else the best checkpoint, else empty. *cached receives the prefix length. */
static qwenrt_status slot_seek(struct sched *s, struct slot *sl, const int32_t *ids, int32_t n,
                               int32_t *cached, struct qwenrt_error *err)
{
    int32_t own = common_prefix(sl->toks, sl->n_toks, ids, n);
    bool own_ok = own == sl->n_toks && sl->n_toks > 0;
    const struct pcache_entry *e = pcache_lookup(&s->cache, ids, n);
    *cached = 0;
    if (own_ok && (!e || e->n <= sl->n_toks)) {
        *cached = sl->n_toks;
    } else if (e) {
        qwenrt_status st = qwenrt_session_restore(sl->sess, e->cp, err);
        if (st)
            return st;
        memcpy(sl->toks, e->ids, (size_t)e->n * sizeof(*sl->toks));
        sl->n_toks = *cached = e->n;
    } else {
        qwenrt_session_reset(sl->sess);
        sl->n_toks = 0;
    }
    /* the whole prompt is cached but without logits: process it again */
    if (*cached == n && !qwenrt_session_logits(sl->sess)) {
        qwenrt_session_reset(sl->sess);
        sl->n_toks = *cached = 0;
    }
    return QWENRT_OK;
}

/* The text the next request of this chat starts with: the conversation plus the answer as
 * the template renders them when one more user turn follows (cut before that turn). */
static char *next_turn_text(const struct job *j, struct qwenrt_error *err)
{
    static const char mark[] = "\x01qwenrt-next-turn\x01";
    json_t *req = json_loads(j->chat_json, 0, NULL);
    json_t *msgs = json_object_get(req, "messages");
    char *txt = NULL, *out = NULL;
    size_t len;
    if (!json_is_array(msgs) ||
        json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", "assistant", "content",
                                              j->answer ? j->answer : "", j->answer_len)) ||
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", mark)) ||
        json_object_set_new(req, "add_generation_prompt", json_false()) ||
        !(txt = json_dumps(req, JSON_COMPACT)))
        goto out;
    if (chat_render_json(j->fmt, txt, &out, &len, err))
        goto out;
    char *at = strstr(out, mark), *cut = NULL;
    for (char *p = out; at && (p = strstr(p, "<|im_start|>")) && p < at; p++)
        cut = p;
    if (cut) {
        *cut = '\0';
    } else {
        xfree(out);
        out = NULL;
    }
out:
    free(txt);
    json_decref(req);
    return out;
}

/* After a chat answer: the next turn's prefix (see scheduler.h), from the best checkpoint.
 * Returns true when the slot must prefill the rest (SLOT_NEXT, a chunk per iteration, as a
 * prompt is); false when it is cached already or cannot be made (that only costs the hit). */
static bool prepare_next_turn(struct sched *s, struct slot *sl, struct job *j)
{
    struct qwenrt_error err = {0};
    int32_t *ids = NULL, cached = 0;
    size_t n = 0;
    char *text = next_turn_text(j, &err);
    bool pending = false;
    if (!text || tokenizer_encode(s->tok, text, strlen(text), &ids, &n, &err) || !n ||
        (int64_t)n >= s->p.n_ctx || slot_seek(s, sl, ids, (int32_t)n, &cached, &err))
        goto out;
    if (cached < (int32_t)n) {
        sl->next_ids = ids; /* moves ownership */
        sl->n_next = (int32_t)n;
        ids = NULL;
        pending = true;
    }
out:
    xfree(text);
    xfree(ids);
    return pending;
}

static bool job_add_logprob(struct job *j, const float *logits, int32_t V, int32_t id);

/* Brings the slot's session to the longest cached prefix of the job's prompt (echo with
 * logprobs: to the empty state, and records the first token's context-free entry), picks the
 * checkpoint position, sets up the sampler. */
static qwenrt_status slot_start(struct sched *s, struct slot *sl, struct qwenrt_error *err)
{
    struct job *j = sl->job;
    int32_t cached = 0;
    qwenrt_status st = QWENRT_OK;
    if (j->echo && j->logprobs) { /* every prompt position's logits: no cached prefix */
        qwenrt_session_reset(sl->sess);
        sl->n_toks = 0;
        if (!job_add_logprob(j, NULL, 0, j->ids[0]))
            return err_set(err, QWENRT_ERR_NOMEM, "out of memory for logprobs");
    } else if ((st = slot_seek(s, sl, j->ids, j->n_ids, &cached, err))) {
        return st;
    }
    sl->boundary = 0;
    const struct tokenizer_special *sp = tokenizer_special_ids(s->tok);
    for (int32_t i = j->n_ids - 1; i > cached && sp->im_start >= 0; i--)
        if (j->ids[i] == sp->im_start) {
            sl->boundary = i;
            break;
        }
    qwenrt_sampler_free(sl->smp);
    sl->smp = NULL;
    st = qwenrt_sampler_init(&j->sp, s->n_vocab, &sl->smp, err);
    if (st)
        return st;
    for (int32_t i = 0; i < cached; i++)
        qwenrt_sampler_accept(sl->smp, j->ids[i]);
    pthread_mutex_lock(&j->mu);
    j->n_prompt = j->n_ids;
    j->n_cached = cached;
    j->t_slot = time_now_s();
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->metrics->mu);
    if (cached)
        s->metrics->cache_hits++;
    else
        s->metrics->cache_misses++;
    pthread_mutex_unlock(&s->metrics->mu);
    metrics_observe(s->metrics, &s->metrics->queue_s, j->t_slot - j->t_arrival);
    sl->phase = SLOT_PREFILL;
    sl->pending = -1;
    sl->no_gpu_steps = false;
    return QWENRT_OK;
}

/* One prefill chunk; at the end of the prompt, checkpoints it and switches to generation. */
static qwenrt_status slot_prefill(struct sched *s, struct slot *sl, struct qwenrt_error *err)
{
    struct job *j = sl->job;
    int32_t end = j->n_ids;
    if (sl->n_toks < sl->boundary)
        end = sl->boundary;
    bool scores = j->echo && j->logprobs; /* the prompt's own logprobs */
    int32_t chunk = scores ? SCHED_ECHO_CHUNK : SCHED_PREFILL_CHUNK;
    if (end - sl->n_toks > chunk)
        end = sl->n_toks + chunk;
    if (end > sl->n_toks) {
        int32_t n = end - sl->n_toks;
        float *all = scores ? xmalloc((size_t)n * s->n_vocab, sizeof(float)) : NULL;
        if (scores && !all)
            return err_set(err, QWENRT_ERR_NOMEM, "out of memory for prompt logprobs");
        qwenrt_status st = qwenrt_session_prefill(sl->sess, j->ids + sl->n_toks, n, all, err);
        /* position i's logits score token i + 1 of the prompt (the last one's, the first
         * generated token, come with generation) */
        for (int32_t k = 0; !st && scores && k < n && sl->n_toks + k + 1 < j->n_ids; k++)
            if (!job_add_logprob(j, all + (size_t)k * s->n_vocab, s->n_vocab, j->ids[sl->n_toks + k + 1]))
                st = err_set(err, QWENRT_ERR_NOMEM, "out of memory for logprobs");
        xfree(all);
        if (st)
            return st;
        for (int32_t i = sl->n_toks; i < end; i++)
            qwenrt_sampler_accept(sl->smp, j->ids[i]);
        memcpy(sl->toks + sl->n_toks, j->ids + sl->n_toks, (size_t)n * sizeof(*sl->toks));
        sl->n_toks = end;
        if (end == sl->boundary || end == j->n_ids)
            pcache_insert(&s->cache, sl->sess, sl->toks, sl->n_toks, NULL);
    }
    if (sl->n_toks == j->n_ids) {
        j->prefilled = true; /* the followers of an "n" > 1 request may start (admit) */
        textgen_text_init(&sl->text, s->tok, &j->tp);
        sl->text_open = true;
        sl->phase = SLOT_GEN;
        if (j->tp.max_tokens <= 0) /* echo only: the prompt is the whole answer */
            slot_free_job(s, sl, JOB_LENGTH, NULL);
    }
    return QWENRT_OK;
}

/* Appends one logprobs entry to the job. false: out of memory. */
static bool job_push_logprob(struct job *j, const struct oai_token_logprob *e)
{
    pthread_mutex_lock(&j->mu);
    bool ok = true;
    if (j->n_lp == j->cap_lp) {
        int32_t cap = j->cap_lp ? 2 * j->cap_lp : 64;
        struct oai_token_logprob *p = xrealloc(j->lp, (size_t)cap, sizeof(*p));
        if (p)
            j->lp = p, j->cap_lp = cap;
        ok = p != NULL;
    }
    if (ok)
        j->lp[j->n_lp++] = *e;
    pthread_mutex_unlock(&j->mu);
    return ok;
}

/* Records the log-probability of token id under logits (log-softmax, in double) and the
 * job's number of most likely alternatives; logits NULL: an entry without context (NaN, no
 * alternatives: an echoed prompt's first token). false: out of memory. */
static bool job_add_logprob(struct job *j, const float *logits, int32_t V, int32_t id)
{
    struct oai_token_logprob e;
    memset(&e, 0, sizeof(e));
    if (!logits) {
        e.id = id;
        e.logprob = NAN;
        return job_push_logprob(j, &e);
    }
    double mx = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < V; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (int32_t i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    e.id = id;
    e.logprob = (float)(logits[id] - lse);
    /* the most likely tokens in one pass: a sorted list of at most top entries (the first
     * maximum wins ties, as argmax does) */
    int32_t top = j->logprobs - 1;
    for (int32_t i = 0; i < V && top > 0; i++) {
        float v = logits[i];
        if (v != v || (e.n_top == top && v <= logits[e.top_id[e.n_top - 1]]))
            continue;
        int32_t at = e.n_top < top ? e.n_top++ : top - 1;
        while (at > 0 && logits[e.top_id[at - 1]] < v) {
            e.top_id[at] = e.top_id[at - 1];
            at--;
        }
        e.top_id[at] = i;
    }
    for (int32_t k = 0; k < e.n_top; k++)
        e.top_lp[k] = (float)(logits[e.top_id[k]] - lse);
    return job_push_logprob(j, &e);
}

/* Takes a drawn token into the slot's job: counted, the end of the turn, its logprobs, its
 * text out. Returns true when generation goes on; otherwise *how says why it ended (with the
 * message in err for JOB_ERROR) and the caller ends the job. */
static bool slot_take(struct sched *s, struct slot *sl, int32_t id, enum job_finish *how, struct qwenrt_error *err)
{
    struct job *j = sl->job;
    pthread_mutex_lock(&j->mu);
    int32_t n_gen = ++j->n_gen;
    bool first = !j->t_first;
    if (first)
        j->t_first = time_now_s();
    pthread_mutex_unlock(&j->mu);
    if (first)
        metrics_observe(s->metrics, &s->metrics->ttft_s, j->t_first - j->t_arrival);
    if (tokenizer_is_eos(s->tok, id)) {
        *how = JOB_EOS;
        return false;
    }
    qwenrt_sampler_accept(sl->smp, id);
    const float *logits = j->logprobs ? qwenrt_session_logits(sl->sess) : NULL;
    if (j->logprobs && (!logits || !job_add_logprob(j, logits, s->n_vocab, id))) {
        *how = JOB_ERROR;
        err_set(err, QWENRT_ERR_NOMEM, "%s", logits ? "out of memory for logprobs" : "logprobs: the logits could not be read");
        return false;
    }
    bool stopped = false, cancelled = false;
    size_t len;
    /* ids past the tokenizer's vocabulary (the model's padding rows) have no text */
    bool has_text = tokenizer_token_bytes(s->tok, id, &len) || tokenizer_is_special(s->tok, id);
    if (has_text && textgen_text_push(&sl->text, id, job_emit, j, &stopped, &cancelled, err)) {
        *how = JOB_ERROR;
        return false;
    }
    if (stopped || cancelled) {
        *how = stopped ? JOB_STOP : JOB_CANCELLED;
        return false;
    }
    if (n_gen >= j->tp.max_tokens || sl->n_toks + 1 >= s->p.n_ctx) {
        *how = JOB_LENGTH;
        return false;
    }
    return true;
}

/* Samples one token and emits its text (a token drawn ahead on the GPU, sl->pending, instead
 * when there is one). Returns true when generation goes on: the token must then be fed to the
 * session (*id), which the loop does for all such slots in one batch. */
static bool slot_sample(struct sched *s, struct slot *sl, int32_t *out_id)
{
    struct qwenrt_error err = {0};
    int32_t id = sl->pending;
    if (id >= 0) { /* already taken by slot_gpu_steps */
        sl->pending = -1;
        *out_id = id;
        return true;
    }
    if (qwenrt_session_sample(sl->sess, sl->smp, &id, &err)) {
        slot_free_job(s, sl, JOB_ERROR, err.message);
        return false;
    }
    enum job_finish how;
    if (!slot_take(s, sl, id, &how, &err)) {
        slot_free_job(s, sl, how, how == JOB_ERROR ? err.message : NULL);
        return false;
    }
    *out_id = id;
    return true;
}

/* The one generating slot, with the server otherwise idle (no other job, none queued): feeds
 * id and draws the next tokens on the GPU, up to SCHED_GPU_STEPS per call (session_generate:
 * no host round trip between them), taking each; steps past the token the job ended on are
 * undone (session_generate_keep) before the job ends, so the session, its token list and the
 * prompt cache agree. The last token drawn, when the job goes on, waits in sl->pending for the
 * next step. Returns false where it cannot (no CUDA session, a sampler the GPU cannot run,
 * logprobs asked, too few tokens left): the caller feeds id as usual. */
static bool slot_gpu_steps(struct sched *s, struct slot *sl, int32_t id)
{
    struct job *j = sl->job;
    pthread_mutex_lock(&j->mu);
    int32_t left = j->tp.max_tokens - j->n_gen;
    pthread_mutex_unlock(&j->mu);
    int32_t n = s->p.n_ctx - sl->n_toks - 1;
    n = n < left ? n : left;
    n = n < SCHED_GPU_STEPS ? n : SCHED_GPU_STEPS;
    if (sl->no_gpu_steps || j->logprobs || n < 2)
        return false;
    struct qwenrt_error err = {0};
    int32_t out[SCHED_GPU_STEPS];
    qwenrt_status st = session_generate(sl->sess, sl->smp, id, n, out, &err);
    if (st == QWENRT_ERR_UNSUPPORTED) {
        sl->no_gpu_steps = true; /* this slot's session or sampler: not for this job */
        return false;
    }
    if (st) {
        qwenrt_session_reset(sl->sess); /* its state is unknown now */
        sl->n_toks = 0;
        slot_free_job(s, sl, JOB_ERROR, err.message);
        return true;
    }
    pthread_mutex_lock(&s->metrics->mu);
    s->metrics->gpu_step_tokens += (uint64_t)n;
    pthread_mutex_unlock(&s->metrics->mu);
    sl->toks[sl->n_toks++] = id;
    for (int32_t i = 0; i < n; i++) {
        enum job_finish how;
        if (!slot_take(s, sl, out[i], &how, &err)) {
            struct qwenrt_error e2 = {0};
            if (session_generate_keep(sl->sess, sl->smp, id, out, n, i + 1, &e2)) {
                qwenrt_session_reset(sl->sess);
                sl->n_toks = 0;
                how = JOB_ERROR, err = e2;
            }
            slot_free_job(s, sl, how, how == JOB_ERROR ? err.message : NULL);
            return true;
        }
        if (i + 1 < n)
            sl->toks[sl->n_toks++] = out[i]; /* decoded by step i + 1 */
    }
    sl->pending = out[n - 1];
    return true;
}

/* How many of the n sessions from sess on one batched step takes: all n where that pays, else
 * the most that pay (a quantised CUDA model: at most 8 a step), or 1: one by one. */
static int batch_group(const struct sched *s, struct qwenrt_session *const *sess, int n)
{
    for (int g = n; s->batch && g > 1; g--)
        if (session_batch_pays(sess[0], g))
            return g;
    return 1;
}

/* A slot whose session's state is no longer known (a batched step that failed on the GPU):
 * its job ends with the error and the session starts empty, so that no later job reuses its
 * cached tokens. */
static void slot_fail_reset(struct sched *s, struct slot *sl, const char *why)
{
    qwenrt_session_reset(sl->sess);
    sl->n_toks = 0;
    slot_free_job(s, sl, JOB_ERROR, why);
}

/* Feeds each sampled token to its slot's session: batched steps (qwenrt_batch_decode, CPU or
 * CUDA) of as many slots as pay (batch_group), one by one where batching is not possible (one
 * slot, or a batch that reported UNSUPPORTED), slower or not the same (session_batch_pays: on
 * CUDA f32 weights, quantised ones with two slots generating, or whose one-token products round
 * x to 8 bits where the batched ones keep it f32). A batch that failed with any other error
 * changed no session (qwenrt.h), so its slots go on one by one too — except after BACKEND,
 * which may leave a CUDA session's GPU state partly updated: decoding its token again would
 * advance a recurrent state twice, so those jobs end with the error, and the server batches
 * no more. */
static void decode_all(struct sched *s, struct slot **who, const int32_t *ids, int n)
{
    struct qwenrt_error err = {0};
    struct qwenrt_session *sess[SCHED_MAX_SLOTS];
    for (int i = 0; i < n; i++)
        sess[i] = who[i]->sess;
    for (int i0 = 0; i0 < n;) {
        int g = batch_group(s, sess + i0, n - i0);
        bool batched = false;
        if (g > 1) {
            qwenrt_status st = qwenrt_batch_decode(s->batch, sess + i0, ids + i0, g, &err);
            batched = !st;
            if (st == QWENRT_ERR_UNSUPPORTED || st == QWENRT_ERR_BACKEND) { /* stop trying */
                qwenrt_batch_free(s->batch);
                s->batch = NULL;
            }
            if (st == QWENRT_ERR_BACKEND) {
                for (int i = i0; i < i0 + g; i++)
                    slot_fail_reset(s, who[i], err.message);
                i0 += g;
                continue;
            }
        }
        for (int i = i0; i < i0 + g; i++) {
            if (!batched && qwenrt_session_decode(sess[i], ids[i], &err)) {
                slot_free_job(s, who[i], JOB_ERROR, err.message);
                continue;
            }
            who[i]->toks[who[i]->n_toks++] = ids[i];
        }
        i0 += g;
    }
}

/* ------------------------------------------------------------------ the loop */

/* Marks jobs whose client closed its socket as cancelled (one poll over all of them). */
static void check_clients(struct sched *s)
{
    struct pollfd pfd[256];
    struct job *who[256];
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->p.n_parallel && n < 256; i++)
        if (s->slots[i].job && s->slots[i].job->fd >= 0) {
            who[n] = s->slots[i].job;
            pfd[n] = (struct pollfd){.fd = who[n]->fd, .events = POLLRDHUP};
            n++;
        }
    for (int k = 0; k < s->q_len && n < 256; k++) {
        struct job *j = s->queue[(s->q_head + k) % s->p.queue_max];
        if (j->fd >= 0) {
            who[n] = j;
            pfd[n] = (struct pollfd){.fd = j->fd, .events = POLLRDHUP};
            n++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (n && poll(pfd, (nfds_t)n, 0) > 0)
        for (int i = 0; i < n; i++)
            if (pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
                job_cancel(who[i]);
}

/* Moves queued jobs into free slots, preferring the slot whose session already holds the
 * longest prefix of the job's prompt. Cancelled queued jobs leave. Called with s->mu held. */
/* A follower of an "n" > 1 request waits while its leader is still processing the prompt
 * (so that it restores the prompt from the cache); a leader that ended or left lets it go. */
static bool leader_pending(struct job *j)
{
    struct job *l = j->leader;
    if (!l || l->prefilled)
        return false;
    pthread_mutex_lock(&l->mu);
    bool running = l->finish == JOB_RUNNING && !l->cancel;
    pthread_mutex_unlock(&l->mu);
    return running;
}

static void admit(struct sched *s, struct job **gone, int *n_gone)
{
    while (s->q_len && *n_gone < SCHED_GONE_MAX) {
        struct job *j = s->queue[s->q_head];
        if (job_cancelled(j)) {
            s->q_head = (s->q_head + 1) % s->p.queue_max;
            s->q_len--;
            gone[(*n_gone)++] = j;
            continue;
        }
        if (leader_pending(j)) /* first come, first served: the queue waits with it (for one
                                  prompt's processing) */
            break;
        int best = -1;
        int32_t best_len = -1;
        for (int i = 0; i < s->p.n_parallel; i++) {
            struct slot *sl = &s->slots[i];
            if (sl->job)
                continue;
            int32_t c, len;
            if (sl->phase == SLOT_NEXT) {
                /* preparing this very turn: the job takes over (its prefill goes on from
                 * where the preparation got); preparing another chat: busy */
                c = common_prefix(sl->next_ids, sl->n_next, j->ids, j->n_ids);
                if (c != sl->n_next)
                    continue;
                len = c;
            } else {
                c = common_prefix(sl->toks, sl->n_toks, j->ids, j->n_ids);
                len = c == sl->n_toks ? c : 0;
            }
            if (len > best_len) {
                best = i;
                best_len = len;
            }
        }
        if (best < 0)
            break;
        if (s->slots[best].phase == SLOT_NEXT) {
            xfree(s->slots[best].next_ids);
            s->slots[best].next_ids = NULL;
            s->slots[best].n_next = 0;
        }
        s->slots[best].job = j;
        s->slots[best].phase = SLOT_IDLE;
        s->q_head = (s->q_head + 1) % s->p.queue_max;
        s->q_len--;
    }
}

static void publish_gauges(struct sched *s)
{
    int busy = 0;
    for (int i = 0; i < s->p.n_parallel; i++)
        busy += s->slots[i].job != NULL;
    pthread_mutex_lock(&s->metrics->mu);
    s->metrics->queue_depth = s->q_len;
    s->metrics->slots_busy = busy;
    s->metrics->cache_entries = s->cache.n_entries;
    s->metrics->cache_bytes = (int64_t)s->cache.bytes;
    pthread_mutex_unlock(&s->metrics->mu);
}

/* One step of one slot. */
static void slot_step(struct sched *s, struct slot *sl)
{
    struct qwenrt_error err = {0};
    if (job_cancelled(sl->job)) {
        slot_free_job(s, sl, JOB_CANCELLED, NULL);
        return;
    }
    if (sl->phase == SLOT_IDLE && slot_start(s, sl, &err)) {
        slot_free_job(s, sl, JOB_ERROR, err.message);
        return;
    }
    if (sl->phase == SLOT_PREFILL) {
        if (slot_prefill(s, sl, &err))
            slot_free_job(s, sl, JOB_ERROR, err.message);
        return; /* the first token comes next iteration, so prefills interleave fairly */
    }
}

static bool any_active(const struct sched *s)
{
    for (int i = 0; i < s->p.n_parallel; i++)
        if (s->slots[i].job || s->slots[i].phase == SLOT_NEXT)
            return true;
    return false;
}

static void *sched_main(void *arg)
{
    struct sched *s = arg;
    struct job *gone[SCHED_GONE_MAX];
    for (;;) {
        int n_gone = 0;
        pthread_mutex_lock(&s->mu);
        while (!s->shutdown && !s->q_len && !any_active(s))
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->shutdown) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        admit(s, gone, &n_gone);
        publish_gauges(s);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < n_gone; i++)
            job_end(s, gone[i], JOB_CANCELLED, NULL);
        check_clients(s);
        struct slot *gen[SCHED_MAX_SLOTS];
        int32_t ids[SCHED_MAX_SLOTS];
        int n_gen = 0;
        struct qwenrt_session *pick_sess[SCHED_MAX_SLOTS];
        struct qwenrt_sampler *pick_smp[SCHED_MAX_SLOTS];
        int n_pick = 0;
        for (int i = 0; i < s->p.n_parallel; i++) { /* every pick on the GPU at once, then each waited for */
            struct slot *sl = &s->slots[i];
            if (sl->job && sl->phase == SLOT_GEN && sl->pending < 0)
                pick_sess[n_pick] = sl->sess, pick_smp[n_pick++] = sl->smp;
        }
        session_sample_start_all(pick_sess, pick_smp, n_pick);
        for (int i = 0; i < s->p.n_parallel; i++) {
            struct slot *sl = &s->slots[i];
            if (sl->job && sl->phase == SLOT_GEN && !job_cancelled(sl->job)) {
                if (slot_sample(s, sl, &ids[n_gen]))
                    gen[n_gen++] = sl;
            } else if (sl->job) {
                slot_step(s, sl);
            } else if (sl->phase == SLOT_NEXT) {
                slot_next_step(s, sl);
            }
        }
        /* alone on the server: several tokens per GPU submission where the slot allows */
        pthread_mutex_lock(&s->mu);
        bool solo = n_gen == 1 && !s->q_len;
        for (int i = 0; solo && i < s->p.n_parallel; i++)
            solo = &s->slots[i] == gen[0] || (!s->slots[i].job && s->slots[i].phase != SLOT_NEXT);
        pthread_mutex_unlock(&s->mu);
        if (!(solo && slot_gpu_steps(s, gen[0], ids[0])))
            decode_all(s, gen, ids, n_gen);
        pthread_mutex_lock(&s->mu);
        publish_gauges(s);
        pthread_mutex_unlock(&s->mu);
    }
    /* shutdown: cancel what is running and queued */
    for (int i = 0; i < s->p.n_parallel; i++)
        if (s->slots[i].job)
            slot_free_job(s, &s->slots[i], JOB_CANCELLED, "the server is shutting down");
    pthread_mutex_lock(&s->mu);
    while (s->q_len) {
        struct job *j = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->p.queue_max;
        s->q_len--;
        pthread_mutex_unlock(&s->mu);
        job_end(s, j, JOB_CANCELLED, "the server is shutting down");
        pthread_mutex_lock(&s->mu);
    }
    publish_gauges(s);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ------------------------------------------------------------------ lifecycle */

qwenrt_status sched_init(struct qwenrt_model *model, const struct tokenizer *tok,
                         const struct sched_params *p, struct metrics *metrics, struct sched **out,
                         struct qwenrt_error *err)
{
    *out = NULL;
    if (p->n_parallel < 1 || p->n_parallel > SCHED_MAX_SLOTS || p->queue_max < 1 || p->n_ctx < 2)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "server: parallel %d, queue %d, ctx %d",
                       p->n_parallel, p->queue_max, p->n_ctx);
    struct sched *s = xcalloc(1, sizeof(*s));
    if (!s)
        return err_set(err, QWENRT_ERR_NOMEM, "server: out of memory");
    struct qwenrt_model_info info;
    qwenrt_model_get_info(model, &info);
    s->model = model;
    s->tok = tok;
    s->metrics = metrics;
    s->p = *p;
    s->n_vocab = info.n_vocab;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pcache_init(&s->cache, p->cache_bytes);
    qwenrt_status st = QWENRT_OK;
    s->slots = xcalloc((size_t)p->n_parallel, sizeof(*s->slots));
    s->queue = xcalloc((size_t)p->queue_max, sizeof(*s->queue));
    if (!s->slots || !s->queue) {
        st = err_set(err, QWENRT_ERR_NOMEM, "server: out of memory");
        goto out_free;
    }
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = p->n_ctx;
    sp.precision = p->precision;
    sp.kv_type = p->kv_type;
    sp.n_threads = p->n_threads;
    for (int i = 0; i < p->n_parallel; i++) {
        s->slots[i].pending = -1;
        if ((st = qwenrt_session_init(model, &sp, &s->slots[i].sess, err)))
            goto out_free;
        if (!(s->slots[i].toks = xmalloc((size_t)p->n_ctx, sizeof(int32_t)))) {
            st = err_set(err, QWENRT_ERR_NOMEM, "server: out of memory");
            goto out_free;
        }
    }
    metrics->slots_total = p->n_parallel;
    if (p->n_parallel > 1 && qwenrt_batch_init(model, p->n_parallel, &s->batch, NULL))
        s->batch = NULL; /* no memory for it: decode one by one */
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        st = err_set(err, QWENRT_ERR_INTERNAL, "server: cannot start the scheduler thread");
        goto out_free;
    }
    s->thread_started = true;
    *out = s;
    return QWENRT_OK;
out_free:
    sched_free(s);
    return st;
}

/* Drops queued jobs whose client has gone (or that were cancelled), so that a full queue of
 * abandoned requests does not refuse a live one. Called with s->mu held. */
static void purge_queue(struct sched *s)
{
    int kept = 0;
    for (int k = 0; k < s->q_len; k++) {
        struct job *j = s->queue[(s->q_head + k) % s->p.queue_max];
        struct pollfd pfd = {.fd = j->fd, .events = POLLRDHUP};
        bool gone = j->fd >= 0 && poll(&pfd, 1, 0) > 0 &&
                    (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
        if (gone || job_cancelled(j))
            job_end(s, j, JOB_CANCELLED, NULL);
        else
            s->queue[(s->q_head + kept++) % s->p.queue_max] = j;
    }
    s->q_len = kept;
}

int sched_submit(struct sched *s, struct job *j)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (!s->shutdown && s->q_len >= s->p.queue_max)
        purge_queue(s);
    if (s->shutdown) {
        rc = -2;
    } else if (s->q_len >= s->p.queue_max) {
        rc = -1;
    } else {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        s->queue[(s->q_head + s->q_len) % s->p.queue_max] = j;
        s->q_len++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == -1) {
        pthread_mutex_lock(&s->metrics->mu);
        s->metrics->rejected++;
        pthread_mutex_unlock(&s->metrics->mu);
    }
    return rc;
}

void sched_shutdown(struct sched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started) {
        pthread_join(s->thread, NULL);
        s->thread_started = false;
    }
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    sched_shutdown(s);
    for (int i = 0; s->slots && i < s->p.n_parallel; i++) {
        qwenrt_session_free(s->slots[i].sess);
        qwenrt_sampler_free(s->slots[i].smp);
        xfree(s->slots[i].toks);
        xfree(s->slots[i].next_ids);
    }
    pcache_free(&s->cache);
    qwenrt_batch_free(s->batch);
    xfree(s->slots);
    xfree(s->queue);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    xfree(s);
}
