/*
 * session.c — the public session API: state allocation, prefill, decode, logits.
 *
 * Prefill runs the prefill plan over all n tokens at once (matrix-matrix products); decode runs
 * the decode plan for one token. Before a run, ids and the context limit are checked, so a
 * failed call leaves the session as it was.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/cpu_features.h"
#include "base/error.h"
#include "base/meminfo.h"
#include "runtime/session.h"
#include "runtime/sampler.h"

struct qwenrt_session_params qwenrt_session_default_params(void)
{
    struct qwenrt_session_params p = {0};
    return p;
}

static qwenrt_status alloc_state(struct qwenrt_session *s, struct qwenrt_error *err)
{
    const struct model_hparams *hp = &s->model->hp;
    struct seq_state *st = &s->state;
    st->n_layer = hp->n_layer;
    st->kv_width = hp->n_head_kv * hp->head_dim;
    st->k_cache = xcalloc((size_t)hp->n_layer, sizeof(float *));
    st->v_cache = xcalloc((size_t)hp->n_layer, sizeof(float *));
    st->k_cache16 = xcalloc((size_t)hp->n_layer, sizeof(uint16_t *));
    st->v_cache16 = xcalloc((size_t)hp->n_layer, sizeof(uint16_t *));
    st->conv_state = xcalloc((size_t)hp->n_layer, sizeof(float *));
    st->ssm_state = xcalloc((size_t)hp->n_layer, sizeof(float *));
    if (!st->k_cache || !st->v_cache || !st->k_cache16 || !st->v_cache16 || !st->conv_state || !st->ssm_state)
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory for the session state");
    size_t kv_elem = st->kv_f16 ? sizeof(uint16_t) : sizeof(float);
    if (hp->arch == ARCH_QWEN35) {
        st->conv_rows = hp->ssm_conv - 1;
        st->conv_dim = hparams_ssm_conv_dim(hp);
        st->ssm_len = (int64_t)hp->ssm_n_v_heads * hp->ssm_k_dim * hp->ssm_v_dim;
    }
    /* refuse, with numbers, a state that cannot fit before allocating any of it (issue 9) */
    uint64_t need = (uint64_t)hp->n_vocab * sizeof(float);
    for (int32_t l = 0; l < hp->n_layer; l++)
        need += hp->arch == ARCH_QWEN35 && hp->is_recurrent[l]
                    ? ((uint64_t)st->conv_rows * st->conv_dim + 1 + (uint64_t)st->ssm_len) * 4
                    : 2 * (uint64_t)st->n_ctx * (uint64_t)st->kv_width * kv_elem;
    char what[96];
    snprintf(what, sizeof(what), "session: the state of a %d-token context", st->n_ctx);
    qwenrt_status ms = mem_check_available(need, what, " (use a smaller context)", err);
    if (ms)
        return ms;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        bool rec = hp->arch == ARCH_QWEN35 && hp->is_recurrent[l];
        if (rec) {
            st->conv_state[l] = xalloc_aligned((size_t)st->conv_rows * st->conv_dim + 1, sizeof(float));
            st->ssm_state[l] = xalloc_aligned((size_t)st->ssm_len, sizeof(float));
            if (!st->conv_state[l] || !st->ssm_state[l])
                return err_set(err, QWENRT_ERR_NOMEM, "out of memory for the DeltaNet state");
        } else {
            void *k = xalloc_aligned((size_t)st->n_ctx * st->kv_width, kv_elem);
            void *v = xalloc_aligned((size_t)st->n_ctx * st->kv_width, kv_elem);
            if (st->kv_f16)
                st->k_cache16[l] = k, st->v_cache16[l] = v;
            else
                st->k_cache[l] = k, st->v_cache[l] = v;
            if (!k || !v) /* freed with the session, like the rest */
                return err_set(err, QWENRT_ERR_NOMEM,
                               "out of memory for a KV cache of %d positions (try a smaller context)",
                               st->n_ctx);
        }
    }
    return QWENRT_OK;
}

/* Whether any matrix product of the model has F32 weights: such a model asked for f32 all
 * the way (the fast products never apply to it either). */
static bool has_f32_products(const struct qwenrt_model *model)
{
    const struct plan *p = &model->plans[PHASE_DECODE];
    for (int32_t i = 0; i < p->n_ops; i++) {
        const struct plan_op *op = &p->ops[i];
        if ((op->kind == OP_MATMUL || op->kind == OP_LOGITS) && op->w && op->w->dtype == QR_F32)
            return true;
    }
    return false;
}

