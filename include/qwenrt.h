/*
 * qwenrt.h — the public C API of qwenrt, a runtime for small Qwen language models
 * (Qwen3 dense and Qwen3.5 hybrid Gated DeltaNet + gated attention).
 *
 * Objects are opaque handles with _init/_free (or _load/_free) pairs; every _free accepts NULL.
 * Parameters travel in plain structs that qwenrt_*_default_params() fills by value.
 * Every fallible call returns a qwenrt_status (0 = QWENRT_OK, negative = the kind of error) and,
 * when the caller passes a struct qwenrt_error, fills it with a one-line message that names the
 * file, tensor or key involved. The library never exits, aborts or prints on its own.
 *
 * Thread safety: a model is read-only after load and may be shared by sessions on several
 * threads; a session is used by one thread at a time.
 */
#ifndef QWENRT_H
#define QWENRT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QWENRT_VERSION "0.1.0"

typedef enum qwenrt_status {
    QWENRT_OK = 0,
    QWENRT_ERR_INVALID_ARG = -1, /* a parameter or id is out of range */
    QWENRT_ERR_IO = -2,          /* a file could not be opened, read, written or mapped */
    QWENRT_ERR_FORMAT = -3,      /* a file is malformed, truncated or lies about its contents */
    QWENRT_ERR_UNSUPPORTED = -4, /* valid input that qwenrt does not handle (dtype, arch, ...) */
    QWENRT_ERR_NOT_FOUND = -5,   /* a tensor, key or file that must exist is missing */
    QWENRT_ERR_SHAPE = -6,       /* a tensor has the wrong shape or dtype */
    QWENRT_ERR_NOMEM = -7,       /* an allocation failed or a size overflowed */
    QWENRT_ERR_LIMIT = -8,       /* a context, count or length limit was reached */
    QWENRT_ERR_BACKEND = -9,     /* the backend (e.g. CUDA) is unavailable or failed */
    QWENRT_ERR_INTERNAL = -10,   /* a bug in qwenrt: please report it */
} qwenrt_status;

/* Filled by fallible calls; message is one line, NUL-terminated. */
struct qwenrt_error {
    qwenrt_status status;
    char message[512];
};

/* Short constant name of a status, e.g. "format error". Never NULL. */
const char *qwenrt_status_name(qwenrt_status status);

/* ---------------------------------------------------------------- model */

struct qwenrt_model;

struct qwenrt_model_params {
    int n_threads;       /* CPU threads for kernels; 0 = all available cores */
    const char *backend; /* "cpu" (default when NULL) or "cuda" */
    bool keep_layer_types; /* where the backend converts some of a file's layer matrices to F16
                          * (Q5_K_M's Q5_K on "cuda"), the load converts its other block-quantised
                          * layer matrices too (Q5_K_M's Q6_K: layers of one kind decode faster);
                          * true keeps those as stored (less memory, a slower decode) */
};

struct qwenrt_model_params qwenrt_model_default_params(void);

/*
 * Loads a model from a GGUF file or a Hugging Face directory (config.json + *.safetensors).
 * Weights are memory-mapped, not copied. On success *out owns the model; free it with
 * qwenrt_model_free. Errors: IO (missing/unreadable), FORMAT (malformed files), UNSUPPORTED
 * (architecture or dtype), NOT_FOUND / SHAPE (tensors missing or of the wrong shape).
 */
qwenrt_status qwenrt_model_load(const char *path, const struct qwenrt_model_params *params,
                                struct qwenrt_model **out, struct qwenrt_error *err);
void qwenrt_model_free(struct qwenrt_model *model);

/* Geometry and identity of a loaded model. Strings are owned by the model. */
struct qwenrt_model_info {
    const char *arch;      /* "qwen3" or "qwen35" */
    const char *name;      /* model name from metadata, may be "" */
    int32_t n_vocab;       /* rows of the embedding / LM head */
    int32_t n_embd;        /* hidden size */
    int32_t n_layer;       /* decoder layers */
    int32_t n_head;        /* attention query heads */
    int32_t n_head_kv;     /* attention key/value heads */
    int32_t head_dim;      /* attention head size */
    int32_t n_ff;          /* MLP intermediate size */
    int32_t n_ctx_train;   /* maximum context the model was trained for */
    int64_t n_params;      /* parameters of the text model (tied LM head counted once) */
    int64_t weight_bytes;  /* bytes of all weights as stored (after any conversion below) */
    int32_t n_converted;   /* weight matrices stored in another type for the backend, whose
                            * kernels do not compute with the file's: Q4_0, Q5_0 and IQ4_NL as
                            * Q8_0 and Q3_K as Q6_K exactly, Q4_1, Q5_1, Q2_K, IQ4_XS (and Q5_K
                            * on CUDA) as F16, each value rounded to the nearest f16 */
};
void qwenrt_model_get_info(const struct qwenrt_model *model, struct qwenrt_model_info *info);

