/*
 * stream.h — the server-sent-events body of a generation request with "stream": true
 * (stream.c): OpenAI chunk events for one or several jobs (one per choice), read by
 * libmicrohttpd as the jobs produce text.
 */
#ifndef QWENRT_SERVER_STREAM_H
#define QWENRT_SERVER_STREAM_H

#include <microhttpd.h>
#include <stdbool.h>

#include "server/openai.h"
#include "server/scheduler.h"
#include "tokenizer/tokenizer.h"

struct stream_params {
    const struct tokenizer *tok; /* logprobs' token texts */
    int keepalive_s;             /* an SSE comment after this long without output */
    bool include_usage;          /* stream_options.include_usage: a usage chunk at the end */
    int per_prompt;              /* choices per prompt: choice p x per_prompt starts prompt p
                                    (usage counts each prompt once) */
    void (*on_free)(void *user); /* called once when the stream is done with (or NULL) */
    void *user;
};

/* A response streaming jobs[0..n-1] (choice i = jobs[i], chunk index i); holds a reference to
 * each job and cancels those still running when the client goes. NULL on OOM (on_free has
 * been called). */
struct MHD_Response *stream_response(struct job *const *jobs, int n, const struct oai_meta *meta,
                                     const struct stream_params *p);

/* "stop" or "length" for a finished job; its usage (prompt, cached, completion tokens). */
const char *job_finish_name(enum job_finish f);
struct oai_usage job_usage(struct job *j);

#endif