/* QWENRT_KV_DEFAULT: f16 in the default precision with 16-bit or quantised weights — on CUDA
 * (as fast or faster at every depth on the H200, half the memory; the flash prefill rounds K
 * and V to 16 bits there anyway) and on CPUs with AVX2 or AVX-512, whose attention kernels read
 * f16 rows as fast as f32 ones (faster deep in a context: Qwen3-0.6B Q8_0 at 1,024 positions,
 * AVX2 30 -> 35 tok/s, AVX-512 38 -> 42); f32 elsewhere (the exact precision, F32 models, CPUs
 * that run attention_ref, where f16 is 2.4x slower). docs/perf-log.md, sessions 15, 17, 18. */
static int32_t resolve_kv_type(int32_t kv_type, const struct qwenrt_model *model, bool cuda,
                               int32_t precision)
{
    if (kv_type != QWENRT_KV_DEFAULT)
        return kv_type;
    bool fast_f16 = cuda || (cpu_features_detect() & CPU_AVX2);
    bool f16 = fast_f16 && precision == QWENRT_PRECISION_DEFAULT && !has_f32_products(model);
    return f16 ? QWENRT_KV_F16 : QWENRT_KV_F32;
}

/* The environment variable name, if set, as a whole number of least to 64 into *out (left as
 * it is when unset); anything else is refused, naming the variable and what it expects. */
static qwenrt_status env_count(const char *name, long least, const char *expected, int32_t *out,
                               struct qwenrt_error *err)
{
    const char *text = getenv(name);
    if (!text)
        return QWENRT_OK;
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < least || v > 64)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "%s=%.32s: expected %s", name, text, expected);
    *out = (int32_t)v;
    return QWENRT_OK;
}

