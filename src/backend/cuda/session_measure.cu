/*
 * session_measure.cu — a session's answers to cuda_bench and the tests: which kernels its
 * steps take (cuda_session_count_steps), the decode profile (events between launches), the
 * time line (cuda_session_timeline: the graph replayed with per-block %globaltimer stamps,
 * tl_stamp, summarised per step label), the prefill profile op by op, the L2 prefetch bytes
 * and the picked GEMV shapes. Nothing here runs in a user's generation.
 */
#include "backend/cuda/cuda_session.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "base/alloc.h"
}

extern "C" int64_t cuda_session_gen_graph_launches(const struct cuda_session *cs)
{
    return cs ? cs->gen_launches : 0;
}

extern "C" void cuda_session_prefill_graphs(const struct cuda_session *cs, int64_t counts[3], const char **why)
{
    for (int i = 0; i < 3; i++)
        counts[i] = cs ? cs->prefill_graphs[i] : 0;
    if (why)
        *why = cs ? cs->prefill_why : "";
}

extern "C" bool cuda_session_lm_screen(const struct cuda_session *cs, int64_t *picks, int64_t *exact_rows)
{
    struct qwenrt_error err;
    *picks = *exact_rows = 0;
    return cs && cs->screen && lm_screen_counts(cs->screen, picks, exact_rows, &err) == QWENRT_OK;
}

extern "C" qwenrt_status cuda_session_lm_screen_probe(struct cuda_session *cs, int32_t reps, int32_t parts,
                                                      double *us, struct qwenrt_error *err)
{
    struct lm_screen_args a;
    if (!cs || reps < 1 || reps > 1000 || parts < 1 || parts > 3 || !lm_screen_takes(cs, GEN_ARGMAX, &a))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: no screened LM head to time (or %d picks, parts %d)",
                       (int)reps, (int)parts);
    a.pos0 = a.out_ids = a.step = NULL, a.pdl = false; /* the token to ids[0] only, nothing advanced */
    const bool events = parts & 1, launches = parts & 2;
    float *ms = (float *)xcalloc((size_t)reps, sizeof(float));
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t e = ms ? cudaSuccess : cudaErrorMemoryAllocation;
    if (e == cudaSuccess && events)
        e = cudaEventCreate(&e0);
    if (e == cudaSuccess && events)
        e = cudaEventCreate(&e1);
    for (int32_t r = 0; r < reps && e == cudaSuccess; r++) {
        if (events)
            e = cudaEventRecord(e0, cs->stream);
        if (e == cudaSuccess && launches)
            e = launch_lm_screen(cs->screen, &a, cs->stream);
        if (e == cudaSuccess && events)
            e = cudaEventRecord(e1, cs->stream);
        if (e == cudaSuccess)
            e = events ? cudaEventSynchronize(e1) : cudaStreamSynchronize(cs->stream);
        if (e == cudaSuccess && events)
            e = cudaEventElapsedTime(&ms[r], e0, e1);
    }
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (e == cudaSuccess)
        *us = 1e3 * median_of_floats(ms, reps);
    xfree(ms); /* the greedy pick leaves the logits row alone */
    return e == cudaSuccess ? QWENRT_OK : cuda_fail(err, e, __FILE__, __LINE__, "timing the screened LM head");
}

extern "C" qwenrt_status cuda_session_lm_screen_time(struct cuda_session *cs, int32_t reps, double *us,
                                                     struct qwenrt_error *err)
{
    return cuda_session_lm_screen_probe(cs, reps, 3, us, err);
}

extern "C" void cuda_session_buffer_addresses(const struct cuda_session *cs, uint64_t addr[4])
{
    memset(addr, 0, 4 * sizeof(uint64_t));
    if (!cs)
        return;
    addr[0] = (uint64_t)(uintptr_t)cs->state, addr[1] = (uint64_t)(uintptr_t)cs->dbufs[0];
    addr[2] = (uint64_t)(uintptr_t)cs->att_part, addr[3] = (uint64_t)(uintptr_t)cs->d_ids;
}

