/*
 * model.h — a loaded model: hyper-parameters, the files it maps, weight views, and the plans
 * its architecture builds. Read-only after qwenrt_model_load (but for the device copy of the
 * weights its CUDA sessions share, under its own lock); shared by sessions.
 *
 * Weight tensors are views into the mapped files. Small vectors (norm weights, DeltaNet
 * A/dt_bias/conv weights) are converted at load into owned f32 arrays in one convention:
 *   - norm weights are the multiplier actually applied (Qwen3.5's HF (1+w) is stored as 1+w,
 *     as GGUF files already do), so kernels use a plain RMSNorm;
 *   - ssm_a holds -exp(A_log) (GGUF's ssm_a) for both formats.
 * The one convention that stays a flag is the DeltaNet value-head order (v_head_tiled).
 */
#ifndef QWENRT_MODEL_MODEL_H
#define QWENRT_MODEL_MODEL_H

#include <pthread.h>

#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/hparams.h"
#include "plan/plan.h"
#include "qwenrt.h"

#define MODEL_MAX_SHARDS 64

struct owned_chunk;
struct transcoded_tensor;
struct cuda_weights;

/* The device copy of the weights that the model's CUDA sessions share (device_weights.cu): the
 * first session uploads it, the last one frees it. The one part of a model that changes after
 * load, so it has a lock of its own. */
struct model_device_weights {
    pthread_mutex_t mu;        /* guards cuda */
    struct cuda_weights *cuda; /* NULL while no CUDA session of the model is open */
};

struct layer_weights {
    const float *attn_norm;           /* [n_embd] input_layernorm */
    const float *ffn_norm;            /* [n_embd] post_attention_layernorm */
    /* attention layers */
    const struct qr_tensor *wq;       /* [n_head*head_dim*(gated?2:1)][n_embd] */
    const struct qr_tensor *wk;       /* [n_head_kv*head_dim][n_embd] */
    const struct qr_tensor *wv;       /* [n_head_kv*head_dim][n_embd] */
    const struct qr_tensor *wo;       /* [n_embd][n_head*head_dim] */
    const float *q_norm, *k_norm;     /* [head_dim] */
    /* Gated DeltaNet layers */
    const struct qr_tensor *ssm_qkv;  /* [conv_dim][n_embd] in_proj_qkv */
    const struct qr_tensor *ssm_z;    /* [Hv*v_dim][n_embd] in_proj_z */
    const struct qr_tensor *ssm_beta; /* [Hv][n_embd] in_proj_b */
    const struct qr_tensor *ssm_alpha;/* [Hv][n_embd] in_proj_a */
    const struct qr_tensor *ssm_out;  /* [n_embd][Hv*v_dim] out_proj */
    const float *ssm_conv;            /* [conv_dim][conv_k] */
    const float *ssm_dt;              /* [Hv] dt_bias */
    const float *ssm_a;               /* [Hv] -exp(A_log) */
    const float *ssm_norm;            /* [v_dim] plain weight */
    /* MLP */
    const struct qr_tensor *ffn_gate, *ffn_up; /* [n_ff][n_embd] */
    const struct qr_tensor *ffn_down;          /* [n_embd][n_ff] */
};

struct model_weights {
    const struct qr_tensor *tok_embd; /* [n_vocab][n_embd] */
    const struct qr_tensor *output;   /* LM head [n_vocab][n_embd] (tok_embd when tied) */
    const float *output_norm;         /* [n_embd] */
    struct layer_weights *layers;     /* [n_layer] */
};

enum model_format { MODEL_FORMAT_GGUF, MODEL_FORMAT_HF };

/* Shape choices for the CUDA decode that a runtime profile made (runtime.inference.cudaTuning,
 * written by `qwenrt calibrate --backend cuda`); 0 everywhere: the session's own picks. CUDA
 * sessions copy them into their cuda_options (cuda_backend.h has each field's meaning). */
struct model_cuda_tuning {
    int32_t gemv_smem_warps, gemv_smem_kb, gemv_smem_launch;
    int32_t gemvq_rows, gemvq_launch, gemvq_warps, gemvq_smem_kb;
    bool pdl; /* every decode launch with PDL (16-bit weights have it anyway) */
    int32_t attn_split_min;
    /* the attention's cluster merge: 0 the session picks, -1 never, 1 always, 2 in the window
     * [attn_cluster_from, attn_cluster_until) (0 each: the session's window) */
    int32_t attn_cluster, attn_cluster_from, attn_cluster_until;
};

