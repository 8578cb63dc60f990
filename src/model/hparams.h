/*
 * hparams.h — a model's hyper-parameters (read-only after load), for both architectures.
 *
 * Filled from a Hugging Face config.json (hparams_from_hf_config) or GGUF metadata
 * (hparams_from_gguf), then checked by hparams_validate before any tensor is looked at.
 */
#ifndef QWENRT_MODEL_HPARAMS_H
#define QWENRT_MODEL_HPARAMS_H

#include <stdbool.h>
#include <stdint.h>

#include "format/gguf.h"
#include "qwenrt.h"

#define QR_MAX_LAYERS 256

enum qr_arch {
    ARCH_QWEN3 = 0,  /* dense: every layer is grouped-query attention */
    ARCH_QWEN35 = 1, /* hybrid: Gated DeltaNet layers + gated attention layers */
};

struct model_hparams {
    enum qr_arch arch;
    char name[128];         /* general.name or the config's model_type */
    int32_t n_vocab;        /* embedding rows */
    int32_t n_embd;         /* hidden size */
    int32_t n_layer;        /* decoder layers */
    int32_t n_ff;           /* MLP intermediate size */
    int32_t n_ctx_train;    /* max_position_embeddings */
    float rms_eps;          /* RMSNorm epsilon */
    /* attention layers */
    int32_t n_head;         /* query heads */
    int32_t n_head_kv;      /* key/value heads */
    int32_t head_dim;       /* per head */
    int32_t n_rot;          /* rotary dims per head (head_dim, or head_dim/4 for qwen35) */
    float rope_theta;       /* RoPE base */
    bool attn_gated;        /* qwen35: q_proj holds [query | gate] per head */
    /* Gated DeltaNet layers (qwen35) */
    bool is_recurrent[QR_MAX_LAYERS]; /* layer i is a DeltaNet layer */
    int32_t ssm_conv;       /* causal conv kernel width (4) */
    int32_t ssm_n_k_heads;  /* key heads */
    int32_t ssm_n_v_heads;  /* value heads */
    int32_t ssm_k_dim;      /* key head size */
    int32_t ssm_v_dim;      /* value head size */
    /* special tokens (-1 when unknown) */
    int32_t bos_id, eos_id;
};

static inline int32_t hparams_ssm_conv_dim(const struct model_hparams *hp)
{
    return 2 * hp->ssm_n_k_heads * hp->ssm_k_dim + hp->ssm_n_v_heads * hp->ssm_v_dim;
}

/* Parses a Hugging Face config.json text (flat Qwen3 or multimodal Qwen3.5 with text_config).
 * path is used in messages. Errors: FORMAT (not JSON, missing/ill-typed key), UNSUPPORTED. */
qwenrt_status hparams_from_hf_config(struct model_hparams *hp, const char *json_text,
                                     const char *path, struct qwenrt_error *err);

/* Reads general.architecture and <arch>.* keys of a GGUF file. */
qwenrt_status hparams_from_gguf(struct model_hparams *hp, const struct gguf_file *gf,
                                struct qwenrt_error *err);

/* Checks ranges and consistency (positive sizes, heads divide, limits). */
qwenrt_status hparams_validate(const struct model_hparams *hp, const char *path,
                               struct qwenrt_error *err);

const char *arch_name(enum qr_arch arch); /* "qwen3" / "qwen35" */

#endif
