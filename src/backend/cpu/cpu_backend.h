/*
 * cpu_backend.h — executing a plan on the CPU.
 *
 * A run processes T tokens at positions pos0..pos0+T-1 of one sequence. Activation buffers
 * are [T][width] f32 (the plan says the widths); the sequence state lives in struct seq_state:
 *   k_cache[l], v_cache[l]: [n_ctx][n_head_kv*head_dim] f32, position-major (attention layers);
 *     with kv_f16 the rows live in k_cache16 / v_cache16 as f16 bits instead (k_cache[l] NULL):
 *     write them with kv_store_row, read them with kv_load
 *   conv_state[l]: [conv_k-1][conv_dim] f32, oldest row first (DeltaNet layers)
 *   ssm_state[l]:  [n_v_heads][k_dim][v_dim] f32 (DeltaNet layers)
 * Entries are NULL for layers of the other kind.
 *
 * Each op kind has kernels registered under "<op>.<impl>" keys (cpu_op_kernels); binding
 * picks the best one that can run unless a key is forced (profiles).
 */
#ifndef QWENRT_BACKEND_CPU_BACKEND_H
#define QWENRT_BACKEND_CPU_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include <string.h>

#include "base/half.h"
#include "plan/plan.h"
#include "qwenrt.h"

struct seq_state {
    int32_t n_layer;
    int32_t n_ctx;        /* positions the KV cache holds */
    float **k_cache;      /* [n_layer] -> [n_ctx][kv_width] or NULL */
    float **v_cache;      /* [n_layer] -> [n_ctx][kv_width] or NULL */
    bool kv_f16;          /* the cache in f16 (qwenrt_session_params.kv_type): the rows below */
    uint16_t **k_cache16; /* kv_f16: [n_layer] -> [n_ctx][kv_width] f16 bits or NULL; else NULL */
    uint16_t **v_cache16;
    int32_t kv_width;     /* n_head_kv * head_dim */
    float **conv_state;   /* [n_layer] -> [conv_k-1][conv_dim] or NULL */
    float **ssm_state;    /* [n_layer] -> [Hv][k_dim][v_dim] or NULL */
    int32_t conv_rows, conv_dim;
    int64_t ssm_len;      /* floats per layer of ssm_state */
};

#define QR_KV_ROW_MAX 1024 /* head_dim at most (hparams refuse more): one head's row on the stack */

/* Position p's row (kv_width floats) into layer l's K (v false) or V cache, rounded to f16
 * with kv_f16. */
static inline void kv_store_row(struct seq_state *s, int32_t l, bool v, int32_t p, const float *row)
{
    size_t at = (size_t)p * (size_t)s->kv_width;
    if (!s->kv_f16) {
        memcpy((v ? s->v_cache[l] : s->k_cache[l]) + at, row, (size_t)s->kv_width * sizeof(float));
        return;
    }
    uint16_t *dst = (v ? s->v_cache16[l] : s->k_cache16[l]) + at;
    for (int32_t i = 0; i < s->kv_width; i++)
        dst[i] = f32_to_f16(row[i]);
}

