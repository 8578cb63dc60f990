/*
 * cuda_stub.c — the CUDA backend's interface when qwenrt is built without nvcc: every entry
 * point reports that CUDA is not compiled in, so the session and tools need no #ifdef.
 * With CUDA (QWENRT_HAVE_CUDA, set by cmake/cuda.cmake) the .cu files define them instead
 * and this file is empty.
 */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_checks.h"

#ifndef QWENRT_HAVE_CUDA

#include "base/error.h"

#include <string.h>

static qwenrt_status not_built(struct qwenrt_error *err)
{
    return err_set(err, QWENRT_ERR_BACKEND,
                   "cuda: qwenrt was built without CUDA (nvcc was not found when CMake ran)");
}

struct cuda_options cuda_default_options(void)
{
    /* the CUDA build's defaults (session_options.cu), by name: a new field cannot shift them */
    struct cuda_options o = {.graph = true, .fuse = true, .gemm_bf16x2 = true, .gemv_max_T = 8,
                             .gemv_v2 = true, .pdl = false, .gemm_cache = true, .attn_tiled = true,
                             .gdn_par = true, .gdn_chunked = 0, .gemm_stack3 = true, .gemm_merge = true,
                             .attn_gemm = true, .mega = CUDA_MEGA_AUTO, .mega_threads = 256,
                             .mega_fuse_down = false, .attn_split = true, .attn_rope = true, .attn_flash = true,
                             .gdn_split = true, .mlp_fused = false, .gemv_smem = true,
                             .gemv_smem_warps = 0, .gemv_smem_kb = 0, .gemv_smem_launch = 0, .gemv_mma = false,
                             .gemvq_rows = 0, .gemvq_launch = 0, .gemvq_warps = 0, .gemvq_smem_kb = 0,
                             .gemvq_head_blocks = 4, .gemvq_int8 = 0, .kv_f16 = false,
                             .prefill_bf16 = true, .prefill_x_terms = 0};
    return o;
}

bool cuda_backend_compiled(void) { return false; }

qwenrt_status cuda_probe(int64_t need_bytes, struct qwenrt_error *err)
{
    (void)need_bytes;
    return not_built(err);
}

void cuda_device_describe(char *out, int out_len)
{
    if (out_len > 0)
        out[0] = '\0';
}

qwenrt_status cuda_session_init(const struct plan *plans, int32_t n_ctx,
                                const struct cuda_options *opt, struct cuda_session **out,
                                struct qwenrt_error *err)
{
    (void)plans, (void)n_ctx, (void)opt;
    *out = NULL;
    return not_built(err);
}

void cuda_session_free(struct cuda_session *cs) { (void)cs; }

qwenrt_status cuda_session_init_shared(const struct plan *plans, int32_t n_ctx,
                                       const struct cuda_options *opt, pthread_mutex_t *mu,
                                       struct cuda_weights **slot, struct cuda_session **out,
                                       struct qwenrt_error *err)
{
    (void)mu, (void)slot;
    return cuda_session_init(plans, n_ctx, opt, out, err);
}

const void *cuda_session_weights(const struct cuda_session *cs)
{
    (void)cs;
    return NULL;
}

qwenrt_status cuda_session_run(struct cuda_session *cs, const int32_t *ids, int32_t T,
                               int32_t pos0, bool all_logits, float *logits, cuda_dump_fn dump,
                               void *dump_user, struct qwenrt_error *err)
{
    (void)cs, (void)ids, (void)T, (void)pos0, (void)all_logits, (void)logits, (void)dump,
        (void)dump_user;
    return not_built(err);
}

qwenrt_status cuda_session_logits(struct cuda_session *cs, float *dst, struct qwenrt_error *err)
{
    (void)cs, (void)dst;
    return not_built(err);
}

qwenrt_status cuda_session_top(struct cuda_session *cs, float temperature, int32_t m,
                               const int32_t *gather, int32_t n_gather, int32_t *ids, float *vals,
                               float *gather_vals, struct qwenrt_error *err)
{
    (void)cs, (void)temperature, (void)m, (void)gather, (void)n_gather, (void)ids, (void)vals,
        (void)gather_vals;
    return not_built(err);
}

qwenrt_status cuda_session_top_start(struct cuda_session *cs, float temperature, int32_t m,
                                     const int32_t *gather, int32_t n_gather, struct qwenrt_error *err)
{
    (void)cs, (void)temperature, (void)m, (void)gather, (void)n_gather;
    return not_built(err);
}

qwenrt_status cuda_sessions_top_start(struct cuda_session *const *css, int32_t n, float temperature,
                                      int32_t m, struct qwenrt_error *err)
{
    (void)css, (void)n, (void)temperature, (void)m;
    return not_built(err);
}