/* ---------------------------------------------------------------- session */

struct qwenrt_session;

/* How prompts are multiplied on the GPU. DEFAULT: for 16-bit and quantised weights the
 * prompt's matrix products round activations to bf16 and run on tensor cores (the precision
 * of llama.cpp and of PyTorch in bf16: logits within ~1e-2 relative of f32 arithmetic).
 * EXACT: f32-accurate products (activations split into three bf16 terms), ~2-3x slower
 * prompts. Decode is f32 either way; models with F32 weights are always exact; Qwen3.5
 * models (whose recurrence amplifies the rounding on random weights) keep activations in two
 * bf16 terms in DEFAULT (16 mantissa bits), and F16 or quantised weights, dequantised, two
 * bf16 terms as well; the CPU backend ignores it. */
enum qwenrt_precision { QWENRT_PRECISION_DEFAULT = 0, QWENRT_PRECISION_EXACT = 1 };

/* The KV cache's element type. F32 holds K and V as computed. F16 (llama.cpp's -ctk/-ctv
 * f16, its default) rounds them to 11 significant bits: half the memory; logits within ~3e-4
 * of f32 on the fixtures (CPU and CUDA alike); decode as fast or faster (faster deep in a
 * context) on the GPU and on CPUs with AVX2 or AVX-512. DEFAULT: the library's choice: F16 in
 * the default precision with 16-bit or quantised weights, on CUDA (where the flash prefill
 * rounds K and V to 16 bits anyway) and on CPUs with AVX2 or AVX-512; F32 otherwise
 * (QWENRT_PRECISION_EXACT, F32 weights, CPUs without AVX2, whose reference attention reads f16
 * rows 2.4x slower). Checkpoints hold f32 either way. The environment variable
 * QWENRT_CUDA_KV=f16|f32 overrides it for CUDA sessions. */
enum qwenrt_kv_type { QWENRT_KV_DEFAULT = 0, QWENRT_KV_F32 = 1, QWENRT_KV_F16 = 2 };

struct qwenrt_session_params {
    int32_t n_ctx;     /* maximum tokens the session holds; 0 = min(4096, n_ctx_train) */
    int n_threads;     /* 0 = the model's n_threads */
    int32_t precision; /* enum qwenrt_precision */
    int32_t kv_type;   /* enum qwenrt_kv_type */
};

struct qwenrt_session_params qwenrt_session_default_params(void);

/* A session holds one sequence's state (KV cache, DeltaNet state, position). On the GPU the
 * sessions of one model share one copy of its weights, uploaded by the first and freed with
 * the last. Free a model's sessions before the model. */
qwenrt_status qwenrt_session_init(struct qwenrt_model *model,
                                  const struct qwenrt_session_params *params,
                                  struct qwenrt_session **out, struct qwenrt_error *err);
void qwenrt_session_free(struct qwenrt_session *session);

/*
 * Processes n_ids tokens as one batch after the tokens already in the session.
 * If all_logits is non-NULL it receives [n_ids][n_vocab] logits (one row per position);
 * otherwise only the last position's logits are computed (see qwenrt_session_logits).
 * Errors: INVALID_ARG (an id outside the vocabulary, n_ids < 1), LIMIT (context full).
 * On error the session is unchanged.
 */
qwenrt_status qwenrt_session_prefill(struct qwenrt_session *session, const int32_t *ids,
                                     int32_t n_ids, float *all_logits, struct qwenrt_error *err);

/* Processes one token (the decode path). Same errors as prefill. */
qwenrt_status qwenrt_session_decode(struct qwenrt_session *session, int32_t id,
                                    struct qwenrt_error *err);

