/*
 * session_output.cu — what a run hands back: the logits row (copied only when asked), the best
 * tokens of a row chosen on the GPU (topk.cu; one launch for several sessions with the same
 * sampler, cuda_sessions_top_start), and the on-GPU generation loops: cuda_session_generate
 * (greedy, ids read back every readback_every steps) and cuda_session_generate_sampled (the
 * draw of sample.cu in topk.cu's last block, or in the screened pick's: lm_screen.cu),
 * gen_graph_steps steps per graph launch. The graphs come from decode_program.cu's capture,
 * one per attention variant, made on first use. A screened loop leaves the logits row to be
 * made on its first read (session_row_ready).
 */
#include "backend/cuda/cuda_session.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ reading the logits */

extern "C" qwenrt_status cuda_session_logits(struct cuda_session *cs, float *dst, struct qwenrt_error *err)
{
    qwenrt_status st = session_row_ready(cs, err);
    if (st)
        return st;
    if (!cs->h_row)
        CUDA_CHECK(dev_malloc_host(cs->opt.allocs, &cs->h_row, (size_t)cs->n_vocab * sizeof(float)));
    CUDA_CHECK(cudaMemcpyAsync(cs->h_row, cs->last_row, (size_t)cs->n_vocab * sizeof(float),
                               cudaMemcpyDeviceToHost, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    cs->unsynced = false;
    memcpy(dst, cs->h_row, (size_t)cs->n_vocab * sizeof(float));
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ the best tokens */

/* The arguments of a top-m selection over V logits, checked. */
static qwenrt_status top_args(int32_t V, float temperature, int32_t m, const int32_t *gather,
                              int32_t n_gather, int32_t max_keys, struct qwenrt_error *err)
{
    if (!(temperature > 0.0f) || m < 1 || n_gather < 0 || (n_gather && !gather))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: temperature %g, m %d, %d gathered ids",
                       (double)temperature, m, n_gather);
    if (topk_scratch_keys(V, m, max_keys) < 0 || n_gather > CUDA_TOP_MAX_GATHER)
        return err_set(err, QWENRT_ERR_UNSUPPORTED,
                       "cuda top: %d of %d logits with %d gathered (at most %d and %d)", m, V, n_gather,
                       CUDA_TOP_MAX_M, CUDA_TOP_MAX_GATHER);
    for (int32_t i = 0; i < n_gather; i++)
        if (gather[i] < 0 || gather[i] >= V)
            return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: gathered id %d outside the vocabulary of %d",
                           gather[i], V);
    return QWENRT_OK;
}

/* Words of the result block: [m ids][m vals][gather ids][gather vals]. */
#define TOP_WORDS (2 * CUDA_TOP_MAX_M + 2 * CUDA_TOP_MAX_GATHER)

/* launch_topk over a device row with the result block's layout; d_top / h_top (pinned) hold
 * TOP_WORDS words, scratch the keys. */
/* The selection's launch and its results' copies to h_top, not waited for (top_collect). */
static qwenrt_status top_launch(const float *row, int32_t V, float temperature, int32_t m, const int32_t *gather,
                                int32_t n_gather, bool reference, unsigned long long *scratch, int32_t *d_top,
                                int32_t *h_top, cudaStream_t s, struct qwenrt_error *err)
{
    int32_t *d_gather = d_top + 2 * CUDA_TOP_MAX_M, *h_gather = h_top + 2 * CUDA_TOP_MAX_M;
    if (n_gather) {
        memcpy(h_gather, gather, (size_t)n_gather * sizeof(int32_t));
        CUDA_CHECK(cudaMemcpyAsync(d_gather, h_gather, (size_t)n_gather * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, s));
    }
    float *d_gvals = (float *)(d_gather + CUDA_TOP_MAX_GATHER);
    CUDA_CHECK(launch_topk(row, V, temperature, m, d_gather, n_gather, scratch, d_top,
                           (float *)(d_top + CUDA_TOP_MAX_M), d_gvals, reference, s));
    CUDA_CHECK(cudaMemcpyAsync(h_top, d_top, 2 * CUDA_TOP_MAX_M * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    if (n_gather)
        CUDA_CHECK(cudaMemcpyAsync(h_gather + CUDA_TOP_MAX_GATHER, d_gvals, (size_t)n_gather * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
    return QWENRT_OK;
}

/* top_launch's results, once its stream has been waited for. */
static void top_collect(const int32_t *h_top, int32_t m, int32_t n_gather, int32_t *ids, float *vals,
                        float *gather_vals)
{
    const int32_t *h_gather = h_top + 2 * CUDA_TOP_MAX_M;
    memcpy(ids, h_top, (size_t)m * sizeof(int32_t));
    memcpy(vals, h_top + CUDA_TOP_MAX_M, (size_t)m * sizeof(float));
    if (n_gather)
        memcpy(gather_vals, h_gather + CUDA_TOP_MAX_GATHER, (size_t)n_gather * sizeof(float));
}

static qwenrt_status top_run(const float *row, int32_t V, float temperature, int32_t m,
                             const int32_t *gather, int32_t n_gather, bool reference,
                             unsigned long long *scratch, int32_t *d_top, int32_t *h_top,
                             cudaStream_t s, int32_t *ids, float *vals, float *gather_vals,
                             struct qwenrt_error *err)
{
    qwenrt_status st = top_launch(row, V, temperature, m, gather, n_gather, reference, scratch, d_top, h_top, s, err);
    if (st)
        return st;
    CUDA_CHECK(cudaStreamSynchronize(s));
    top_collect(h_top, m, n_gather, ids, vals, gather_vals);
    return QWENRT_OK;
}

/* cuda_session_top's scratch and result blocks, each piece once (even when an earlier try
 * failed half way). */
static qwenrt_status top_ready(struct cuda_session *cs, struct qwenrt_error *err)
{
    if (cs->d_top)
        return QWENRT_OK;
    if (!cs->topk_keys)
        CUDA_CHECK(topk_prepare(&cs->topk_keys));
    if (!cs->d_topk)
        CUDA_CHECK(topk_alloc_scratch(cs->opt.allocs, &cs->d_topk));
    if (!cs->h_top)
        CUDA_CHECK(dev_malloc_host(cs->opt.allocs, &cs->h_top, TOP_WORDS * sizeof(int32_t)));
    CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->d_top, TOP_WORDS * sizeof(int32_t)));
    return QWENRT_OK;
}

/* Whether the pick started ahead is the one asked for now, on the same row. */
static bool top_pending_fits(const struct cuda_session *cs, float temperature, int32_t m, const int32_t *gather,
                             int32_t n_gather)
{
    return cs->top_pending && cs->top_gen == cs->row_gen && cs->top_t == temperature && cs->top_m == m &&
           cs->top_n_gather == n_gather &&
           (!n_gather || !memcmp(cs->h_top + 2 * CUDA_TOP_MAX_M, gather, (size_t)n_gather * sizeof(int32_t)));
}

extern "C" qwenrt_status cuda_session_top_start(struct cuda_session *cs, float temperature, int32_t m,
                                                const int32_t *gather, int32_t n_gather, struct qwenrt_error *err)
{
    qwenrt_status st = session_row_ready(cs, err);
    if (!st)
        st = top_ready(cs, err);
    if (st || (st = top_args(cs->n_vocab, temperature, m, gather, n_gather, cs->topk_keys, err)))
        return st;
    if (cs->top_pending) /* h_top may still be written by the one before */
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    cs->top_pending = false;
    if (m == 1 && n_gather == 0 && temperature == 1.0f && cs->mk_top_ready)
        return QWENRT_OK; /* cuda_session_top needs no launch */
    if ((st = top_launch(cs->last_row, cs->n_vocab, temperature, m, gather, n_gather, false, cs->d_topk, cs->d_top,
                         cs->h_top, cs->stream, err)))
        return st;
    cs->top_pending = true;
    cs->unsynced = true; /* a step on another stream (a batch) waits for it first */
    cs->top_t = temperature, cs->top_m = m, cs->top_n_gather = n_gather, cs->top_gen = cs->row_gen;
    return QWENRT_OK;
}

/* One session of a group pick: its scratch and result blocks, h_top's device address, its
 * pick before (left to finish), and its row finished on its own stream. */
static qwenrt_status top_group_member(struct cuda_session *cs, const struct cuda_session *c0, float temperature,
                                      int32_t m, struct qwenrt_error *err)
{
    if (!cs->last_row || cs->n_vocab != c0->n_vocab)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: a session of the group has %s",
                       cs->last_row ? "another vocabulary" : "no logits yet");
    qwenrt_status st = session_row_ready(cs, err);
    if (!st)
        st = top_ready(cs, err);
    if (st || (st = top_args(cs->n_vocab, temperature, m, NULL, 0, cs->topk_keys, err)))
        return st;
    if (!cs->h_top_dev && cudaHostGetDevicePointer((void **)&cs->h_top_dev, cs->h_top, 0) != cudaSuccess) {
        cudaGetLastError();
        cs->h_top_dev = NULL;
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda top: the device cannot write the host's result block");
    }
    if (cs->top_pending || cs->unsynced) /* its scratch and h_top free, its row written */
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    cs->top_pending = false;
    cs->unsynced = false;
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_sessions_top_start(struct cuda_session *const *css, int32_t n, float temperature,
                                                 int32_t m, struct qwenrt_error *err)
{
    if (n < 1 || n > TOPK_MAX_ROWS || !css)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: a group of %d sessions (1 to %d)", n, TOPK_MAX_ROWS);
    struct cuda_session *c0 = css[0];
    struct topk_rows rows;
    rows.n = n;
    for (int32_t r = 0; r < n; r++) {
        for (int32_t k = 0; k < r; k++)
            if (css[k] == css[r])
                return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: session %d of the group appears twice", r);
        qwenrt_status st = top_group_member(css[r], c0, temperature, m, err);
        if (st)
            return st;
        rows.logits[r] = css[r]->last_row, rows.scratch[r] = css[r]->d_topk;
        rows.out_ids[r] = css[r]->h_top_dev, rows.out_vals[r] = (float *)(css[r]->h_top_dev + CUDA_TOP_MAX_M);
    }
    if (!c0->top_ev)
        CUDA_CHECK(cudaEventCreateWithFlags(&c0->top_ev, cudaEventDisableTiming));
    CUDA_CHECK(launch_topk_rows(&rows, c0->n_vocab, temperature, m, c0->stream));
    CUDA_CHECK(cudaEventRecord(c0->top_ev, c0->stream));
    for (int32_t r = 0; r < n; r++) { /* each session's stream waits for the pick: cuda_session_top's wait */
        if (css[r] != c0)
            CUDA_CHECK(cudaStreamWaitEvent(css[r]->stream, c0->top_ev, 0));
        struct cuda_session *cs = css[r];
        cs->top_pending = true;
        cs->unsynced = true; /* a step on another stream (a batch) waits for it first */
        cs->top_t = temperature, cs->top_m = m, cs->top_n_gather = 0, cs->top_gen = cs->row_gen;
    }
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_session_top(struct cuda_session *cs, float temperature, int32_t m,
                                          const int32_t *gather, int32_t n_gather, int32_t *ids,
                                          float *vals, float *gather_vals, struct qwenrt_error *err)
{
    qwenrt_status st = session_row_ready(cs, err);
    if (st)
        return st;
    if (cs->top_pending) { /* started ahead: its results if they are these, else let it finish */
        bool fits = top_pending_fits(cs, temperature, m, gather, n_gather);
        cs->top_pending = false;
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
        if (fits) {
            cs->unsynced = false;
            top_collect(cs->h_top, m, n_gather, ids, vals, gather_vals);
            return QWENRT_OK;
        }
    }
    st = top_ready(cs, err);
    if (st)
        return st;
    st = top_args(cs->n_vocab, temperature, m, gather, n_gather, cs->topk_keys, err);
    if (st)
        return st;
    if (m == 1 && n_gather == 0 && temperature == 1.0f && cs->mk_top_ready) {
        /* greedy after a megakernel step: its LM head phase already found the argmax in the
         * same order (largest logit, lowest id, NaN never) */
        CUDA_CHECK(cudaMemcpyAsync(cs->h_top, cs->d_mk_top, 2 * sizeof(int32_t), cudaMemcpyDeviceToHost, cs->stream));
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
        cs->unsynced = false;
        ids[0] = cs->h_top[0];
        memcpy(vals, &cs->h_top[1], sizeof(float));
        return QWENRT_OK;
    }
    st = top_run(cs->last_row, cs->n_vocab, temperature, m, gather, n_gather, false, cs->d_topk, cs->d_top,
                 cs->h_top, cs->stream, ids, vals, gather_vals, err);
    if (!st)
        cs->unsynced = false;
    return st;
}

extern "C" qwenrt_status cuda_topk_host(const float *logits, int32_t V, float temperature, int32_t m,
                                        const int32_t *gather, int32_t n_gather, bool reference,
                                        int32_t *ids, float *vals, float *gather_vals,
                                        struct qwenrt_error *err)
{
    int32_t max_keys = 0;
    cudaError_t e = topk_prepare(&max_keys);
    if (e != cudaSuccess)
        return cuda_fail(err, e, __FILE__, __LINE__, "topk_prepare");
    qwenrt_status st = top_args(V, temperature, m, gather, n_gather, max_keys, err);
    if (st)
        return st;
    float *row = NULL;
    unsigned long long *keys = NULL;
    int32_t *d_top = NULL, *h_top = NULL;
    e = cudaMalloc(&row, (size_t)V * sizeof(float));
    if (e == cudaSuccess)
        e = topk_alloc_scratch(NULL, &keys);
    if (e == cudaSuccess)
        e = cudaMalloc(&d_top, TOP_WORDS * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMallocHost(&h_top, TOP_WORDS * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMemcpy(row, logits, (size_t)V * sizeof(float), cudaMemcpyHostToDevice);
    if (e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "cuda_topk_host setup");
    else
        st = top_run(row, V, temperature, m, gather, n_gather, reference, keys, d_top, h_top, 0, ids, vals,
                     gather_vals, err);
    cudaFree(row);
    cudaFree(keys);
    cudaFree(d_top);
    cudaFreeHost(h_top);
    return st;
}

extern "C" qwenrt_status cuda_topk_rows_host(const float *logits, int32_t n, int32_t V, float temperature, int32_t m,
                                             int32_t *ids, float *vals, struct qwenrt_error *err)
{
    if (n < 1 || n > TOPK_MAX_ROWS || !logits || !ids || !vals)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda top: %d rows (1 to %d)", n, TOPK_MAX_ROWS);
    int32_t max_keys = 0;
    cudaError_t e = topk_prepare(&max_keys);
    if (e != cudaSuccess)
        return cuda_fail(err, e, __FILE__, __LINE__, "topk_prepare");
    qwenrt_status st = top_args(V, temperature, m, NULL, 0, max_keys, err);
    if (st)
        return st;
    float *rows_d = NULL;
    unsigned long long *keys[TOPK_MAX_ROWS] = {NULL};
    int32_t *h_top = NULL, *h_dev = NULL;
    struct topk_rows rows;
    rows.n = n;
    e = cudaMalloc(&rows_d, (size_t)n * V * sizeof(float));
    for (int32_t r = 0; r < n && e == cudaSuccess; r++)
        e = topk_alloc_scratch(NULL, &keys[r]);
    if (e == cudaSuccess)
        e = cudaMallocHost(&h_top, (size_t)n * 2 * m * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaHostGetDevicePointer((void **)&h_dev, h_top, 0);
    if (e == cudaSuccess)
        e = cudaMemcpy(rows_d, logits, (size_t)n * V * sizeof(float), cudaMemcpyHostToDevice);
    for (int32_t r = 0; r < n && e == cudaSuccess; r++) {
        rows.logits[r] = rows_d + (size_t)r * V, rows.scratch[r] = keys[r];
        rows.out_ids[r] = h_dev + (size_t)r * 2 * m, rows.out_vals[r] = (float *)(h_dev + (size_t)r * 2 * m + m);
    }
    if (e == cudaSuccess)
        e = launch_topk_rows(&rows, V, temperature, m, 0);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    for (int32_t r = 0; r < n && e == cudaSuccess; r++) {
        memcpy(ids + (size_t)r * m, h_top + (size_t)r * 2 * m, (size_t)m * sizeof(int32_t));
        memcpy(vals + (size_t)r * m, h_top + (size_t)r * 2 * m + m, (size_t)m * sizeof(float));
    }
    if (e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "cuda_topk_rows_host");
    cudaFree(rows_d);
    for (int32_t r = 0; r < n; r++)
        cudaFree(keys[r]);
    cudaFreeHost(h_top);
    return st;
}

/* ------------------------------------------------------------------ generation loops */

extern "C" qwenrt_status cuda_session_prepare_generate(struct cuda_session *cs, struct qwenrt_error *err)
{
    if (cs->mk || !cs->opt.graph)
        return QWENRT_OK;
    qwenrt_status st = lm_screen_ready(cs, err);
    const int32_t k = cs->opt.gen_graph_steps > 1 ? cs->opt.gen_graph_steps : 1;
    for (int v = 0; v <= (cs->cl_mode != 0) && !st; v++) {
        cs->cl_variant = v; /* what the attention's launches are captured for */
        if (k > 1 && !cs->g_gen_k[v])
            st = capture(cs, GEN_ARGMAX, k, &cs->g_gen_k[v], err);
        if (!st && !cs->g_gen[v])
            st = capture(cs, GEN_ARGMAX, 1, &cs->g_gen[v], err);
    }
    return st;
}

extern "C" qwenrt_status cuda_session_generate(struct cuda_session *cs, int32_t id, int32_t pos0,
                                               int32_t n, int32_t readback_every,
                                               int32_t *out_ids, float *last_logits,
                                               struct qwenrt_error *err)
{
    if (n < 1 || pos0 < 0 || pos0 + n > cs->n_ctx)
        return err_set(err, QWENRT_ERR_LIMIT, "cuda: %d steps at position %d exceed the context of %d",
                       n, pos0, cs->n_ctx);
    qwenrt_status st = stage_inputs(cs, &id, 1, pos0, err);
    if (st)
        return st;
    if (!cs->mk && (st = lm_screen_ready(cs, err)))
        return st;
    CUDA_CHECK(cudaMemsetAsync(cs->d_step, 0, sizeof(int32_t), cs->stream));
    const int32_t k = cs->opt.gen_graph_steps > 1 ? cs->opt.gen_graph_steps : 1;
    int32_t every = readback_every > 0 ? readback_every : n, done = 0;
    const struct plan *p = &cs->plans[PHASE_DECODE];
    for (int32_t i = 0; i < n; i++) {
        if (cs->mk) { /* the megakernel runs every step up to the next read-back at once */
            int32_t chunk = every - (i - done) < n - i ? every - (i - done) : n - i;
            if ((st = mk_run(cs->mk, cs->stream, cs->d_ids, cs->d_pos, cs->d_out, cs->d_step,
                             chunk, true, NULL, err)))
                return st;
            i += chunk - 1;
        } else if (cs->opt.graph && k > 1 && every - (i - done) >= k && n - i >= k) {
            int v = cs->cl_variant = attn_variant(cs, pos0 + i, k);
            if (!cs->g_gen_k[v] && (st = capture(cs, GEN_ARGMAX, k, &cs->g_gen_k[v], err)))
                return st;
            CUDA_CHECK(cudaGraphLaunch(cs->g_gen_k[v], cs->stream)); /* k steps up to the read-back */
            cs->gen_launches++;
            i += k - 1;
        } else if (cs->opt.graph) {
            int v = cs->cl_variant = attn_variant(cs, pos0 + i, 1);
            if (!cs->g_gen[v] && (st = capture(cs, GEN_ARGMAX, 1, &cs->g_gen[v], err)))
                return st;
            CUDA_CHECK(cudaGraphLaunch(cs->g_gen[v], cs->stream));
            cs->gen_launches++;
        } else {
            cs->cl_variant = attn_variant(cs, pos0 + i, 1);
            if ((st = enqueue_decode(cs, err)))
                return st;
            CUDA_CHECK(launch_argmax(cs->dbufs[p->buf_logits], cs->n_vocab, cs->d_ids, cs->d_pos,
                                     cs->d_out, cs->d_step, cs->stream, false, &cs->am));
        }
        if (i + 1 - done == every || i + 1 == n) {
            CUDA_CHECK(cudaMemcpyAsync(out_ids + done, cs->d_out + done,
                                       (size_t)(i + 1 - done) * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, cs->stream));
            CUDA_CHECK(cudaStreamSynchronize(cs->stream));
            done = i + 1;
        }
    }
    cs->last_row = cs->dbufs[p->buf_logits];
    cs->row_stale = cs->screen && cs->opt.graph && !cs->mk; /* the screened graphs left it unwritten */
    cs->row_gen++;
    cs->mk_top_ready = false;
    if (last_logits && (st = session_row_ready(cs, err)))
        return st;
    if (last_logits) {
        CUDA_CHECK(cudaMemcpyAsync(last_logits, cs->dbufs[p->buf_logits],
                                   (size_t)cs->n_vocab * sizeof(float), cudaMemcpyDeviceToHost,
                                   cs->stream));
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    }
    return QWENRT_OK;
}

/* The sampled loop's graphs rank by one temperature and candidate count: other values drop
 * them (captured again on first use). */
static qwenrt_status sample_graphs_for(struct cuda_session *cs, const struct cuda_sample_params *sp,
                                       struct qwenrt_error *err)
{
    if (!cs->d_sp) {
        if (!cs->h_sp)
            CUDA_CHECK(dev_malloc_host(cs->opt.allocs, &cs->h_sp, sizeof(*cs->h_sp)));
        CUDA_CHECK(dev_malloc(cs->opt.allocs, &cs->d_sp, sizeof(*cs->d_sp)));
    }
    if (cs->samp_t == sp->temperature && cs->samp_m == sp->top_k)
        return QWENRT_OK;
    for (int v = 0; v < 2; v++) {
        if (cs->g_samp[v])
            cudaGraphExecDestroy(cs->g_samp[v]);
        if (cs->g_samp_k[v])
            cudaGraphExecDestroy(cs->g_samp_k[v]);
        cs->g_samp[v] = cs->g_samp_k[v] = NULL;
    }
    cs->samp_t = sp->temperature, cs->samp_m = sp->top_k;
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_session_generate_sampled(struct cuda_session *cs, int32_t id, int32_t pos0, int32_t n,
                                                       const struct cuda_sample_params *sp, int32_t *out_ids,
                                                       struct qwenrt_error *err)
{
    if (!cuda_sample_params_ok(sp))
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "cuda: sampled generation needs temperature > 0, 1 <= top_k < %d, 0 < top_p <= 1, 0 <= min_p <= 1",
                       CUDA_TOP_MAX_M);
    if (!out_ids || n < 1 || pos0 < 0 || pos0 + n > cs->n_ctx)
        return err_set(err, QWENRT_ERR_LIMIT, "cuda: %d steps at position %d exceed the context of %d",
                       n, pos0, cs->n_ctx);
    if (!cs->opt.graph || cs->mk)
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda: sampled generation runs in decode graphs (%s)",
                       cs->mk ? "the megakernel decodes" : "graphs are off");
    qwenrt_status st = top_ready(cs, err);
    if (!st)
        st = top_args(cs->n_vocab, sp->temperature, sp->top_k, NULL, 0, cs->topk_keys, err);
    if (!st)
        st = lm_screen_ready(cs, err);
    if (st || (st = sample_graphs_for(cs, sp, err)) || (st = stage_inputs(cs, &id, 1, pos0, err)))
        return st;
    *cs->h_sp = *sp;
    CUDA_CHECK(cudaMemcpyAsync(cs->d_sp, cs->h_sp, sizeof(*sp), cudaMemcpyHostToDevice, cs->stream));
    CUDA_CHECK(cudaMemsetAsync(cs->d_step, 0, sizeof(int32_t), cs->stream));
    const int32_t k = cs->opt.gen_graph_steps > 1 ? cs->opt.gen_graph_steps : 1;
    for (int32_t i = 0; i < n;) {
        bool many = k > 1 && n - i >= k;
        int v = cs->cl_variant = attn_variant(cs, pos0 + i, many ? k : 1);
        cudaGraphExec_t *g = many ? &cs->g_samp_k[v] : &cs->g_samp[v];
        if (!*g && (st = capture(cs, GEN_SAMPLE, many ? k : 1, g, err)))
            return st;
        CUDA_CHECK(cudaGraphLaunch(*g, cs->stream));
        cs->gen_launches++;
        i += many ? k : 1;
    }
    struct lm_screen_args sa;
    const bool screened = lm_screen_takes(cs, GEN_SAMPLE, &sa); /* the row left partly written */
    CUDA_CHECK(cudaMemcpyAsync(out_ids, cs->d_out, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream)); /* also: h_sp and h_stage are free again */
    cs->unsynced = false;
    cs->last_row = cs->dbufs[cs->plans[PHASE_DECODE].buf_logits];
    cs->row_stale = screened;
    cs->row_gen++;
    cs->mk_top_ready = false;
    return QWENRT_OK;
}
