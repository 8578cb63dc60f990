/*
 * tool_calls.h — the model's tool calls in generated text, for OpenAI's `tool_calls`.
 *
 * When a chat request carries `tools`, the chat template tells the model to answer a call
 * inside <tool_call></tool_call> tags, in one of the two forms the Qwen templates use:
 *   Qwen3:   <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
 *   Qwen3.5: <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n
 *            </function>\n</tool_call>
 * tool_calls_parse finds every such block; the text before the first one is the message's
 * content. A parameter value of the XML form that is valid JSON (a number, true, an object...)
 * is kept as that value, anything else becomes a JSON string. A block that is unterminated
 * (generation stopped) or malformed makes the whole answer plain content: the client then
 * sees exactly what the model wrote.
 */
#ifndef QWENRT_SERVER_TOOL_CALLS_H
#define QWENRT_SERVER_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>

#define TOOL_CALL_OPEN "<tool_call>"
#define TOOL_CALLS_MAX 16

struct tool_call {
    char *name;      /* xmalloc'd */
    char *arguments; /* a JSON object as compact text (OpenAI sends it as a string), xmalloc'd */
};

struct tool_calls {
    struct tool_call v[TOOL_CALLS_MAX];
    int n;
    size_t content_len; /* bytes of text before the first call, trailing whitespace dropped */
};

/* true when text holds at least one well-formed call and nothing malformed; fills out (free
 * with tool_calls_free). false leaves out empty. */
bool tool_calls_parse(const char *text, size_t len, struct tool_calls *out);
void tool_calls_free(struct tool_calls *tc);

/* Streaming: how many bytes of text may be sent as content now. Stops before TOOL_CALL_OPEN,
 * and before a tail that could be its beginning ("<tool"), which the next piece may complete. */
size_t tool_calls_safe_len(const char *text, size_t len);

/* A streamed answer with tools: pieces go in, content that cannot belong to a call comes out
 * at once, and at the end either the calls or the held-back rest. */
struct tool_stream {
    char *acc;        /* the answer so far, xmalloc'd */
    size_t len, sent; /* its bytes, and how many went out as content */
};

/* Adds a piece (last: the answer is complete). *content / *content_len: the content to send
 * now (inside ts, valid until the next call). When last and the answer is tool calls, fills
 * calls (free with tool_calls_free) and sets *has_calls. false: out of memory. */
bool tool_stream_add(struct tool_stream *ts, const char *text, size_t len, bool last,
                     const char **content, size_t *content_len, struct tool_calls *calls,
                     bool *has_calls);
void tool_stream_free(struct tool_stream *ts);

#endif