/* n floats of position p's row of layer l's K or V cache from element off, into out. */
static inline void kv_load(const struct seq_state *s, int32_t l, bool v, int32_t p, int32_t off, int32_t n,
                           float *out)
{
    size_t at = (size_t)p * (size_t)s->kv_width + (size_t)off;
    if (!s->kv_f16) {
        memcpy(out, (v ? s->v_cache[l] : s->k_cache[l]) + at, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *src = (v ? s->v_cache16[l] : s->k_cache16[l]) + at;
    for (int32_t i = 0; i < n; i++)
        out[i] = f16_to_f32(src[i]);
}

/* Called after ops that have a dump name: data is [T][width]. */
typedef void (*cpu_dump_fn)(void *user, const char *name, int32_t layer, const float *data,
                            int32_t T, int32_t width);

struct cpu_exec {
    const struct plan *plan;
    float *bufs[PLAN_MAX_BUFS]; /* [T][width] each; logits buffer sized for the rows asked */
    int32_t T;                  /* tokens in this run */
    int32_t pos0;               /* position of the first token */
    const int32_t *ids;         /* [T] token ids */
    bool all_logits;            /* logits for every position (else only the last) */
    struct seq_state *state;
    int n_threads;
    uint32_t cpu_features;
    cpu_dump_fn dump;
    void *dump_user;
    float *scratch;             /* per-run scratch, see cpu_exec_scratch_floats */
    int64_t scratch_len;
};

typedef void (*cpu_op_fn)(const struct plan_op *op, struct cpu_exec *ex);

struct cpu_op_kernel {
    const char *key;       /* "rmsnorm.ref", "attention.avx512", ... */
    enum op_kind kind;
    uint32_t cpu_features; /* CPU_* bits needed */
    int priority;          /* higher wins */
    cpu_op_fn fn;
};

const struct cpu_op_kernel *cpu_op_kernels(void); /* NULL-key terminated */

/* The kernel for op kind (forced by key when key is non-NULL); NULL if none can run. */
const struct cpu_op_kernel *cpu_op_pick(enum op_kind kind, uint32_t features, const char *key);

/* Floats of scratch memory a run of T tokens of this plan needs. */
int64_t cpu_exec_scratch_floats(const struct plan *p, const struct seq_state *s, int32_t T);

/* Runs every op of the plan with kernels bound by `fns` (one per op, from cpu_bind_plan). */
qwenrt_status cpu_run_plan(struct cpu_exec *ex, cpu_op_fn const *fns, struct qwenrt_error *err);

/* Binds each op to a kernel (op->kernel overrides when set). fns has plan->n_ops entries. */
qwenrt_status cpu_bind_plan(const struct plan *p, uint32_t features, cpu_op_fn *fns,
                            struct qwenrt_error *err);

/* Reference kernels (kernels_ref.c): plain C, f32, obviously right. */
void embed_ref(const struct plan_op *op, struct cpu_exec *ex);
void rmsnorm_ref(const struct plan_op *op, struct cpu_exec *ex);
void matmul_op(const struct plan_op *op, struct cpu_exec *ex);
void add_ref(const struct plan_op *op, struct cpu_exec *ex);
void qk_norm_rope_ref(const struct plan_op *op, struct cpu_exec *ex);
void attention_ref(const struct plan_op *op, struct cpu_exec *ex);
void sigmoid_gate_ref(const struct plan_op *op, struct cpu_exec *ex);
void swiglu_ref(const struct plan_op *op, struct cpu_exec *ex);
void gdn_conv_ref(const struct plan_op *op, struct cpu_exec *ex);
void gdn_core_ref(const struct plan_op *op, struct cpu_exec *ex);
void gated_rmsnorm_ref(const struct plan_op *op, struct cpu_exec *ex);
void logits_op(const struct plan_op *op, struct cpu_exec *ex);

/* attention_ref with AVX-512 dot products (attention_avx512.c); f32 rounding vs the ref. */
void attention_avx512(const struct plan_op *op, struct cpu_exec *ex);
/* The same with AVX2, FMA and F16C (attention_avx2.c), for CPUs without AVX-512. */
/* Their shared op-level loop (attention_run.c): to_f16 converts n floats into f16 bits for an
 * f16 cache's new rows (an f32 cache takes kv_store_row); head computes one (token, head) over
 * the cache rows (f32 kc/vc or f16 kh/vh, the others NULL), scores being n_pos floats of the
 * thread's scratch. */
typedef void (*attention_store_fn)(uint16_t *dst, const float *src, int32_t n);
typedef void (*attention_head_fn)(const float *q, float *o, const float *kc, const float *vc, const uint16_t *kh,
                                  const uint16_t *vh, int32_t kvw, int32_t off, int32_t hd, int32_t last,
                                  float scale, float *scores);
void attention_run(const struct plan_op *op, struct cpu_exec *ex, attention_store_fn to_f16,
                   attention_head_fn head);
void attention_avx2(const struct plan_op *op, struct cpu_exec *ex);
/* y[i] = e^x[i] (x <= 0) as attention_avx2's softmax computes it (for the tests). */
void attention_avx2_exp(const float *x, float *y, int32_t n);
/* Its softmax's e^x (x <= 0) over n values, for the tests against expf (AVX-512F only). */
void attention_avx512_exp(const float *x, float *y, int32_t n);

/* Gated DeltaNet core in chunks (gdn_chunked.c): exact to f32 rounding vs gdn_core_ref. */
void gdn_core_chunked(const struct plan_op *op, struct cpu_exec *ex);
void gdn_core_chunked_avx512(const struct plan_op *op, struct cpu_exec *ex);
int64_t gdn_chunked_scratch_floats(const struct plan_op *op); /* scratch floats it needs */

#endif
