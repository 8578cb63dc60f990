/*
 * textgen.h — text out of a session: the decode loop shared by `qwenrt run` and the server.
 *
 * Samples a token, streams its text (whole UTF-8 characters only), stops on the model's end
 * tokens, on user stop strings (text that could still become a stop string is held back, and
 * a stop string itself is never emitted), on max_tokens, or when *cancel becomes non-zero.
 * The token that ends generation by EOS is not fed back into the session (textgen_finish_turn
 * does that for chats that continue).
 */
#ifndef QWENRT_TOOLS_TEXTGEN_H
#define QWENRT_TOOLS_TEXTGEN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "qwenrt.h"
#include "tokenizer/tokenizer.h"

#define TEXTGEN_MAX_STOP 8

enum textgen_finish { TEXTGEN_EOS, TEXTGEN_LENGTH, TEXTGEN_STOP, TEXTGEN_CANCEL };

struct textgen_params {
    int32_t max_tokens;                 /* generated tokens at most */
    const char *stop[TEXTGEN_MAX_STOP]; /* stop strings (NULL-terminated when fewer) */
    bool skip_special;                  /* do not emit control tokens' text */
    int32_t gpu_steps;                  /* tokens drawn per submission on a CUDA session whose
                                           sampler the GPU can run: 0 = TEXTGEN_GPU_STEPS,
                                           1 = token by token (each token's text as it comes) */
};

#define TEXTGEN_GPU_STEPS 16 /* ~9 ms of Qwen3-0.6B tokens on an H200 per submission */
#define TEXTGEN_GPU_STEPS_MAX 64

/* Receives text as it is produced; returns false to stop (finish = CANCEL). */
typedef bool (*textgen_emit_fn)(void *user, const char *text, size_t len);

struct textgen_result {
    int32_t n_prompt;          /* tokens prefilled by this call */
    int32_t n_generated;       /* tokens sampled */
    int32_t last_token;        /* the last sampled token (-1 if none) */
    enum textgen_finish finish;
    double prefill_s, decode_s; /* wall time of the prefill, and of all decode steps */
};

/* Prefills prompt[0..n_prompt) (may be 0 when the session already holds the prompt and has
 * logits), then generates. */
qwenrt_status textgen_run(struct qwenrt_session *s, struct qwenrt_sampler *smp,
                          const struct tokenizer *tok, const int32_t *prompt, int32_t n_prompt,
                          const struct textgen_params *p, textgen_emit_fn emit, void *user,
                          const volatile sig_atomic_t *cancel, struct textgen_result *res,
                          struct qwenrt_error *err);

/* Loads the tokenizer of a model: GGUF metadata, or tokenizer.json of a HF directory. */
qwenrt_status textgen_load_tokenizer(const struct qwenrt_model *m, struct tokenizer **out,
                                     struct qwenrt_error *err);

/* Sampling defaults from a HF directory's generation_config.json (temperature, top_k, top_p,
 * min_p, repetition_penalty), left unchanged when the file or a key is absent. */
void textgen_generation_defaults(const struct qwenrt_model *m, struct qwenrt_sampler_params *sp);

/* The chat template string of the model's tokenizer (may be NULL). */
const char *textgen_chat_template(const struct tokenizer *tok);

/* ------------------------------------------------------------ step-wise text (server)
 * The text half of textgen_run for callers that drive decoding themselves, one token at a
 * time across many sequences (the server's scheduler): streaming UTF-8, stop strings held
 * back and never emitted. Usage: init, push each sampled non-EOS token, finish once, free. */
struct textgen_text {
    const struct textgen_params *p; /* borrowed: stop strings */
    struct tokenizer_stream ts;
    char *buf; /* text produced but not yet emitted (could become a stop string) */
    size_t len, cap;
};

void textgen_text_init(struct textgen_text *t, const struct tokenizer *tok,
                       const struct textgen_params *p);
/* Adds a token's text and emits what is safe. *stopped: a stop string was found (the text
 * before it was emitted; nothing more comes). *cancelled: emit returned false. */
qwenrt_status textgen_text_push(struct textgen_text *t, int32_t id, textgen_emit_fn emit,
                                void *user, bool *stopped, bool *cancelled,
                                struct qwenrt_error *err);
/* Emits what is held back (no stop string can complete any more). */
void textgen_text_finish(struct textgen_text *t, textgen_emit_fn emit, void *user);
void textgen_text_free(struct textgen_text *t);

#endif
