/*
 * scheduler.h — runs generation requests ("jobs") on a fixed set of slots (one session each)
 * with continuous batching: between two decode steps, finished or abandoned jobs leave their
 * slot and queued jobs take free slots, so sequences join and leave the running batch at
 * token granularity. One scheduler thread owns every session; an iteration gives each
 * active slot one step (a prefill chunk of at most SCHED_PREFILL_CHUNK tokens, or one
 * decoded token), so a long prompt cannot stall the other streams. The generating slots'
 * tokens of one iteration are decoded together in one batched step (qwenrt_batch_decode:
 * each weight read once for all of them), one by one where that is not possible (CUDA). A
 * request alone on a CUDA server (no other job running or queued, no logprobs, a sampler the
 * GPU can draw for) gets SCHED_GPU_STEPS tokens per iteration, drawn on the GPU between the
 * decode steps (session_generate); the steps past the token it ends on are undone.
 *
 * A job is shared by the HTTP thread that submitted it and the scheduler (reference count 2
 * while queued or running). The scheduler appends text to job->out under job->mu and signals
 * job->cv; the HTTP side takes it from there. A client that goes away is noticed by polling
 * its socket (POLLRDHUP) every iteration, for queued and running jobs alike, and the job
 * leaves at once. Prompt caching: see prompt_cache.h; a job checkpoints its prompt up to the
 * last <|im_start|> (the conversation so far), its whole prompt, and its final state. A chat
 * job, once answered, also prepares the next turn: the template renders the conversation with
 * the answer as the next request will send it (earlier turns may render differently from
 * what was generated, e.g. Qwen3/3.5 drop the <think> block of past answers, so the final
 * state rarely is a prefix of the next prompt), the slot prefills that from the best
 * checkpoint, a chunk per iteration as for a prompt (a request for that very turn arriving
 * meanwhile takes the slot over and goes on from there), and caches it. The client already
 * has its answer by then; the next turn then processes only its own tokens.
 */
#ifndef QWENRT_SERVER_SCHEDULER_H
#define QWENRT_SERVER_SCHEDULER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qwenrt.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tools/textgen.h"

#define SCHED_MAX_SLOTS 256     /* --parallel at most */
#define SCHED_GPU_STEPS 16      /* tokens per GPU submission for a request alone on a CUDA
                                   server (session_generate; textgen.c's TEXTGEN_GPU_STEPS) */
#define SCHED_PREFILL_CHUNK 256 /* prompt tokens per scheduler iteration and slot */
#define SCHED_ECHO_CHUNK 16     /* ... when every position's logits are kept (echo + logprobs:
                                 * 16 x 151,936 floats, 9.7 MB) */
#define SCHED_MAX_PENDING                                                                          \
    (4 << 20) /* bytes of text a client may leave unread before the                                \
                 job is cancelled (a stalled reader) */

enum job_finish { JOB_RUNNING, JOB_EOS, JOB_LENGTH, JOB_STOP, JOB_CANCELLED, JOB_ERROR };

struct job {
    /* input: set before sched_submit, read-only afterwards */
    int32_t *ids; /* [n_ids] prompt tokens, xmalloc'd, owned */
    int32_t n_ids;
    struct qwenrt_sampler_params sp;
    struct textgen_params tp;      /* stop strings point into stops[] */
    char *stops[TEXTGEN_MAX_STOP]; /* owned */
    int fd;                        /* client socket for disconnect checks, -1 = none */
    char *chat_json;      /* chat requests: {"messages", "tools", "enable_thinking"} as JSON, to
                             prepare the next turn's prefix (see below); NULL otherwise. Owned */
    enum chat_format fmt; /* the template chat_json renders with */
    double t_arrival;     /* time_now_s() when the request arrived */
    int32_t logprobs;     /* 0: none; else 1 + top alternatives to record per token */
    bool echo;            /* the answer starts with the prompt (job_echo); with logprobs the
                             prompt's tokens get theirs too (the first NaN: no context), so
                             the prompt is processed from scratch, not from the cache */
    struct qwenrt_logit_bias *bias; /* sp.logit_bias's entries, owned */
    struct job *leader;   /* "n" > 1: choice 0's job (a reference, owned): this job waits in
                             the queue until the leader has processed the same prompt, then
                             restores it from the prompt cache instead of processing it again */
    bool prefilled;       /* scheduler thread only: the whole prompt is processed (and cached) */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* shared, under mu */
    char *out; /* text generated and not yet taken by the HTTP side */
    size_t out_len, out_cap;
    char *answer; /* all text generated (chat jobs, for the next turn's prefix) */
    size_t answer_len, answer_cap;
    enum job_finish finish; /* JOB_RUNNING until done */
    bool cancel;            /* set by the HTTP side: stop and leave the slot */
    int refs;
    int32_t n_prompt;       /* prompt tokens */
    int32_t n_cached;       /* of which restored from the prompt cache */
    int32_t n_gen;          /* tokens generated */
    double t_slot, t_first; /* got a slot; first token (0 = not yet) */
    struct oai_token_logprob *lp; /* logprobs: one per generated token (not EOS), after one
                                     per prompt token when echo */
    int32_t n_lp, cap_lp;
    char error[512];        /* finish == JOB_ERROR */
};

/* A new job holding one reference for the caller; takes ownership of ids. NULL on OOM. */
struct job *job_new(int32_t *ids, int32_t n_ids);
/* Drops a reference; the last one frees the job. */
void job_release(struct job *j);
/* Asks the scheduler to stop the job (client gone); the job still ends with JOB_CANCELLED. */
void job_cancel(struct job *j);
/* Before sched_submit: the answer starts with text (the prompt) and j->echo is set. false:
 * out of memory. */
bool job_echo(struct job *j, const char *text, size_t len);

struct sched_params {
    int n_parallel;     /* slots */
    int32_t n_ctx;      /* context of each slot's session */
    int n_threads;      /* kernel threads per session, 0 = the model's */
    int queue_max;      /* jobs waiting for a slot before sched_submit refuses */
    size_t cache_bytes; /* prompt cache budget, 0 = off */
    int32_t precision;  /* enum qwenrt_precision of the slots' sessions */
    int32_t kv_type;    /* enum qwenrt_kv_type of the slots' sessions */
};

struct sched;

qwenrt_status sched_init(struct qwenrt_model *model, const struct tokenizer *tok,
                         const struct sched_params *p, struct metrics *metrics, struct sched **out,
                         struct qwenrt_error *err);
/* Starts the job (the scheduler takes its own reference). Returns 0, or -1 when the queue is
 * full (HTTP 429), -2 when shutting down (HTTP 503). */
int sched_submit(struct sched *s, struct job *j);
/* Cancels every queued and running job, stops the thread. Idempotent. */
void sched_shutdown(struct sched *s);
/* Shuts down if needed and frees everything. NULL is fine. */
void sched_free(struct sched *s);

#endif