qwenrt_status cuda_warp_sum_each_host(int32_t n, int32_t warps, const float *x, float *each, float *plain,
                                      struct qwenrt_error *err)
{
    (void)n, (void)warps, (void)x, (void)each, (void)plain;
    return not_built(err);
}

qwenrt_status cuda_att_exp_host(int32_t count, const float *x, float *fast, float *plain, struct qwenrt_error *err)
{
    (void)count, (void)x, (void)fast, (void)plain;
    return not_built(err);
}

qwenrt_status cuda_topk_host(const float *logits, int32_t V, float temperature, int32_t m,
                             const int32_t *gather, int32_t n_gather, bool reference, int32_t *ids,
                             float *vals, float *gather_vals, struct qwenrt_error *err)
{
    (void)logits, (void)V, (void)temperature, (void)m, (void)gather, (void)n_gather, (void)reference,
        (void)ids, (void)vals, (void)gather_vals;
    return not_built(err);
}

qwenrt_status cuda_topk_rows_host(const float *logits, int32_t n, int32_t V, float temperature, int32_t m,
                                  int32_t *ids, float *vals, struct qwenrt_error *err)
{
    (void)logits, (void)n, (void)V, (void)temperature, (void)m, (void)ids, (void)vals;
    return not_built(err);
}

qwenrt_status cuda_session_generate(struct cuda_session *cs, int32_t id, int32_t pos0,
                                    int32_t n, int32_t readback_every, int32_t *out_ids,
                                    float *last_logits, struct qwenrt_error *err)
{
    (void)cs, (void)id, (void)pos0, (void)n, (void)readback_every, (void)out_ids, (void)last_logits;
    return not_built(err);
}

qwenrt_status cuda_session_generate_sampled(struct cuda_session *cs, int32_t id, int32_t pos0, int32_t n,
                                            const struct cuda_sample_params *sp, int32_t *out_ids,
                                            struct qwenrt_error *err)
{
    (void)cs, (void)id, (void)pos0, (void)n, (void)sp, (void)out_ids;
    return not_built(err);
}

qwenrt_status cuda_sample_host(const int32_t *ids, const float *vals, const struct cuda_sample_params *sp,
                               int32_t draw, int32_t *id, struct qwenrt_error *err)
{
    (void)ids, (void)vals, (void)sp, (void)draw, (void)id;
    return not_built(err);
}

qwenrt_status cuda_session_snapshot(struct cuda_session *cs, bool restore, struct qwenrt_error *err)
{
    (void)cs, (void)restore;
    return not_built(err);
}

qwenrt_status cuda_pick_bench(int32_t V, int32_t m, int32_t reps, double *argmax_us, double *topk_us,
                              double *sample_us, struct qwenrt_error *err)
{
    (void)V, (void)m, (void)reps, (void)argmax_us, (void)topk_us, (void)sample_us;
    return not_built(err);
}

qwenrt_status cuda_batch_decode(struct cuda_session *const *css, const int32_t *ids,
                                const int32_t *pos, int32_t n, float *logits,
                                struct qwenrt_error *err)
{
    (void)css, (void)ids, (void)pos, (void)n, (void)logits;
    return not_built(err);
}

bool cuda_batch_pays(const struct cuda_session *cs, int32_t n)
{
    (void)cs, (void)n;
    return false;
}

int32_t cuda_batch_seq_steps(const struct cuda_session *cs)
{
    (void)cs;
    return 0;
}

qwenrt_status cuda_session_state_io(struct cuda_session *cs, int32_t layer,
                                    enum cuda_state_part part, int64_t n_floats, float *host,
                                    bool to_host, struct qwenrt_error *err)
{
    (void)cs, (void)layer, (void)part, (void)n_floats, (void)host, (void)to_host;
    return not_built(err);
}

qwenrt_status cuda_session_reset(struct cuda_session *cs, struct qwenrt_error *err)
{
    (void)cs;
    return not_built(err);
}

qwenrt_status cuda_session_read_kv(struct cuda_session *cs, int32_t layer, bool v,
                                   int32_t n_pos, float *dst, struct qwenrt_error *err)
{
    (void)cs, (void)layer, (void)v, (void)n_pos, (void)dst;
    return not_built(err);
}

qwenrt_status cuda_session_profile_decode(struct cuda_session *cs, int32_t id, int32_t pos,
                                          int32_t reps, char *report, size_t report_len,
                                          struct qwenrt_error *err)
{
    (void)cs, (void)id, (void)pos, (void)reps;
    if (report_len)
        report[0] = 0;
    return not_built(err);
}

