/*
 * textgen.c — the decode loop with streaming text and stop conditions (see textgen.h).
 */
#include "tools/textgen.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timer.h"
#include "model/model.h"
#include "runtime/session.h"

struct holdback {
    char *buf; /* text produced but not yet emitted */
    size_t len, cap;
};

static bool hb_append(struct holdback *h, const char *s, size_t n)
{
    if (h->len + n + 1 > h->cap) {
        size_t cap = (h->len + n + 1) * 2;
        char *nb = xrealloc(h->buf, cap, 1);
        if (!nb)
            return false;
        h->buf = nb;
        h->cap = cap;
    }
    memcpy(h->buf + h->len, s, n);
    h->len += n;
    h->buf[h->len] = '\0';
    return true;
}

/* Length of the longest suffix of buf that is a proper prefix of some stop string. */
static size_t partial_stop(const struct holdback *h, const struct textgen_params *p)
{
    size_t keep = 0;
    for (int i = 0; i < TEXTGEN_MAX_STOP && p->stop[i]; i++) {
        size_t sl = strlen(p->stop[i]);
        for (size_t k = sl > 1 ? sl - 1 : 0; k > keep; k--)
            if (k <= h->len && !memcmp(h->buf + h->len - k, p->stop[i], k)) {
                keep = k;
                break;
            }
    }
    return keep;
}

/* Emits what is safe; returns true when a stop string was found (emitting text before it). */
static bool flush_text(struct holdback *h, const struct textgen_params *p, textgen_emit_fn emit,
                       void *user, bool final, bool *cancelled)
{
    size_t cut = h->len;
    bool stopped = false;
    for (int i = 0; i < TEXTGEN_MAX_STOP && p->stop[i]; i++) {
        if (!p->stop[i][0])
            continue;
        char *at = strstr(h->buf ? h->buf : "", p->stop[i]);
        if (at && (size_t)(at - h->buf) < cut) {
            cut = (size_t)(at - h->buf);
            stopped = true;
        }
    }
    size_t n = stopped || final ? cut : h->len - partial_stop(h, p);
    if (n && emit && !emit(user, h->buf, n))
        *cancelled = true;
    memmove(h->buf, h->buf + n, h->len - n);
    h->len -= n;
    return stopped;
}

/* The loop's text state: the UTF-8 stream, the held-back text and whether emit refused. */
struct textgen_loop {
    const struct tokenizer *tok;
    const struct textgen_params *p;
    textgen_emit_fn emit;
    void *user;
    struct tokenizer_stream ts;
    struct holdback hb;
    bool cancelled;
};

/* One sampled token: the end of the turn, or its text out (held back where a stop string may
 * start). Returns true when generation ends here (res->finish says why) or *st failed. */
static bool take_token(struct textgen_loop *L, struct qwenrt_sampler *smp, int32_t id, struct textgen_result *res,
                       qwenrt_status *st, struct qwenrt_error *err)
{
    res->last_token = id;
    res->n_generated++;
    if (tokenizer_is_eos(L->tok, id)) {
        res->finish = TEXTGEN_EOS;
        return true;
    }
    qwenrt_sampler_accept(smp, id);
    const char *text;
    size_t len;
    if ((*st = tokenizer_stream_push(&L->ts, id, &text, &len, err)))
        return true;
    if (!hb_append(&L->hb, text, len)) {
        *st = err_set(err, QWENRT_ERR_NOMEM, "generate: out of memory");
        return true;
    }
    if (flush_text(&L->hb, L->p, L->emit, L->user, false, &L->cancelled)) {
        res->finish = TEXTGEN_STOP;
        return true;
    }
    if (L->cancelled) {
        res->finish = TEXTGEN_CANCEL;
        return true;
    }
    return false;
}

/* After token id (taken, generation goes on, `left` more tokens allowed): decodes it and
 * draws the next ones on the GPU where the session and sampler allow (*gpu cleared when they
 * do not), taking each; steps past the one generation ended on are undone. Returns true when
 * generation ended. */