extern "C" bool cuda_session_lm_screen_buffers(const struct cuda_session *cs, uint64_t addr[4])
{
    memset(addr, 0, 4 * sizeof(uint64_t));
    if (!cs || !cs->screen)
        return false;
    lm_screen_buffers(cs->screen, addr);
    return true;
}

/* Which kernel a decode attention step takes in the default graphs (those without the cluster
 * merge), as launch_attention chooses: attention_staged.cu's, attention_lanes.cu's or
 * attention_shared_kv.cu's. */
enum attn_kernel_kind { ATTN_TAKES_STAGED, ATTN_TAKES_LANES, ATTN_TAKES_SHARED_KV };

static bool attn_step_takes(const struct cuda_session *cs, const struct step *st, enum attn_kernel_kind kind)
{
    if (st->kind != STEP_ROPE_ATTN)
        return false;
    struct run_ctx r = decode_ctx((struct cuda_session *)cs);
    struct rope_args ra;
    struct attn_args a;
    rope_attn_args(&r, st->op, st->gate_op, ra, a);
    a.cluster_merge = false;
    a.lanes = lanes_of(cs, a);
    a.stages = stages_of(cs, a);
    bool staged = a.stages && attention_staged_applies(&a);
    bool by_lanes = !staged && a.lanes && attention_lanes_applies(&a);
    switch (kind) {
    case ATTN_TAKES_STAGED: return staged;
    case ATTN_TAKES_LANES: return by_lanes;
    default: return !staged && !by_lanes && shared_kv_on(cs, a) && attention_shared_kv_applies(&a);
    }
}

extern "C" int32_t cuda_session_count_steps(const struct cuda_session *cs, const char *label)
{
    int32_t n = 0;
    bool early = label && !strcmp(label, "rope+attention (early)");
    bool gdn_early = label && !strcmp(label, "gdn (early)");
    bool ahead = label && !strcmp(label, "gemv+residual (ahead)");
    bool ahead_cl = label && !strcmp(label, "gemv+residual (ahead in cluster graphs)");
    bool shared_kv = label && !strcmp(label, "rope+attention (shared K/V)");
    bool lanes = label && !strcmp(label, "rope+attention (lanes)");
    bool staged = label && !strcmp(label, "rope+attention (staged)");
    enum attn_kernel_kind kind = staged ? ATTN_TAKES_STAGED : lanes ? ATTN_TAKES_LANES : ATTN_TAKES_SHARED_KV;
    for (int32_t i = 0; cs && label && i < cs->n_steps; i++)
        n += shared_kv || lanes || staged ? attn_step_takes(cs, &cs->steps[i], kind)
             : ahead    ? cs->steps[i].ahead
             : ahead_cl ? cs->steps[i].ahead_cl
             : early ? (cs->steps[i].kind == STEP_ROPE_ATTN || cs->steps[i].kind == STEP_ATTN_O) && cs->steps[i].early
             : gdn_early ? (cs->steps[i].kind == STEP_GDN_GATED || cs->steps[i].kind == STEP_CONV_GDN_GATED) &&
                               cs->steps[i].early
                   : !strcmp(step_label(&cs->plans[PHASE_DECODE], &cs->steps[i]), label);
    return n;
}

extern "C" int64_t cuda_session_l2_prefetch_bytes(const struct cuda_session *cs)
{
    int64_t n = 0;
    for (int32_t i = 0; cs && i < cs->n_steps; i++)
        n += cs->steps[i].pf.bytes;
    return n;
}

#define PROFILE_LABELS 16

/* The slot of step label l among the n_label so far (added when new and there is room); n_label
 * when there is none. */
static int32_t label_slot(const char **label, int32_t *n_label, const char *l)
{
    int32_t k = 0;
    while (k < *n_label && strcmp(label[k], l))
        k++;
    if (k == *n_label && *n_label < PROFILE_LABELS)
        label[(*n_label)++] = l;
    return k;
}

/* The decode program's steps timed one by one (events between launches, no graph), mean
 * microseconds per token by step label. The decode inputs are staged. */