/* Logits of the last processed position, [n_vocab] floats owned by the session, valid until
 * the next call that changes the session. NULL before the first token (and if a CUDA
 * session's copy from the device fails: its logits stay on the GPU until asked for). */
const float *qwenrt_session_logits(const struct qwenrt_session *session);

/* Number of tokens the session holds (the next token's position). */
int32_t qwenrt_session_n_past(const struct qwenrt_session *session);
/* The KV cache's element type the session runs with: QWENRT_KV_F32 or QWENRT_KV_F16
 * (QWENRT_KV_DEFAULT and QWENRT_CUDA_KV resolved). */
int32_t qwenrt_session_kv_type(const struct qwenrt_session *session);

/* Forgets every token: the session is as new. */
void qwenrt_session_reset(struct qwenrt_session *session);

/* ---------------------------------------------------------------- batched decode */

/*
 * A batch decodes one token in each of several sessions of one model in a single pass (the
 * server's continuous batching): token-independent ops (embedding, norms, matmuls, MLP, LM
 * head) run once over all rows, reading each weight once; attention, RoPE and the DeltaNet
 * state updates run per session. Each session ends as qwenrt_session_decode would leave it
 * (logits equal up to float rounding of the multi-row matmuls). The batch owns activation
 * buffers for max_seqs rows; it is used by one thread at a time, with sessions not in use
 * elsewhere. All sessions of one call run on the same backend (CPU, or CUDA: the GPU runs the
 * row-wise ops once on the first session's copy of the weights).
 */
struct qwenrt_batch;

/* Errors: INVALID_ARG (no model, max_seqs < 1), NOMEM. */
qwenrt_status qwenrt_batch_init(struct qwenrt_model *model, int32_t max_seqs,
                                struct qwenrt_batch **out, struct qwenrt_error *err);
void qwenrt_batch_free(struct qwenrt_batch *b);

/* Feeds ids[i] to sessions[i] for i < n (n <= max_seqs, distinct sessions of the batch's
 * model). Errors: INVALID_ARG (an id outside the vocabulary, a session twice or of another
 * model), LIMIT (a session's context is full), UNSUPPORTED (CPU and CUDA sessions mixed),
 * NOMEM, BACKEND. On error no session is changed (after a BACKEND error the GPU state of
 * CUDA sessions may be partly updated). */
qwenrt_status qwenrt_batch_decode(struct qwenrt_batch *b, struct qwenrt_session *const *sessions,
                                  const int32_t *ids, int32_t n, struct qwenrt_error *err);

/* ---------------------------------------------------------------- checkpoints */

/*
 * A checkpoint is a session's full state (KV cache of the attention layers, conv and recurrent
 * state of the DeltaNet layers, position, last logits), in memory or in a file. Restoring it
 * into a session of the same model makes that session continue exactly (bit-identical logits)
 * as the original would have: a chat resumes without re-processing earlier turns.
 * A checkpoint is immutable and owns its memory; it may be restored any number of times, into
 * any session of the same model (the session's context must hold its tokens), on either
 * backend: the payload has the CPU layout, and CUDA sessions copy their device state in and
 * out of it.
 */
struct qwenrt_checkpoint;

/* Copies the session's state into a new checkpoint (*out; free with qwenrt_checkpoint_free).
 * The session is not changed. Errors: INVALID_ARG, NOMEM, BACKEND (a device copy failed). */
qwenrt_status qwenrt_session_snapshot(const struct qwenrt_session *session,
                                      struct qwenrt_checkpoint **out, struct qwenrt_error *err);

/* Replaces the session's state by the checkpoint's. Errors: INVALID_ARG (NULL, or a checkpoint
 * of another model: architecture, geometry or weights differ), LIMIT (more tokens than the
 * session's context holds), BACKEND (a device copy failed: the session is then reset). On
 * other errors the session is unchanged. */
qwenrt_status qwenrt_session_restore(struct qwenrt_session *session,
                                     const struct qwenrt_checkpoint *cp, struct qwenrt_error *err);

/* Writes the checkpoint to path (via a temporary file renamed into place, so path is never
 * left half written). Errors: INVALID_ARG, NOMEM, IO. */
qwenrt_status qwenrt_checkpoint_save(const struct qwenrt_checkpoint *cp, const char *path,
                                     struct qwenrt_error *err);