qwenrt_status cuda_session_profile_prefill(struct cuda_session *cs, const int32_t *ids, int32_t T,
                                           char *report, size_t report_len,
                                           struct qwenrt_error *err)
{
    (void)cs, (void)ids, (void)T;
    if (report_len)
        report[0] = 0;
    return not_built(err);
}

void cuda_session_gemv_smem_shape(const struct cuda_session *cs, int32_t *warps, int32_t *kb, int32_t *launch,
                                  int32_t *min_blocks)
{
    (void)cs;
    *warps = *kb = *launch = *min_blocks = 0;
}

void cuda_session_gemv_smem_kind_minima(const struct cuda_session *cs, int32_t *res, int32_t *pair, int32_t *multi)
{
    (void)cs;
    *res = *pair = *multi = 0;
}

bool cuda_session_uses_megakernel(const struct cuda_session *cs, const char **why)
{
    (void)cs;
    if (why)
        *why = "CUDA is not compiled in";
    return false;
}

qwenrt_status cuda_sm_clock(int32_t warm_ms, int32_t ms, double *mhz, double *rated_mhz, struct qwenrt_error *err)
{
    (void)warm_ms, (void)ms, (void)mhz, (void)rated_mhz;
    return not_built(err);
}

qwenrt_status cuda_launch_floor_bench(int32_t n_launch, int32_t blocks, int32_t threads, int32_t cluster,
                                      bool pdl, int32_t reps, double *us, struct qwenrt_error *err)
{
    (void)n_launch, (void)blocks, (void)threads, (void)cluster, (void)pdl, (void)reps, (void)us;
    return not_built(err);
}

int32_t cuda_session_count_steps(const struct cuda_session *cs, const char *label)
{
    (void)cs, (void)label;
    return 0;
}

int32_t cuda_gdn_staged_bytes(int32_t dk, int32_t dv, bool wide)
{
    (void)dk, (void)dv, (void)wide;
    return 0;
}

int64_t cuda_session_gen_graph_launches(const struct cuda_session *cs)
{
    (void)cs;
    return 0;
}

qwenrt_status cuda_session_prepare_generate(struct cuda_session *cs, struct qwenrt_error *err)
{
    (void)cs;
    return not_built(err);
}

void cuda_session_prefill_graphs(const struct cuda_session *cs, int64_t counts[3], const char **why)
{
    (void)cs;
    counts[0] = counts[1] = counts[2] = 0;
    if (why)
        *why = "";
}

bool cuda_session_lm_screen(const struct cuda_session *cs, int64_t *picks, int64_t *exact_rows)
{
    (void)cs;
    *picks = *exact_rows = 0;
    return false;
}

qwenrt_status cuda_session_lm_screen_time(struct cuda_session *cs, int32_t reps, double *us,
                                          struct qwenrt_error *err)
{
    (void)cs, (void)reps, (void)us;
    return not_built(err);
}

qwenrt_status cuda_session_lm_screen_probe(struct cuda_session *cs, int32_t reps, int32_t parts, double *us,
                                           struct qwenrt_error *err)
{
    (void)cs, (void)reps, (void)parts, (void)us;
    return not_built(err);
}

void cuda_session_buffer_addresses(const struct cuda_session *cs, uint64_t addr[4])
{
    (void)cs;
    memset(addr, 0, 4 * sizeof(uint64_t));
}

qwenrt_status cuda_bench_streams(int32_t n, void **streams, struct qwenrt_error *err)
{
    (void)n, (void)streams;
    return not_built(err);
}

void cuda_bench_streams_free(int32_t n, void **streams)
{
    (void)n, (void)streams;
}

qwenrt_status cuda_bench_alloc_churn(int32_t n_big, int32_t n_small, struct qwenrt_error *err)
{
    (void)n_big, (void)n_small;
    return not_built(err);
}

bool cuda_session_lm_screen_buffers(const struct cuda_session *cs, uint64_t addr[4])
{
    (void)cs;
    memset(addr, 0, 4 * sizeof(uint64_t));
    return false;
}

qwenrt_status cuda_session_timeline(struct cuda_session *cs, int32_t id, int32_t pos, int32_t reps, char *report,
                                    size_t report_len, struct qwenrt_error *err)
{
    (void)cs, (void)id, (void)pos, (void)reps, (void)report, (void)report_len;
    return not_built(err);
}

int64_t cuda_session_l2_prefetch_bytes(const struct cuda_session *cs)
{
    (void)cs;
    return 0;
}

int64_t cuda_session_device_bytes(const struct cuda_session *cs)
{
    (void)cs;
    return 0;
}