static qwenrt_status profile_program(struct cuda_session *cs, int32_t reps, char *report,
                                     size_t report_len, struct qwenrt_error *err)
{
    const struct plan *p = &cs->plans[PHASE_DECODE];
    qwenrt_status st = QWENRT_OK;
    int32_t n = cs->n_steps, n_ev = 0;
    cudaEvent_t *ev = (cudaEvent_t *)xcalloc((size_t)n + 1, sizeof(cudaEvent_t));
    const char *label[PROFILE_LABELS];
    double us[PROFILE_LABELS] = {0}, total = 0;
    int32_t cnt[PROFILE_LABELS] = {0}, n_label = 0;
    if (!ev)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    for (; n_ev <= n; n_ev++)
        if (cudaEventCreate(&ev[n_ev]) != cudaSuccess) {
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventCreate failed");
            break;
        }
    struct run_ctx r = decode_ctx(cs);
    for (int32_t rep = -1; rep < reps && !st; rep++) { /* rep -1 warms up */
        if (cudaEventRecord(ev[0], cs->stream) != cudaSuccess)
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventRecord failed");
        for (int32_t i = 0; i < n && !st; i++) {
            st = run_step(&r, &cs->steps[i], err);
            if (!st && cudaEventRecord(ev[i + 1], cs->stream) != cudaSuccess)
                st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventRecord failed");
        }
        if (!st && cudaStreamSynchronize(cs->stream) != cudaSuccess)
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda: profile run failed");
        for (int32_t i = 0; i < n && !st && rep >= 0; i++) {
            float ms = 0;
            cudaEventElapsedTime(&ms, ev[i], ev[i + 1]);
            int32_t k = label_slot(label, &n_label, step_label(p, &cs->steps[i]));
            if (k < n_label)
                us[k] += 1e3 * ms / reps, cnt[k]++;
            total += 1e3 * ms / reps;
        }
    }
    if (!st) {
        size_t o = (size_t)snprintf(report, report_len, "program (%d launches, events between): %.1f us/token",
                                    n, total);
        for (int32_t k = 0; k < n_label && o < report_len; k++)
            o += (size_t)snprintf(report + o, report_len - o, "; %s x%d %.1f us", label[k],
                                  cnt[k] / (reps > 0 ? reps : 1), us[k]);
    }
    for (int32_t i = 0; i < n_ev; i++)
        cudaEventDestroy(ev[i]);
    xfree(ev);
    return st;
}

extern "C" qwenrt_status cuda_session_profile_decode(struct cuda_session *cs, int32_t id,
                                                     int32_t pos, int32_t reps, char *report,
                                                     size_t report_len, struct qwenrt_error *err)
{
    qwenrt_status st = stage_inputs(cs, &id, 1, pos, err);
    if (st)
        return st;
    if (!cs->mk)
        return profile_program(cs, reps, report, report_len, err);
    return mk_profile(cs->mk, cs->stream, cs->d_ids, cs->d_pos, reps, report, report_len, err);
}

/* The timeline's per-step times of one replay, us from the token's first block start: the
 * first block's start, the median block's release from griddep_wait, the last block's end;
 * -1 where the step's kernels write no stamps. And where the launch's blocks ran: how many
 * shared a multiprocessor with another block of the same launch, whether the last block to
 * end was one of them, and how much later than the median block that last one started, was
 * released and had its rows staged (a late end is then a late start, a late release, late
 * rows, or a shared multiprocessor's arithmetic). */
struct tl_times {
    double start, release, staged, mid_end, end; /* staged: gemv_smem's rows and x in shared memory,
                                                   * the attention's q, k, v ready (median block;
                                                   * -1 elsewhere); mid_end: the median block's end */
    double shared, last_shared;                 /* blocks on a shared multiprocessor; 1 when the last was */
    double used, most;                          /* multiprocessors with a block; most blocks on one */
    double last_start, last_release, last_staged; /* the last block's stamps after the median's, us */
};