/* The CUDA backend keeps the whole sequence state on the device (backend/cuda). */
static qwenrt_status init_cuda(struct qwenrt_session *s, int32_t precision, int32_t kv_type,
                               struct qwenrt_error *err)
{
    const struct model_hparams *hp = &s->model->hp;
    struct seq_state *st = &s->state; /* geometry only (checkpoints); the arrays stay NULL */
    st->n_layer = hp->n_layer;
    st->kv_width = hp->n_head_kv * hp->head_dim;
    if (hp->arch == ARCH_QWEN35) {
        st->conv_rows = hp->ssm_conv - 1;
        st->conv_dim = hparams_ssm_conv_dim(hp);
        st->ssm_len = (int64_t)hp->ssm_n_v_heads * hp->ssm_k_dim * hp->ssm_v_dim;
    }
    struct cuda_options opt = cuda_default_options();
    const struct model_cuda_tuning *t = &s->model->cuda_tuning; /* a profile's choices */
    opt.gemv_smem_warps = t->gemv_smem_warps, opt.gemv_smem_kb = t->gemv_smem_kb;
    opt.gemv_smem_launch = t->gemv_smem_launch;
    opt.gemvq_rows = t->gemvq_rows, opt.gemvq_launch = t->gemvq_launch;
    opt.gemvq_warps = t->gemvq_warps, opt.gemvq_smem_kb = t->gemvq_smem_kb;
    opt.pdl = opt.pdl || t->pdl;
    opt.attn_split_min = t->attn_split_min;
    opt.attn_cluster = t->attn_cluster;
    opt.attn_cluster_from = t->attn_cluster_from, opt.attn_cluster_until = t->attn_cluster_until;
    /* QWENRT_CUDA_MEGA=off|on|auto: the decode megakernel's switch (default auto: on for
     * quantised weights), for A/B runs and as a way out */
    const char *mega = getenv("QWENRT_CUDA_MEGA");
    if (mega && (!strcmp(mega, "off") || !strcmp(mega, "0")))
        opt.mega = CUDA_MEGA_OFF;
    else if (mega && (!strcmp(mega, "on") || !strcmp(mega, "1")))
        opt.mega = CUDA_MEGA_ON;
    /* QWENRT_CUDA_LM_SCREEN=0|1|2: the LM head screened through its 8-bit copy never, for greedy
     * picks only, or for greedy and sampled ones (cuda_options.lm_screen, default 2): A/B runs */
    const char *screen = getenv("QWENRT_CUDA_LM_SCREEN");
    if (screen) {
        if (strcmp(screen, "0") && strcmp(screen, "1") && strcmp(screen, "2"))
            return err_set(err, QWENRT_ERR_INVALID_ARG,
                           "QWENRT_CUDA_LM_SCREEN=%.32s: expected 0 (off), 1 (greedy) or 2 (greedy and sampled)", screen);
        opt.lm_screen = (int32_t)(screen[0] - '0');
    }
    /* QWENRT_CUDA_BATCH_PRE=N: the batched step's quantised products take x quantised once a
     * product from N sessions (cuda_options.gemvq_batch_pre; default 2, 0 off);
     * QWENRT_CUDA_BATCH_BLOCKS=N: the batched attention's blocks a head pair and session
     * (cuda_options.attn_batch_blocks; default 0, the session picks; -1 a block a split). For
     * A/B runs; their ranges: cuda_session_init's check. */
    if (env_count("QWENRT_CUDA_BATCH_PRE", 0, "a number of sessions (0: off)", &opt.gemvq_batch_pre, err) ||
        env_count("QWENRT_CUDA_BATCH_BLOCKS", -1, "a number of blocks (0: the session picks, -1: a block a split)",
                  &opt.attn_batch_blocks, err))
        return QWENRT_ERR_INVALID_ARG;
    /* the KV cache's element type: the session's, or QWENRT_CUDA_KV=f16|f32 for A/B runs */
    const char *kv = getenv("QWENRT_CUDA_KV");
    if (kv && strcmp(kv, "f16") && strcmp(kv, "f32"))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "QWENRT_CUDA_KV=%.32s: expected f16 or f32", kv);
    opt.kv_f16 = kv ? !strcmp(kv, "f16") : kv_type == QWENRT_KV_F16;
    s->kv_type = opt.kv_f16 ? QWENRT_KV_F16 : QWENRT_KV_F32;
    opt.prefill_bf16 = precision != QWENRT_PRECISION_EXACT;
    if (precision == QWENRT_PRECISION_EXACT)
        opt.gemvq_int8 = -1; /* x in f32 (the default rounds it to 8 bits, as the CPU's products) */
    /* the model's sessions share one copy of the weights on the device */
    struct model_device_weights *dw = &s->model->device_weights;
    return cuda_session_init_shared(s->model->plans, s->state.n_ctx, &opt, &dw->mu, &dw->cuda, &s->cuda, err);
}

qwenrt_status qwenrt_session_init(struct qwenrt_model *model,
                                  const struct qwenrt_session_params *params,
                                  struct qwenrt_session **out, struct qwenrt_error *err)
{
    *out = NULL;
    struct qwenrt_session_params defaults = qwenrt_session_default_params();
    if (!params)
        params = &defaults;
    if (!model)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "session_init: no model");
    int32_t n_ctx = params->n_ctx;
    if (n_ctx <= 0)
        n_ctx = model->hp.n_ctx_train > 0 && model->hp.n_ctx_train < 4096 ? model->hp.n_ctx_train : 4096;
    if (n_ctx > (1 << 22))
        return err_set(err, QWENRT_ERR_LIMIT, "session_init: context of %d tokens is too large", n_ctx);
    if (params->precision != QWENRT_PRECISION_DEFAULT && params->precision != QWENRT_PRECISION_EXACT)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "session_init: unknown precision %d",
                       (int)params->precision);
    if (params->kv_type != QWENRT_KV_DEFAULT && params->kv_type != QWENRT_KV_F32 &&
        params->kv_type != QWENRT_KV_F16)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "session_init: unknown KV cache type %d",
                       (int)params->kv_type);
    bool cuda = strcmp(model->backend, "cuda") == 0;
    int32_t kv_type = resolve_kv_type(params->kv_type, model, cuda, params->precision);
    struct qwenrt_session *s = xcalloc(1, sizeof(*s));
    if (!s)
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory for a session");
    s->model = model;
    s->state.n_ctx = n_ctx;
    s->state.kv_f16 = kv_type == QWENRT_KV_F16 && !cuda; /* CUDA: its own cache (init_cuda) */
    s->kv_type = kv_type;
    int nt = params->n_threads > 0 ? params->n_threads : model->n_threads;
    s->n_threads = nt > 0 ? (nt > 256 ? 256 : nt) : omp_get_num_procs();
    s->cpu_features = cpu_features_detect();
    qwenrt_status st = cuda ? init_cuda(s, params->precision, kv_type, err) : alloc_state(s, err);
    for (int ph = 0; ph < 2 && !st; ph++) {
        s->fns[ph] = xcalloc((size_t)model->plans[ph].n_ops, sizeof(cpu_op_fn));
        st = s->fns[ph] ? cpu_bind_plan(&model->plans[ph], s->cpu_features, s->fns[ph], err)
                        : err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    }
    if (!st) {
        s->last_logits = xalloc_aligned((size_t)model->hp.n_vocab, sizeof(float));
        if (!s->last_logits)
            st = err_set(err, QWENRT_ERR_NOMEM, "out of memory");
    }
    if (st) {
        qwenrt_session_free(s);
        return st;
    }
    *out = s;
    return QWENRT_OK;
}