struct qwenrt_model {
    struct model_hparams hp;
    enum model_format format;
    char *path;                       /* what the user gave */
    struct gguf_file gguf;            /* when format == GGUF */
    struct safetensors_file *shards;  /* [n_shards] when format == HF */
    int32_t n_shards;
    struct model_weights w;
    bool v_head_tiled;                /* DeltaNet value heads in GGUF (tiled) order */
    struct owned_chunk *owned;        /* small f32 vectors converted at load (a list) */
    /* The backend's stored weight types (model_load_for); a matrix of another type is bound
     * as its transcoded copy (quant/transcode.h), made once per file tensor. */
    bool (*weight_dtype_ok)(int32_t dtype);
    struct transcoded_tensor *transcoded; /* those copies (a list) */
    bool layers_f16;                  /* some layer matrix is converted to F16, so every
                                       * block-quantised one is (model_load_for) */
    struct plan plans[2];             /* [PHASE_PREFILL], [PHASE_DECODE] */
    struct model_cuda_tuning cuda_tuning; /* from the profile the model was bound under */
    struct model_device_weights device_weights; /* its sessions' copy on the GPU */
    int n_threads;
    char backend[16];
    int64_t n_params, weight_bytes;
};

/* qwenrt_model_load with the stored weight types the backend computes with given: a matrix
 * whose type weight_dtype_ok refuses is bound as a copy in transcode_target's type (Q4_0, Q5_0
 * and IQ4_NL as Q8_0, Q3_K as Q6_K, exactly; others as F16). Where that makes some layer
 * matrix F16, every block-quantised layer matrix whose target is F16 is converted too (Q5_K_M
 * on the GPU: its Q6_K layer matrices with its Q5_K ones; the embedding keeps its type), unless
 * params->keep_layer_types. weight_dtype_ok NULL: the backend's own
 * (cuda_weight_dtype_supported, cpu_weight_dtype_supported). Tests pass their own. */
qwenrt_status model_load_for(const char *path, const struct qwenrt_model_params *params,
                             bool (*weight_dtype_ok)(int32_t dtype), struct qwenrt_model **out,
                             struct qwenrt_error *err);

/* Name mapping: the tensor called `gguf_name` (llama.cpp spelling, e.g. "blk.3.attn_q.weight")
 * in whatever format the model was loaded from, or NULL. */
const struct qr_tensor *model_find_tensor(const struct qwenrt_model *m, const char *gguf_name);

/* Translates a llama.cpp tensor name to the Hugging Face name for arch; false if unknown. */
bool names_gguf_to_hf(enum qr_arch arch, const char *gguf_name, char *out, size_t out_len);

/* Architecture files: bind weights (with shape checks) and build the two plans. */
qwenrt_status qwen3_load_weights(struct qwenrt_model *m, struct qwenrt_error *err);
qwenrt_status qwen35_load_weights(struct qwenrt_model *m, struct qwenrt_error *err);
qwenrt_status qwen3_build_plan(const struct qwenrt_model *m, struct plan *p, struct qwenrt_error *err);
qwenrt_status qwen35_build_plan(const struct qwenrt_model *m, struct plan *p, struct qwenrt_error *err);

/* Helpers for the architecture files (model_load.c). */
/* Finds "<fmt>" (printf with layer) and checks dtype can be used and ne matches (ne0, ne1);
 * ne1 = 0 means a 1-D tensor of ne0 elements. required=false returns OK with *out = NULL. */
qwenrt_status model_bind_matrix(struct qwenrt_model *m, const struct qr_tensor **out, int64_t ne0,
                                int64_t ne1, bool required, struct qwenrt_error *err,
                                const char *fmt, ...);
/* Finds a small tensor of n elements and returns an owned f32 copy (+add to each element). */
qwenrt_status model_bind_vector(struct qwenrt_model *m, const float **out, int64_t n, float add,
                                struct qwenrt_error *err, const char *fmt, ...);
/* Owned f32 storage for n floats (lives as long as the model). */
float *model_alloc_floats(struct qwenrt_model *m, size_t n);

#endif