bool cuda_decode_plan_takes_pdl(const struct plan *decode_plan)
{
    (void)decode_plan;
    return false;
}

bool cuda_gemv_smem_takes(int32_t dtype, int32_t N, int32_t K)
{
    (void)dtype, (void)N, (void)K;
    return false;
}

bool cuda_gemv_batch_takes(int32_t dtype, int32_t N, int32_t K, int32_t T)
{
    (void)dtype, (void)N, (void)K, (void)T;
    return false;
}

qwenrt_status cuda_gemv_host(const struct cuda_gemv_case *c, bool batch, struct qwenrt_error *err)
{
    (void)c, (void)batch;
    return not_built(err);
}

bool cuda_gemv_mma_takes(int32_t N, int32_t K)
{
    (void)N, (void)K;
    return false;
}

int32_t cuda_gemv_smem_xreg_chunks(int32_t dtype, int32_t N, int32_t K)
{
    (void)dtype, (void)N, (void)K;
    return 0;
}

int32_t cuda_gemv_smem_grid(int32_t dtype, int32_t N, int32_t K, bool swiglu, int32_t waves, int32_t n_sm,
                            int32_t *warps)
{
    (void)dtype, (void)N, (void)K, (void)swiglu, (void)waves, (void)n_sm, (void)warps;
    return 0;
}

int32_t cuda_gemv_smem_grid_kind(int32_t kind, int32_t set_kind, int32_t N, int32_t K, int32_t min_blocks,
                                 int32_t kind_min, int32_t *warps)
{
    (void)kind, (void)set_kind, (void)N, (void)K, (void)min_blocks, (void)kind_min, (void)warps;
    return 0;
}

int32_t cuda_gemvq_blocks(int32_t dtype, int32_t N, int32_t K, int32_t warps, int32_t rows, int32_t smem_kb)
{
    (void)dtype, (void)N, (void)K, (void)warps, (void)rows, (void)smem_kb;
    return 0;
}

qwenrt_status cuda_gemv_bench(int32_t dtype, int32_t N, int32_t K, int32_t T, bool norm, int32_t kernel,
                              bool pdl, int32_t reps, double *us, double *gbs, double *timeline,
                              struct qwenrt_error *err)
{
    (void)dtype, (void)N, (void)K, (void)T, (void)norm, (void)kernel, (void)pdl, (void)reps, (void)timeline;
    *us = *gbs = 0;
    return not_built(err);
}

qwenrt_status cuda_argmax(const float *x, int32_t n, bool misalign, int32_t blocks, int32_t *id,
                          struct qwenrt_error *err)
{
    (void)x, (void)n, (void)misalign, (void)blocks;
    *id = 0;
    return not_built(err);
}

qwenrt_status cuda_lm_screen_phases(int32_t N, int32_t K, int32_t m, int32_t reps, double *us,
                                    struct qwenrt_error *err)
{
    (void)N, (void)K, (void)m, (void)reps, (void)us;
    return not_built(err);
}

qwenrt_status cuda_test_hold_memory(int64_t leave_bytes, struct cuda_memory_hold **hold, struct qwenrt_error *err)
{
    (void)leave_bytes;
    *hold = NULL;
    return not_built(err);
}

qwenrt_status cuda_device_memory(int64_t *free_bytes, int64_t *total_bytes, struct qwenrt_error *err)
{
    *free_bytes = *total_bytes = 0;
    return not_built(err);
}

qwenrt_status cuda_bench_device_reset(struct qwenrt_error *err)
{
    return not_built(err);
}

qwenrt_status cuda_bench_stream_churn(int32_t n, struct qwenrt_error *err)
{
    (void)n;
    return not_built(err);
}

qwenrt_status cuda_bench_plain_launches(int32_t n, bool memsets, struct qwenrt_error *err)
{
    (void)n, (void)memsets;
    return not_built(err);
}

void cuda_test_release_memory(struct cuda_memory_hold *hold)
{
    (void)hold;
}

qwenrt_status cuda_lm_screen_pick(const float *h, const float *norm_w, float eps, const void *w, int32_t dtype,
                                  int32_t N, int32_t K, int32_t m, int32_t reps, int32_t *id, int32_t *top_ids,
                                  float *top_vals, int64_t *exact_rows, bool *built, struct qwenrt_error *err)
{
    (void)h, (void)norm_w, (void)eps, (void)w, (void)dtype, (void)N, (void)K, (void)m, (void)reps;
    (void)top_ids, (void)top_vals;
    *id = -1, *exact_rows = 0, *built = false;
    return not_built(err);
}

#else
typedef int cuda_stub_unused; /* ISO C wants a non-empty translation unit */
#endif