static void free_buffers(struct qwenrt_session *s)
{
    for (int i = 0; i < PLAN_MAX_BUFS; i++) {
        xfree(s->bufs[i]);
        s->bufs[i] = NULL;
    }
    xfree(s->scratch);
    s->scratch = NULL;
    s->cap_T = s->cap_logit_rows = 0;
}

void qwenrt_session_free(struct qwenrt_session *s)
{
    if (!s)
        return;
    free_buffers(s);
    cuda_session_free(s->cuda);
    for (int32_t l = 0; l < s->state.n_layer; l++) {
        if (s->state.k_cache) xfree(s->state.k_cache[l]);
        if (s->state.v_cache) xfree(s->state.v_cache[l]);
        if (s->state.k_cache16) xfree(s->state.k_cache16[l]);
        if (s->state.v_cache16) xfree(s->state.v_cache16[l]);
        if (s->state.conv_state) xfree(s->state.conv_state[l]);
        if (s->state.ssm_state) xfree(s->state.ssm_state[l]);
    }
    xfree(s->state.k_cache);
    xfree(s->state.v_cache);
    xfree(s->state.k_cache16);
    xfree(s->state.v_cache16);
    xfree(s->state.conv_state);
    xfree(s->state.ssm_state);
    xfree(s->fns[0]);
    xfree(s->fns[1]);
    xfree(s->last_logits);
    xfree(s);
}

/* Makes the buffers hold T tokens (and logit_rows rows of logits). */
static qwenrt_status ensure_buffers(struct qwenrt_session *s, const struct plan *p, int32_t T,
                                    int32_t logit_rows, struct qwenrt_error *err)
{
    if (T <= s->cap_T && logit_rows <= s->cap_logit_rows)
        return QWENRT_OK;
    int32_t capT = T > s->cap_T ? T : s->cap_T;
    uint64_t need = (uint64_t)cpu_exec_scratch_floats(p, &s->state, capT) * sizeof(float);
    for (int32_t i = 0; i < p->n_bufs; i++)
        need += (uint64_t)(i == p->buf_logits ? logit_rows : capT) * (uint64_t)p->bufs[i].width * 4;
    char what[96];
    snprintf(what, sizeof(what), "session: activations for a batch of %d tokens", capT);
    qwenrt_status ms = mem_check_available(need, what, " (prefill in smaller batches)", err);
    if (ms) /* checked before freeing: the session keeps its buffers and stays usable */
        return ms;
    free_buffers(s);
    for (int32_t i = 0; i < p->n_bufs; i++) {
        size_t rows = (size_t)(i == p->buf_logits ? logit_rows : capT);
        s->bufs[i] = xalloc_aligned(rows * (size_t)p->bufs[i].width, sizeof(float));
        if (!s->bufs[i])
            return err_set(err, QWENRT_ERR_NOMEM, "out of memory for activations of %d tokens", T);
    }
    s->scratch_len = cpu_exec_scratch_floats(p, &s->state, capT);
    s->scratch = xalloc_aligned((size_t)s->scratch_len, sizeof(float));
    if (!s->scratch)
        return err_set(err, QWENRT_ERR_NOMEM, "out of memory for scratch space");
    s->cap_T = capT;
    s->cap_logit_rows = logit_rows;
    return QWENRT_OK;
}

