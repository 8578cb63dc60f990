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
    struct tokenizer_stream ts;
    struct holdback hb = {0};
    bool cancelled = false;
    tokenizer_stream_init(&ts, tok, p->skip_special);
    t0 = time_now_s();
    for (int32_t g = 0; g < p->max_tokens; g++) {
        if (cancel && *cancel) {
            res->finish = TEXTGEN_CANCEL;
            break;
        }
        int32_t id;
        if ((st = qwenrt_session_sample(s, smp, &id, err)))
            break;
        res->last_token = id;
        res->n_generated++;
        if (tokenizer_is_eos(tok, id)) {
            res->finish = TEXTGEN_EOS;
            break;
        }
        qwenrt_sampler_accept(smp, id);
        const char *text;
        size_t len;
        if ((st = tokenizer_stream_push(&ts, id, &text, &len, err)))
            break;
        if (!hb_append(&hb, text, len)) {
            st = err_set(err, QWENRT_ERR_NOMEM, "generate: out of memory");
            break;
        }
        if (flush_text(&hb, p, emit, user, false, &cancelled)) {
            res->finish = TEXTGEN_STOP;
            break;
        }
        if (cancelled) {
            res->finish = TEXTGEN_CANCEL;
            break;
        }
        if (g + 1 < p->max_tokens && (st = qwenrt_session_decode(s, id, err)))
            break;
    }
    if (!st && res->finish != TEXTGEN_STOP) {
        const char *text;
        size_t len;
        if (!tokenizer_stream_flush(&ts, &text, &len, err) && hb_append(&hb, text, len))
            flush_text(&hb, p, emit, user, true, &cancelled);
    }
    res->decode_s = time_now_s() - t0;
    tokenizer_stream_free(&ts);
    xfree(hb.buf);
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
