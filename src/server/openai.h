/*
 * openai.h — the OpenAI protocol of the server: parsing and checking /v1/chat/completions and
 * /v1/completions request bodies into what a job needs, and writing response objects,
 * stream chunks and errors in OpenAI's JSON shapes. No I/O and no threads: pure functions
 * over jansson values, so tests/test_server.c can check them directly.
 *
 * Accepted fields: model, messages (chat) / prompt (completions: a string or an array of up to
 * OAI_PROMPTS_MAX strings, answered as choices prompt-major: index = prompt x n + choice),
 * max_tokens / max_completion_tokens, temperature, top_p, top_k, min_p, seed, stop (a string
 * or up to TEXTGEN_MAX_STOP strings), n (1..OAI_N_MAX choices per prompt), logit_bias (token
 * id strings to -100..100), stream, stream_options.include_usage, presence_penalty,
 * frequency_penalty (mapped to the repeat penalty window), tools, tool_choice ("none" keeps the answer as text), chat_template_kwargs.enable_thinking,
 * logprobs + top_logprobs (chat; 0..OAI_TOP_LOGPROBS_MAX alternatives per token), logprobs
 * as the number of alternatives (completions, 0..OAI_TOP_LOGPROBS_MAX), echo (completions: the
 * prompt starts the text; max_tokens may then be 0, to score a text).
 * With tools, an answer holding <tool_call> blocks is returned as message.tool_calls with
 * finish_reason "tool_calls" (tool_calls.h). Unknown fields are ignored, as OpenAI does;
 * a known field of the wrong type or out of range is a 400 naming it in "param".
 */
#ifndef QWENRT_SERVER_OPENAI_H
#define QWENRT_SERVER_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qwenrt.h"
#include "tokenizer/chat_template.h"
#include "tools/textgen.h"

enum oai_kind { OAI_CHAT, OAI_COMPLETION };

/* An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}. */
struct oai_error {
    int status;        /* HTTP status */
    const char *type;  /* "invalid_request_error", "authentication_error", ... */
    const char *code;  /* e.g. "model_not_found", or NULL */
    const char *param; /* the request field at fault, or NULL */
    char message[512];
};

struct oai_limits {
    const char *model_id; /* the one model served */
    int32_t max_tokens;   /* default and cap for generated tokens per request */
    int32_t top_k;        /* default top_k when a request gives none (0 = whole vocabulary:
                             the sampler then sorts all of it, ~10 ms a token) */
    enum chat_format fmt; /* chat template renderer */
    int32_t n_vocab;      /* logit_bias keys must be token ids below this (0: any) */
};

#define OAI_PROMPTS_MAX 16 /* completions: prompts of one request (an array) */

struct oai_request {
    enum oai_kind kind;
    char *prompt;    /* rendered prompt text, xmalloc'd */
    char *chat_json; /* chat: {"messages", "tools", "enable_thinking"} as
                        rendered, xmalloc'd; NULL for completions */
    struct qwenrt_sampler_params sp;
    int32_t max_tokens;            /* requested (capped) */
    char *stops[TEXTGEN_MAX_STOP]; /* xmalloc'd, NULL-terminated when fewer */
    bool stream, include_usage;
    bool tools; /* the request offers tools (and tool_choice is not "none") */
    int32_t logprobs; /* 0: none; else 1 + top_logprobs */
    bool echo;        /* completions: the answer starts with the prompt (and with logprobs,
                         the prompt's tokens get theirs: the first null) */
    int32_t n;        /* choices to generate per prompt, 1..OAI_N_MAX */
    char *more_prompts[OAI_PROMPTS_MAX - 1]; /* completions: prompts 1.. of an array, xmalloc'd */
    int32_t n_prompts;                       /* 1 + those (n_prompts x n <= OAI_JOBS_MAX) */
    struct qwenrt_logit_bias *bias; /* "logit_bias" entries, xmalloc'd; sp.logit_bias points
                                       here */
};

#define OAI_N_MAX 16
#define OAI_JOBS_MAX 64 /* prompts x choices of one request */
#define OAI_LOGIT_BIAS_MAX 1024 /* entries of "logit_bias" (OpenAI takes 300) */