/* The same run on the GPU. Every row of logits comes back when asked for; otherwise the last
 * row stays on the device until someone reads it (qwenrt_session_logits copies it,
 * qwenrt_session_sample mostly needs only its best few tokens). */
static qwenrt_status run_cuda(struct qwenrt_session *s, const int32_t *ids, int32_t n,
                              float *all_logits, struct qwenrt_error *err)
{
    size_t V = (size_t)s->model->hp.n_vocab;
    qwenrt_status st = cuda_session_run(s->cuda, ids, n, s->n_past, all_logits != NULL, all_logits,
                                        s->dump, s->dump_user, err);
    if (st)
        return st;
    if (all_logits)
        memcpy(s->last_logits, all_logits + (size_t)(n - 1) * V, V * sizeof(float));
    s->n_past += n;
    s->has_logits = true;
    s->logits_on_device = all_logits == NULL;
    return QWENRT_OK;
}

qwenrt_status session_fetch_logits(struct qwenrt_session *s, struct qwenrt_error *err)
{
    if (!s->logits_on_device)
        return QWENRT_OK;
    qwenrt_status st = cuda_session_logits(s->cuda, s->last_logits, err);
    if (!st)
        s->logits_on_device = false;
    return st;
}

static qwenrt_status run(struct qwenrt_session *s, const int32_t *ids, int32_t n, float *all_logits,
                         struct qwenrt_error *err)
{
    const struct qwenrt_model *m = s->model;
    if (!ids || n < 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "no tokens to process");
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->hp.n_vocab)
            return err_set(err, QWENRT_ERR_INVALID_ARG, "token id %d at index %d is outside the vocabulary [0, %d)",
                           ids[i], i, m->hp.n_vocab);
    if (n > s->state.n_ctx - s->n_past)
        return err_set(err, QWENRT_ERR_LIMIT, "context full: %d tokens held, %d more asked, the session holds %d",
                       s->n_past, n, s->state.n_ctx);
    if (s->cuda)
        return run_cuda(s, ids, n, all_logits, err);
    int ph = n == 1 ? PHASE_DECODE : PHASE_PREFILL;
    const struct plan *p = &m->plans[ph];
    int32_t rows = all_logits ? n : 1;
    qwenrt_status st = ensure_buffers(s, p, n, rows, err);
    if (st)
        return st;
    struct cpu_exec ex = {
        .plan = p, .T = n, .pos0 = s->n_past, .ids = ids, .all_logits = all_logits != NULL,
        .state = &s->state, .n_threads = s->n_threads, .cpu_features = s->cpu_features,
        .dump = s->dump, .dump_user = s->dump_user, .scratch = s->scratch, .scratch_len = s->scratch_len,
    };
    memcpy(ex.bufs, s->bufs, sizeof(ex.bufs));
    st = cpu_run_plan(&ex, s->fns[ph], err);
    if (st)
        return st;
    s->n_past += n;
    const float *lg = s->bufs[p->buf_logits];
    size_t V = (size_t)m->hp.n_vocab;
    if (all_logits)
        memcpy(all_logits, lg, (size_t)n * V * sizeof(float));
    memcpy(s->last_logits, lg + (size_t)(rows - 1) * V, V * sizeof(float));
    s->has_logits = true;
    return QWENRT_OK;
}

qwenrt_status qwenrt_session_prefill(struct qwenrt_session *s, const int32_t *ids, int32_t n_ids,
                                     float *all_logits, struct qwenrt_error *err)
{
    if (!s)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "prefill: no session");
    return run(s, ids, n_ids, all_logits, err);
}

qwenrt_status qwenrt_session_decode(struct qwenrt_session *s, int32_t id, struct qwenrt_error *err)
{
    if (!s)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "decode: no session");
    return run(s, &id, 1, NULL, err);
}

const float *qwenrt_session_logits(const struct qwenrt_session *s)
{
    if (!s || !s->has_logits)
        return NULL;
    /* the session is logically unchanged: the copy only moves the row off the GPU */
    struct qwenrt_session *ms = (struct qwenrt_session *)s;
    return session_fetch_logits(ms, NULL) ? NULL : s->last_logits;
}