static bool gpu_steps(struct textgen_loop *L, struct qwenrt_session *s, struct qwenrt_sampler *smp, int32_t id,
                      int32_t left, bool *gpu, int32_t *last, struct textgen_result *res, qwenrt_status *st,
                      struct qwenrt_error *err)
{
    int32_t steps = L->p->gpu_steps > 0 ? L->p->gpu_steps : TEXTGEN_GPU_STEPS;
    steps = steps < TEXTGEN_GPU_STEPS_MAX ? steps : TEXTGEN_GPU_STEPS_MAX;
    int32_t out[TEXTGEN_GPU_STEPS_MAX], n = left < steps ? left : steps;
    int32_t room = s->state.n_ctx - s->n_past; /* near the end: token by token, as far as it goes */
    struct qwenrt_error e2 = {0};
    qwenrt_status r = n <= room ? session_generate(s, smp, id, n, out, &e2) : QWENRT_ERR_UNSUPPORTED;
    if (r == QWENRT_ERR_UNSUPPORTED) {
        *gpu = false;
        return false;
    }
    if (r) {
        *st = r;
        if (err)
            *err = e2;
        return true;
    }
    for (int32_t i = 0; i < n; i++)
        if (take_token(L, smp, out[i], res, st, err)) {
            if (!*st)
                *st = session_generate_keep(s, smp, id, out, n, i + 1, err);
            return true;
        }
    *last = out[n - 1];
    return false;
}

qwenrt_status textgen_run(struct qwenrt_session *s, struct qwenrt_sampler *smp,
                          const struct tokenizer *tok, const int32_t *prompt, int32_t n_prompt,
                          const struct textgen_params *p, textgen_emit_fn emit, void *user,
                          const volatile sig_atomic_t *cancel, struct textgen_result *res,
                          struct qwenrt_error *err)
{
    memset(res, 0, sizeof(*res));
    res->last_token = -1;
    res->finish = TEXTGEN_LENGTH;
    qwenrt_status st = QWENRT_OK;
    double t0 = time_now_s();
    if (n_prompt > 0 && (st = qwenrt_session_prefill(s, prompt, n_prompt, NULL, err)))
        return st;
    for (int32_t i = 0; i < n_prompt; i++)
        qwenrt_sampler_accept(smp, prompt[i]);
    res->n_prompt = n_prompt;
    res->prefill_s = time_now_s() - t0;
    if (qwenrt_session_n_past(s) < 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "generate: the session holds no tokens");
    struct textgen_loop L = {.tok = tok, .p = p, .emit = emit, .user = user};
    bool gpu = p->gpu_steps != 1, done = false;
    tokenizer_stream_init(&L.ts, tok, p->skip_special);
    t0 = time_now_s();
    int32_t id = -1;
    /* the first token from the logits at hand; then each token is decoded and the next drawn,
     * several at a time on the GPU (gpu_steps) or one by one */
    if (cancel && *cancel)
        res->finish = TEXTGEN_CANCEL, done = true;
    else if (p->max_tokens > 0 && !(st = qwenrt_session_sample(s, smp, &id, err)))
        done = take_token(&L, smp, id, res, &st, err);
    while (!st && !done && res->n_generated < p->max_tokens) {
        if (cancel && *cancel) {
            res->finish = TEXTGEN_CANCEL;
            break;
        }
        if (gpu && (done = gpu_steps(&L, s, smp, id, p->max_tokens - res->n_generated, &gpu, &id, res, &st, err)))
            break;
        if (gpu)
            continue;
        if ((st = qwenrt_session_decode(s, id, err)) || (st = qwenrt_session_sample(s, smp, &id, err)))
            break;
        done = take_token(&L, smp, id, res, &st, err);
    }
    if (!st && res->finish != TEXTGEN_STOP) {
        const char *text;
        size_t len;
        if (!tokenizer_stream_flush(&L.ts, &text, &len, err) && hb_append(&L.hb, text, len))
            flush_text(&L.hb, p, emit, user, true, &L.cancelled);
    }
    res->decode_s = time_now_s() - t0;
    tokenizer_stream_free(&L.ts);
    xfree(L.hb.buf);
    return st;
}

