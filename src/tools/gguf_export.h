/*
 * gguf_export.h — writing a model as a llama.cpp-compatible GGUF file (qwen3 / qwen35).
 *
 * The exporter knows, for a geometry, the list of tensors llama.cpp expects (names, shapes in
 * ggml order, the kind of each), writes the architecture metadata, and asks a source callback
 * for each tensor's values as f32 in llama.cpp's conventions (Qwen3.5 norms as 1+w,
 * ssm_a = -exp(A_log), V heads tiled). It then stores each tensor in the chosen type:
 * 1-D tensors and conv weights stay F32 (as llama.cpp does), matrices take the requested
 * type, with the usual _M mixture for K-quants. Used by `qwenrt synth` and `qwenrt convert`.
 */
#ifndef QWENRT_TOOLS_GGUF_EXPORT_H
#define QWENRT_TOOLS_GGUF_EXPORT_H

#include "format/dtype.h"
#include "format/gguf.h"
#include "model/hparams.h"
#include "qwenrt.h"

enum export_kind {
    EXPORT_MATRIX,   /* [ne1 rows][ne0], quantisable */
    EXPORT_EMBED,    /* token_embd / output: a matrix with its own type in _M mixtures */
    EXPORT_VECTOR,   /* norms, dt_bias, ssm_a: F32 */
    EXPORT_CONV,     /* ssm_conv1d [conv_dim][k]: F32 */
};

/* Which tensor a spec is, for sources that need to know (llama.cpp role names). */
struct export_spec {
    char name[64];        /* llama.cpp name, e.g. "blk.3.attn_q.weight" */
    int64_t ne0, ne1;     /* ggml order: row length, rows (ne1 = 1 for vectors) */
    enum export_kind kind;
    int32_t layer;        /* -1 for globals */
};

/* Output types: a plain dtype, or a K-quant mixture (Q4_K_M, Q5_K_M). */
enum export_type {
    EXPORT_F32, EXPORT_F16, EXPORT_BF16, EXPORT_Q8_0, EXPORT_Q4_0, EXPORT_Q4_K_M,
    EXPORT_Q5_K_M, EXPORT_Q6_K, EXPORT_TYPE_COUNT
};

/* "f32", "q4_k_m", ... ; -1 when unknown. */
int export_type_from_name(const char *name);
const char *export_type_name(enum export_type t);

/* Fills dst[ne1][ne0] with the tensor's values. */
typedef qwenrt_status (*export_source_fn)(void *user, const struct export_spec *spec, float *dst,
                                          struct qwenrt_error *err);

struct export_params {
    enum export_type type;
    const char *name;              /* general.name */
    bool tied;                     /* no output.weight (the LM head is the embedding) */
    const char *tokenizer_json;    /* tokenizer to embed (NULL: none) */
    const struct gguf_file *tokenizer_gguf; /* or copy the tokenizer from this GGUF */
    bool progress;                 /* print a progress bar to stderr */
};

/* Lists the tensors of geometry hp (caller frees *specs with xfree). */
qwenrt_status export_list_tensors(const struct model_hparams *hp, bool tied,
                                  struct export_spec **specs, int32_t *n, struct qwenrt_error *err);

/* The storage type chosen for a tensor under export type t (F32 for vectors). */
enum qr_dtype export_tensor_dtype(const struct model_hparams *hp, enum export_type t,
                                  const struct export_spec *spec);

/* Writes the whole GGUF (tmp + rename). */
qwenrt_status export_gguf(const char *path, const struct model_hparams *hp,
                          const struct export_params *params, export_source_fn source, void *user,
                          struct qwenrt_error *err);

#endif