void session_sample_start(struct qwenrt_session *s, struct qwenrt_sampler *smp)
{
    if (!s || !smp || !s->has_logits || !s->logits_on_device)
        return;
    int32_t gather[CUDA_TOP_MAX_GATHER], m = 0;
    float t = 1.0f;
    int32_t n = sampler_subset_plan(smp, gather, CUDA_TOP_MAX_GATHER, CUDA_TOP_MAX_M, &m, &t);
    struct qwenrt_error err = {0}; /* a refusal here is qwenrt_session_sample's to report */
    if (n >= 0)
        (void)cuda_session_top_start(s->cuda, t, m, gather, n, &err);
}

/* The sessions of s[from..n) not yet started whose picks have no gathered ids and this
 * temperature and m: up to CUDA_TOP_MAX_ROWS of them into grp (marked started). */
static int32_t pick_group(struct qwenrt_session *const *s, const float *t, const int32_t *m, const int32_t *n_g,
                          bool *started, int32_t from, int32_t n, struct cuda_session **grp)
{
    int32_t k = 0;
    for (int32_t i = from; i < n && k < CUDA_TOP_MAX_ROWS; i++)
        if (!started[i] && n_g[i] == 0 && t[i] == t[from] && m[i] == m[from]) {
            grp[k++] = s[i]->cuda;
            started[i] = true;
        }
    return k;
}

void session_sample_start_all(struct qwenrt_session *const *s, struct qwenrt_sampler *const *smp, int32_t n)
{
    float t[CUDA_TOP_MAX_ROWS * 4];
    int32_t m[CUDA_TOP_MAX_ROWS * 4], n_g[CUDA_TOP_MAX_ROWS * 4], gather[CUDA_TOP_MAX_GATHER];
    bool started[CUDA_TOP_MAX_ROWS * 4];
    struct cuda_session *grp[CUDA_TOP_MAX_ROWS];
    struct qwenrt_error err = {0}; /* a refusal here is qwenrt_session_sample's to report */
    for (int32_t i0 = 0; i0 < n; i0 += CUDA_TOP_MAX_ROWS * 4) { /* in chunks of the arrays' size */
        int32_t c = n - i0 < CUDA_TOP_MAX_ROWS * 4 ? n - i0 : CUDA_TOP_MAX_ROWS * 4;
        struct qwenrt_session *const *sc = s + i0;
        for (int32_t i = 0; i < c; i++) {
            bool on = sc[i] && smp[i0 + i] && sc[i]->has_logits && sc[i]->logits_on_device;
            t[i] = 1.0f, m[i] = 0;
            n_g[i] = on ? sampler_subset_plan(smp[i0 + i], gather, CUDA_TOP_MAX_GATHER, CUDA_TOP_MAX_M, &m[i], &t[i]) : -1;
            started[i] = n_g[i] != 0; /* only picks without gathered ids go in groups */
            if (n_g[i] > 0)
                (void)cuda_session_top_start(sc[i]->cuda, t[i], m[i], gather, n_g[i], &err);
        }
        for (int32_t i = 0; i < c; i++) {
            if (started[i])
                continue;
            int32_t k = pick_group(sc, t, m, n_g, started, i, c, grp);
            if (k > 1 && !cuda_sessions_top_start(grp, k, t[i], m[i], &err))
                continue;
            for (int32_t r = 0; r < k; r++) /* alone, or the group refused: one by one */
                (void)cuda_session_top_start(grp[r], t[i], m[i], NULL, 0, &err);
        }
    }
}

qwenrt_status qwenrt_session_sample(struct qwenrt_session *s, struct qwenrt_sampler *smp, int32_t *id,
                                    struct qwenrt_error *err)
{
    if (!s || !smp || !id)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "session_sample: no session, sampler or output");
    if (!s->has_logits)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "session_sample: no logits yet (nothing has run)");
    if (s->logits_on_device) {
        int32_t gather[CUDA_TOP_MAX_GATHER], ids[CUDA_TOP_MAX_M], m = 0;
        float vals[CUDA_TOP_MAX_M], gvals[CUDA_TOP_MAX_GATHER], t = 1.0f;
        int32_t n = sampler_subset_plan(smp, gather, CUDA_TOP_MAX_GATHER, CUDA_TOP_MAX_M, &m, &t);
        qwenrt_status st = n < 0 ? QWENRT_ERR_UNSUPPORTED
                                 : cuda_session_top(s->cuda, t, m, gather, n, ids, vals, gvals, err);
        if (!st) {
            *id = sampler_sample_subset(smp, ids, vals, m, gather, gvals, n);
            return QWENRT_OK;
        }
        if (st != QWENRT_ERR_UNSUPPORTED) /* UNSUPPORTED: the whole row below */
            return st;
        if ((st = session_fetch_logits(s, err)))
            return st;
    }
    *id = qwenrt_sampler_sample(smp, s->last_logits);
    return QWENRT_OK;
}