qwenrt_status textgen_load_tokenizer(const struct qwenrt_model *m, struct tokenizer **out,
                                     struct qwenrt_error *err)
{
    if (m->format == MODEL_FORMAT_GGUF) {
        if (!gguf_find_kv(&m->gguf, "tokenizer.ggml.tokens"))
            return err_set(err, QWENRT_ERR_NOT_FOUND, "%s: the file has no tokenizer (tokenizer.ggml.tokens)", m->path);
        return tokenizer_load_gguf(out, &m->gguf, err);
    }
    char *path = NULL;
    qwenrt_status st = tokenizer_find_json(m->path, &path, err);
    if (!st)
        st = tokenizer_load_json(out, path, err);
    xfree(path);
    return st;
}

void textgen_generation_defaults(const struct qwenrt_model *m, struct qwenrt_sampler_params *sp)
{
    if (m->format != MODEL_FORMAT_HF)
        return;
    char path[4096];
    snprintf(path, sizeof(path), "%s/generation_config.json", m->path);
    json_t *root = json_load_file(path, 0, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        return;
    }
    json_t *v;
    bool sample = json_is_true(json_object_get(root, "do_sample"));
    if (sample && json_is_number(v = json_object_get(root, "temperature")))
        sp->temperature = (float)json_number_value(v);
    if (json_is_integer(v = json_object_get(root, "top_k")))
        sp->top_k = (int32_t)json_integer_value(v);
    if (json_is_number(v = json_object_get(root, "top_p")) && json_number_value(v) > 0)
        sp->top_p = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(root, "min_p")))
        sp->min_p = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(root, "repetition_penalty")) && json_number_value(v) > 0)
        sp->repeat_penalty = (float)json_number_value(v);
    json_decref(root);
}

const char *textgen_chat_template(const struct tokenizer *tok) { return tokenizer_chat_template(tok); }

/* The step-wise text API reuses struct holdback's helpers through a view of its fields. */
static struct holdback text_hb(struct textgen_text *t)
{
    return (struct holdback){.buf = t->buf, .len = t->len, .cap = t->cap};
}

static void text_store(struct textgen_text *t, const struct holdback *h)
{
    t->buf = h->buf;
    t->len = h->len;
    t->cap = h->cap;
}

void textgen_text_init(struct textgen_text *t, const struct tokenizer *tok,
                       const struct textgen_params *p)
{
    memset(t, 0, sizeof(*t));
    t->p = p;
    tokenizer_stream_init(&t->ts, tok, p->skip_special);
}

qwenrt_status textgen_text_push(struct textgen_text *t, int32_t id, textgen_emit_fn emit,
                                void *user, bool *stopped, bool *cancelled,
                                struct qwenrt_error *err)
{
    const char *text;
    size_t len;
    *stopped = false;
    qwenrt_status st = tokenizer_stream_push(&t->ts, id, &text, &len, err);
    if (st)
        return st;
    struct holdback h = text_hb(t);
    bool ok = hb_append(&h, text, len);
    if (ok)
        *stopped = flush_text(&h, t->p, emit, user, false, cancelled);
    text_store(t, &h);
    return ok ? QWENRT_OK : err_set(err, QWENRT_ERR_NOMEM, "generate: out of memory");
}

void textgen_text_finish(struct textgen_text *t, textgen_emit_fn emit, void *user)
{
    const char *text;
    size_t len;
    bool cancelled = false;
    struct holdback h = text_hb(t);
    if (!tokenizer_stream_flush(&t->ts, &text, &len, NULL) && hb_append(&h, text, len))
        flush_text(&h, t->p, emit, user, true, &cancelled);
    text_store(t, &h);
}

void textgen_text_free(struct textgen_text *t)
{
    if (!t)
        return;
    tokenizer_stream_free(&t->ts);
    xfree(t->buf);
    t->buf = NULL;
    t->len = t->cap = 0;
}