/* Reads a checkpoint file written by qwenrt_checkpoint_save for `model`. Errors: IO (cannot
 * read), FORMAT (not a checkpoint, truncated, corrupted: checksums differ), UNSUPPORTED (another
 * checkpoint version), INVALID_ARG (made with another model). */
qwenrt_status qwenrt_checkpoint_load(const struct qwenrt_model *model, const char *path,
                                     struct qwenrt_checkpoint **out, struct qwenrt_error *err);

/* Tokens the checkpoint holds (0 for NULL). */
int32_t qwenrt_checkpoint_n_past(const struct qwenrt_checkpoint *cp);

/* Bytes of the checkpoint as a file (header + state; 0 for NULL). */
uint64_t qwenrt_checkpoint_bytes(const struct qwenrt_checkpoint *cp);

void qwenrt_checkpoint_free(struct qwenrt_checkpoint *cp);

/* ---------------------------------------------------------------- sampling */

struct qwenrt_sampler;

/* One entry of a logit bias: bias is added to token id's logit before anything else
 * (OpenAI's logit_bias; -100 in practice bans a token, +100 forces it). */
struct qwenrt_logit_bias {
    int32_t id;
    float bias;
};

struct qwenrt_sampler_params {
    float temperature;      /* <= 0: greedy (argmax) */
    int32_t top_k;          /* keep the k most likely tokens; <= 0: all */
    float top_p;            /* nucleus: smallest set with probability >= top_p; 1: off */
    float min_p;            /* drop tokens below min_p x the top probability; 0: off */
    float repeat_penalty;   /* divide positive / multiply negative logits of recent tokens; 1: off */
    float presence_penalty; /* subtract from logits of tokens seen recently; 0: off */
    int32_t penalty_last_n; /* how many recent tokens the penalties look at */
    uint64_t seed;          /* the sampler's own RNG state starts from this */
    const struct qwenrt_logit_bias *logit_bias; /* [n_logit_bias] or NULL; copied by
                                                   qwenrt_sampler_init */
    int32_t n_logit_bias;
};

/* Greedy defaults (temperature 0), top_p 1, no penalties, penalty window 64, seed 0, no
 * logit bias. */
struct qwenrt_sampler_params qwenrt_sampler_default_params(void);

/* Order: logit bias, penalties, temperature, top-k, top-p, min-p, then a draw from the rest
 * (as transformers applies them; the bias first, as llama.cpp and OpenAI do; greedy takes the
 * argmax after bias and penalties). Errors: INVALID_ARG for out-of-range parameters (a bias
 * id outside the vocabulary, a non-finite bias). */
qwenrt_status qwenrt_sampler_init(const struct qwenrt_sampler_params *params, int32_t n_vocab,
                                  struct qwenrt_sampler **out, struct qwenrt_error *err);
void qwenrt_sampler_free(struct qwenrt_sampler *s);
/* Picks a token from logits [n_vocab] (not modified). */
int32_t qwenrt_sampler_sample(struct qwenrt_sampler *s, const float *logits);
/* Records a token as generated or prompted (for the penalties). */
void qwenrt_sampler_accept(struct qwenrt_sampler *s, int32_t id);
/* Forgets recent tokens and restarts the RNG from the seed. */
void qwenrt_sampler_reset(struct qwenrt_sampler *s);

/* ---------------------------------------------------------------- helpers */

/* Picks the next token from the session's last logits: the token qwenrt_sampler_sample(smp,
 * qwenrt_session_logits(session)) would give, RNG step included, but a CUDA session sends only
 * the best few hundred logits to the host when the sampler allows (greedy, or top-k with
 * top_k + the ids that logit bias and penalties touch <= 255) instead of the whole row. Does
 * not accept the token (qwenrt_sampler_accept). Errors: INVALID_ARG (NULL, no logits yet),
 * BACKEND. */
qwenrt_status qwenrt_session_sample(struct qwenrt_session *session, struct qwenrt_sampler *smp,
                                    int32_t *id, struct qwenrt_error *err);

/* Greedy argmax over n floats (first maximum wins). */
int32_t qwenrt_argmax(const float *logits, int32_t n);

#ifdef __cplusplus
}
#endif

#endif /* QWENRT_H */