qwenrt_status session_generate(struct qwenrt_session *s, struct qwenrt_sampler *smp, int32_t id, int32_t n,
                               int32_t *out, struct qwenrt_error *err)
{
    if (!s || !smp || !out || n < 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "generate: no session, sampler or output, or %d steps", n);
    struct cuda_sample_params sp;
    if (!s->cuda || s->dump || !sampler_device_plan(smp, CUDA_TOP_MAX_M, &sp))
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "generate: %s", !s->cuda ? "not a CUDA session"
                       : s->dump ? "the session dumps its ops" : "the sampler needs the host (logit bias or penalties, or no top-k)");
    const struct qwenrt_model *m = s->model;
    if (id < 0 || id >= m->hp.n_vocab)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "token id %d is outside the vocabulary [0, %d)", id, m->hp.n_vocab);
    if (n > s->state.n_ctx - s->n_past)
        return err_set(err, QWENRT_ERR_LIMIT, "context full: %d tokens held, %d more asked, the session holds %d",
                       s->n_past, n, s->state.n_ctx);
    qwenrt_status st = cuda_session_snapshot(s->cuda, false, err);
    if (st)
        return st;
    st = sp.temperature > 0.0f ? cuda_session_generate_sampled(s->cuda, id, s->n_past, n, &sp, out, err)
                               : cuda_session_generate(s->cuda, id, s->n_past, n, n, out, NULL, err);
    if (st)
        return st;
    if (sp.temperature > 0.0f)
        sampler_skip_draws(smp, n);
    s->n_past += n;
    s->has_logits = s->logits_on_device = true;
    return QWENRT_OK;
}

qwenrt_status session_generate_keep(struct qwenrt_session *s, struct qwenrt_sampler *smp, int32_t id,
                                    const int32_t *out, int32_t n, int32_t keep, struct qwenrt_error *err)
{
    if (!s || !smp || !out || !s->cuda || keep < 1 || keep > n || n > s->n_past)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "generate: keep %d of %d steps", keep, n);
    if (keep == n)
        return QWENRT_OK;
    struct cuda_sample_params sp;
    if (sampler_device_plan(smp, CUDA_TOP_MAX_M, &sp) && sp.temperature > 0.0f)
        sampler_skip_draws(smp, keep - n);
    int32_t base = s->n_past - n, from = keep - 1; /* step i decoded id (i = 0) or out[i - 1] */
    bool recurrent = s->state.ssm_len > 0;
    qwenrt_status st = recurrent ? cuda_session_snapshot(s->cuda, true, err) : QWENRT_OK;
    if (recurrent)
        from = 0;
    s->n_past = base + from;
    for (int32_t i = from; !st && i < keep; i++)
        st = qwenrt_session_decode(s, i ? out[i - 1] : id, err);
    return st;
}

int32_t qwenrt_session_n_past(const struct qwenrt_session *s) { return s ? s->n_past : 0; }

int32_t qwenrt_session_kv_type(const struct qwenrt_session *s) { return s ? s->kv_type : QWENRT_KV_F32; }

void qwenrt_session_reset(struct qwenrt_session *s)
{
    if (!s)
        return;
    s->n_past = 0;
    s->has_logits = s->logits_on_device = false;
    if (s->cuda) { /* the state is on the device; `state` holds only its geometry */
        cuda_session_reset(s->cuda, NULL);
        return;
    }
    for (int32_t l = 0; l < s->state.n_layer; l++) {
        if (s->state.conv_state[l])
            memset(s->state.conv_state[l], 0, (size_t)s->state.conv_rows * s->state.conv_dim * sizeof(float));
        if (s->state.ssm_state[l])
            memset(s->state.ssm_state[l], 0, (size_t)s->state.ssm_len * sizeof(float));
    }
}

void session_set_dump(struct qwenrt_session *s, cpu_dump_fn fn, void *user)
{
    s->dump = fn;
    s->dump_user = user;
}

int32_t qwenrt_argmax(const float *logits, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}