static int cmp_u64(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

/* The median of the blocks' stamp k (those written) relative to t0, us; -1 when none. */
static double tl_median(const unsigned long long *st, int k, unsigned long long t0, unsigned long long *scratch)
{
    int32_t n = 0;
    for (int32_t b = 0; b < TL_MAX_BLOCKS; b++)
        if (st[TL_SLOTS * (size_t)b] && st[TL_SLOTS * (size_t)b + k])
            scratch[n++] = st[TL_SLOTS * (size_t)b + k];
    if (!n)
        return -1;
    qsort(scratch, (size_t)n, sizeof(*scratch), cmp_u64);
    return (double)(scratch[n / 2] - t0) * 1e-3;
}

#define TL_MAX_SMS 1024 /* multiprocessor ids the report counts (more: not counted) */

/* Blocks of one step that shared a multiprocessor, and whether block `last` did (slot 4:
 * the multiprocessor + 1, 0 where a kernel did not record it; blocks without an end stamp,
 * such as an attention split with no positions, are not counted). */
static void tl_sharing(const unsigned long long *st, int32_t last, struct tl_times *t)
{
    uint16_t on_sm[TL_MAX_SMS] = {0};
    for (int32_t b = 0; b < TL_MAX_BLOCKS; b++) {
        unsigned long long sm = st[TL_SLOTS * (size_t)b + 4];
        if (st[TL_SLOTS * (size_t)b] && st[TL_SLOTS * (size_t)b + 3] && sm && sm <= TL_MAX_SMS)
            on_sm[sm - 1]++;
    }
    t->shared = t->used = t->most = 0;
    for (int32_t i = 0; i < TL_MAX_SMS; i++) {
        t->shared += on_sm[i] > 1 ? on_sm[i] : 0;
        t->used += on_sm[i] > 0;
        t->most = on_sm[i] > t->most ? on_sm[i] : t->most;
    }
    unsigned long long sm_last = last >= 0 ? st[TL_SLOTS * (size_t)last + 4] : 0;
    t->last_shared = sm_last && sm_last <= TL_MAX_SMS && on_sm[sm_last - 1] > 1;
}

/* One step's stamps (TL_MAX_BLOCKS blocks x TL_SLOTS) into times relative to t0 (ns); rel: scratch. */
static struct tl_times tl_step(const unsigned long long *st, unsigned long long t0, unsigned long long *rel)
{
    struct tl_times t = {-1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0};
    unsigned long long s0 = ~0ull, s3 = 0;
    int32_t last = -1;
    for (int32_t b = 0; b < TL_MAX_BLOCKS; b++) {
        const unsigned long long *q = st + TL_SLOTS * (size_t)b;
        if (!q[0])
            continue;
        s0 = q[0] < s0 ? q[0] : s0;
        if (q[3] > s3)
            s3 = q[3], last = b;
    }
    if (s0 == ~0ull)
        return t;
    t.start = (double)(s0 - t0) * 1e-3;
    t.release = tl_median(st, 1, t0, rel);
    t.staged = tl_median(st, 2, t0, rel);
    t.mid_end = tl_median(st, 3, t0, rel);
    t.end = s3 ? (double)(s3 - t0) * 1e-3 : -1;
    tl_sharing(st, last, &t);
    if (last >= 0) {
        const unsigned long long *q = st + TL_SLOTS * (size_t)last;
        double mid_start = tl_median(st, 0, t0, rel);
        t.last_start = (double)(q[0] - t0) * 1e-3 - mid_start;
        t.last_release = q[1] && t.release >= 0 ? (double)(q[1] - t0) * 1e-3 - t.release : 0;
        t.last_staged = q[2] && t.staged >= 0 ? (double)(q[2] - t0) * 1e-3 - t.staged : 0;
    }
    return t;
}

/* avg += t / reps, field by field */
static void tl_add(struct tl_times *avg, const struct tl_times *t, int32_t reps)
{
    avg->start += t->start / reps, avg->release += t->release / reps, avg->end += t->end / reps;
    avg->staged += t->staged / reps, avg->mid_end += t->mid_end / reps;
    avg->shared += t->shared / reps, avg->last_shared += t->last_shared / reps;
    avg->used += t->used / reps, avg->most += t->most / reps;
    avg->last_start += t->last_start / reps, avg->last_release += t->last_release / reps;
    avg->last_staged += t->last_staged / reps;
}

/* The decode graph replayed with stamps (tl_stamp) in every launch that writes them; the
 * times of each step averaged over reps replays (each after the one before has finished). */
static qwenrt_status tl_collect(struct cuda_session *cs, int32_t reps, struct tl_times *avg, struct qwenrt_error *err)
{
    size_t n = (size_t)cs->n_steps * TL_MAX_BLOCKS * TL_SLOTS;
    unsigned long long *h = (unsigned long long *)xcalloc(n, sizeof(*h));
    unsigned long long *rel = (unsigned long long *)xcalloc(TL_MAX_BLOCKS, sizeof(*rel));
    unsigned long long *d = NULL;
    cudaGraphExec_t g = NULL;
    qwenrt_status st = h && rel ? QWENRT_OK : err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    cudaError_t e = st ? cudaSuccess : cudaMalloc(&d, n * sizeof(*h));
    if (!st && e == cudaSuccess) {
        cs->tl = d;
        st = capture(cs, GEN_NONE, 1, &g, err);
        cs->tl = NULL; /* the graph keeps the pointers; nothing else stamps */
    }
    for (int32_t r = 0; !st && e == cudaSuccess && r < reps; r++) {
        if ((e = cudaMemsetAsync(d, 0, n * sizeof(*h), cs->stream)) != cudaSuccess ||
            (e = cudaGraphLaunch(g, cs->stream)) != cudaSuccess || (e = cudaStreamSynchronize(cs->stream)) != cudaSuccess ||
            (e = cudaMemcpy(h, d, n * sizeof(*h), cudaMemcpyDeviceToHost)) != cudaSuccess)
            break;
        unsigned long long t0 = ~0ull;
        for (size_t b = 0; b < n; b += TL_SLOTS)
            t0 = h[b] && h[b] < t0 ? h[b] : t0;
        for (int32_t i = 0; i < cs->n_steps; i++) {
            struct tl_times t = tl_step(h + (size_t)i * TL_MAX_BLOCKS * TL_SLOTS, t0, rel);
            tl_add(&avg[i], &t, reps);
        }
    }
    if (g)
        cudaGraphExecDestroy(g);
    cudaFree(d);
    xfree(h), xfree(rel);
    if (!st && e != cudaSuccess)
        st = cuda_fail(err, e, __FILE__, __LINE__, "decode timeline");
    return st;
}

extern "C" qwenrt_status cuda_session_timeline(struct cuda_session *cs, int32_t id, int32_t pos, int32_t reps,
                                               char *report, size_t report_len, struct qwenrt_error *err)
{
    if (cs->mk)
        return err_set(err, QWENRT_ERR_UNSUPPORTED, "cuda: the timeline is the decode graph's, not the megakernel's");
    if (reps < 1)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: timeline reps %d (at least 1)", (int)reps);
    qwenrt_status st = stage_inputs(cs, &id, 1, pos, err);
    cs->cl_variant = attn_variant(cs, pos, 1); /* the graph a decode at pos would launch */
    struct tl_times *t = (struct tl_times *)xcalloc((size_t)cs->n_steps, sizeof(*t));
    if (!st && !t)
        st = err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    if (!st)
        st = tl_collect(cs, reps, t, err);
    if (st) {
        xfree(t);
        return st;
    }
    /* per label: steps, mean gap from the step before's last end to this step's median
     * release, mean time from that release to this step's last end */
    const struct plan *p = &cs->plans[PHASE_DECODE];
    const char *label[PROFILE_LABELS];
    double gap[PROFILE_LABELS] = {0}, work[PROFILE_LABELS] = {0}, ahead[PROFILE_LABELS] = {0}, total = 0;
    double staged[PROFILE_LABELS] = {0}, mid[PROFILE_LABELS] = {0};
    struct tl_times late[PROFILE_LABELS]; /* the sharing and the last block's lateness, summed */
    memset(late, 0, sizeof(late));
    int32_t n_staged[PROFILE_LABELS] = {0};
    int32_t cnt[PROFILE_LABELS] = {0}, n_label = 0;
    double prev_end = -1;
    for (int32_t i = 0; i < cs->n_steps; i++) {
        if (t[i].release < 0 || t[i].end < 0)
            continue;
        int32_t k = label_slot(label, &n_label, step_label(p, &cs->steps[i]));
        if (k < n_label && prev_end >= 0) {
            gap[k] += t[i].release - prev_end, work[k] += t[i].end - t[i].release, cnt[k]++;
            ahead[k] += prev_end - t[i].start;
            mid[k] += t[i].mid_end - t[i].release;
            if (t[i].staged >= 0)
                staged[k] += t[i].staged - t[i].release, n_staged[k]++;
            late[k].shared += t[i].shared, late[k].last_shared += t[i].last_shared;
            late[k].used += t[i].used, late[k].most += t[i].most;
            late[k].last_start += t[i].last_start, late[k].last_release += t[i].last_release;
            late[k].last_staged += t[i].last_staged;
        }
        prev_end = t[i].end;
        total = t[i].end > total ? t[i].end : total;
    }
    size_t o = (size_t)snprintf(report, report_len,
                                "| step (decode graph, stamped launches) | launches | first block started before the "
                                "launch before ended, us | release (median block) after that end, us | release to "
                                "rows and x staged (gemv_smem) or q, k, v ready (attention), median, us | release to "
                                "the median block's end, us | "
                                "release to the last block's end, us | multiprocessors used | most blocks on one | "
                                "blocks sharing a multiprocessor | the last block shared one | the last block's start / "
                                "release / staged after the median block's, us "
                                "|\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int32_t k = 0; k < n_label && o < report_len; k++) {
        if (!cnt[k])
            continue;
        char sg[32] = "-";
        if (n_staged[k])
            snprintf(sg, sizeof(sg), "%.2f", staged[k] / n_staged[k]);
        o += (size_t)snprintf(report + o, report_len - o,
                              "| %s | %d | %.2f | %.2f | %s | %.2f | %.2f | %.1f | %.1f | %.1f | %.0f%% | %.2f / %.2f / %.2f |\n",
                              label[k], (int)cnt[k], ahead[k] / cnt[k], gap[k] / cnt[k], sg, mid[k] / cnt[k],
                              work[k] / cnt[k], late[k].used / cnt[k], late[k].most / cnt[k], late[k].shared / cnt[k],
                              100.0 * late[k].last_shared / cnt[k],
                              late[k].last_start / cnt[k], late[k].last_release / cnt[k], late[k].last_staged / cnt[k]);
    }
    if (o < report_len)
        o += (size_t)snprintf(report + o, report_len - o, "first start to last end: %.1f us (%d reps)\n", total,
                              (int)reps);
    xfree(t);
    return QWENRT_OK;
}

extern "C" qwenrt_status cuda_session_profile_prefill(struct cuda_session *cs, const int32_t *ids,
                                                      int32_t T, char *report, size_t report_len,
                                                      struct qwenrt_error *err)
{
    const struct plan *p = &cs->plans[PHASE_PREFILL];
    qwenrt_status st = QWENRT_OK;
    if (T < 2 || T > cs->n_ctx)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "cuda: profile of %d tokens", T);
    float *logits = (float *)xmalloc((size_t)cs->n_vocab, sizeof(float));
    cudaEvent_t *ev = (cudaEvent_t *)xcalloc((size_t)p->n_ops + 1, sizeof(cudaEvent_t));
    if (!logits || !ev) {
        xfree(logits), xfree(ev);
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    }
    /* a plain run first: buffers sized, GEMM plans cached, clocks up */
    st = cuda_session_run(cs, ids, T, 0, false, logits, NULL, NULL, err);
    int32_t n_ev = 0;
    for (; !st && n_ev <= p->n_ops; n_ev++)
        if (cudaEventCreate(&ev[n_ev]) != cudaSuccess)
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventCreate failed");
    if (!st)
        st = cuda_session_reset(cs, err);
    if (!st)
        st = stage_inputs(cs, ids, T, 0, err);
    struct run_ctx r = {cs, p, cs->dops[PHASE_PREFILL], cs->pbufs, T, false, false, cs->stream, 0, false,
                        cs->pm.ld, NULL, NULL, NULL, false, NULL};
    if (!st && cudaEventRecord(ev[0], cs->stream) != cudaSuccess)
        st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventRecord failed");
    for (int32_t i = 0; i < p->n_ops && !st; i++) {
        if (cs->opt.fuse && plan_matmul_add_fusable(p, i)) { /* as run_plan_ops: the add in the
                                                         * product, its time under matmul */
            const struct plan_op *op = &p->ops[i], *add = &p->ops[i + 1];
            st = run_matmul(&r, &r.d[i], r.b[op->in], ld_of(&r, op->in), r.b[add->out],
                            ld_of(&r, add->out), T, true, err);
            if (!st && cudaEventRecord(ev[i + 1], cs->stream) != cudaSuccess)
                st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventRecord failed");
            i++;
        } else {
            st = run_op(&r, i, err);
        }
        if (!st && cudaEventRecord(ev[i + 1], cs->stream) != cudaSuccess)
            st = err_set(err, QWENRT_ERR_BACKEND, "cuda: cudaEventRecord failed");
    }
    if (!st && cudaStreamSynchronize(cs->stream) != cudaSuccess)
        st = err_set(err, QWENRT_ERR_BACKEND, "cuda: profile run failed");
    if (!st) {
        double ms[OP_KIND_COUNT] = {0}, mm_big = 0, total = 0;
        int32_t cnt[OP_KIND_COUNT] = {0};
        for (int32_t i = 0; i < p->n_ops; i++) {
            float t = 0;
            cudaEventElapsedTime(&t, ev[i], ev[i + 1]);
            ms[p->ops[i].kind] += t, cnt[p->ops[i].kind]++, total += t;
            if (p->ops[i].kind == OP_MATMUL && cs->dops[PHASE_PREFILL][i].N > 2 * cs->dops[PHASE_PREFILL][i].K)
                mm_big += t;
        }
        size_t o = (size_t)snprintf(report, report_len, "prefill T=%d op by op: %.2f ms", T, total);
        for (int k = 0; k < OP_KIND_COUNT && o < report_len; k++)
            if (cnt[k])
                o += (size_t)snprintf(report + o, report_len - o, "; %s x%d %.2f ms", op_kind_name((enum op_kind)k),
                                      cnt[k], ms[k]);
        if (o < report_len)
            snprintf(report + o, report_len - o, " (matmuls with N > 2K: %.2f ms)", mm_big);
    }
    for (int32_t i = 0; i < n_ev; i++)
        cudaEventDestroy(ev[i]);
    xfree(ev);
    xfree(logits);
    return st;
}

extern "C" void cuda_session_gemv_smem_shape(const struct cuda_session *cs, int32_t *warps, int32_t *kb,
                                             int32_t *launch, int32_t *min_blocks)
{
    *warps = cs ? cs->gs_warps : 0;
    *kb = cs ? cs->gs_kb : 0;
    *launch = cs ? (cs->gs_after_wait ? 2 : 1) : 0;
    *min_blocks = cs ? cs->gs_min_blocks : 0;
}

extern "C" void cuda_session_gemv_smem_kind_minima(const struct cuda_session *cs, int32_t *res, int32_t *pair,
                                                   int32_t *multi)
{
    *res = cs ? cs->gs_res_min_blocks : 0;
    *pair = cs ? cs->gs_pair_min_blocks : 0;
    *multi = cs ? cs->gs_multi_min_blocks : 0;
}

extern "C" bool cuda_session_uses_megakernel(const struct cuda_session *cs, const char **why)
{
    if (why)
        *why = cs->mk ? "" : cs->mk_why;
    return cs->mk != NULL;
}