/* Parses and checks a request body. false fills e (400/404) and leaves *r empty. */
bool oai_parse(enum oai_kind kind, const char *body, size_t len, const struct oai_limits *lim,
               struct oai_request *r, struct oai_error *e);
void oai_request_free(struct oai_request *r);

/* Fills e and returns false (for one-line error returns). */
bool oai_fail(struct oai_error *e, int status, const char *type, const char *code,
              const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* A request body as a JSON object (duplicate keys refused), or NULL with e filled (400). */
json_t *oai_load_object(const char *body, size_t len, struct oai_error *e);
/* v as compact JSON, xmalloc'd (NULL on OOM or a NULL v); drops the reference to v. */
char *oai_dump(json_t *v);

/* {"error": {...}} as compact JSON; xmalloc'd (NULL on OOM). */
char *oai_error_json(const struct oai_error *e);

struct oai_usage {
    int32_t prompt, cached, completion;
};

/* The id, created time and model every response object of one request carries. */
struct oai_meta {
    enum oai_kind kind;
    char id[48];
    long long created;
    const char *model;
    bool tools;    /* parse tool calls out of the answer */
    int32_t index; /* the choice an object is about ("n" > 1; 0 otherwise) */
};

/* A whole (non-streaming) response. finish: "stop" or "length" (with m->tools and tool calls
 * in the text: message.tool_calls and "tool_calls"). xmalloc'd JSON. */
char *oai_response_json(const struct oai_meta *m, const char *text, size_t len, const char *finish,
                        const struct oai_usage *u);
/* n > 1: the whole responses of each choice (oai_response_json, logprobs attached) as one
 * response: json[0] with the other choices appended as index 1..n-1, completion tokens
 * summed, prompt_tokens the request's (each prompt once: the caller sums them). Frees
 * nothing; xmalloc'd JSON, NULL on OOM or a json[i] that is not such a response. */
char *oai_merge_choices(char *const *json, int n, int32_t prompt_tokens);

/* One stream chunk: text (may be NULL), finish reason (NULL while running); role=true adds
 * the chat delta's "role": "assistant". usage != NULL writes the usage-only final chunk of
 * stream_options.include_usage (empty choices). xmalloc'd JSON. */
char *oai_chunk_json(const struct oai_meta *m, const char *text, size_t len, bool role,
                     const char *finish, const struct oai_usage *usage);

#define OAI_TOP_LOGPROBS_MAX 20

/* One generated token's log-probability under the model (log-softmax of its logits) and the
 * n_top most likely tokens at that step, most likely first. */
struct oai_token_logprob {
    int32_t id;
    float logprob;
    int32_t n_top;
    int32_t top_id[OAI_TOP_LOGPROBS_MAX];
    float top_lp[OAI_TOP_LOGPROBS_MAX];
};

struct tokenizer;
/* Sets choices[0].logprobs of a response or chunk (*json: xmalloc'd, replaced) for v[0..n).
 * Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}; a token whose
 * bytes are not whole UTF-8 shows them replaced (U+FFFD) in "token" and exact in "bytes".
 * Completions (OpenAI's legacy form): {"tokens", "token_logprobs", "top_logprobs" (per token
 * an object text -> logprob, or null when no alternatives were asked for), "text_offset" (code
 * points into the text); an entry whose logprob is NaN (an echoed prompt's first token, which
 * has no context) has null logprob and alternatives; text_offset (may be NULL: 0) is where
 * v[0] starts and is
 * advanced past v[n-1] (streams continue it across chunks). false: out of memory (*json
 * unchanged). */
bool oai_attach_logprobs(char **json, enum oai_kind kind, const struct oai_token_logprob *v, int n,
                         const struct tokenizer *tok, int64_t *text_offset);

struct tool_calls;
/* The stream chunk carrying every tool call at once (delta.tool_calls with index, id, type,
 * function name and arguments). xmalloc'd JSON. */
char *oai_chunk_tool_calls_json(const struct oai_meta *m, const struct tool_calls *tc);

#endif
