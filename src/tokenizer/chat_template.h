/*
 * chat_template.h — renders a conversation to the prompt text a Qwen model expects, as the
 * model's own Jinja chat template would under transformers' apply_chat_template, without a
 * Jinja engine: the Qwen3 and Qwen3.5 templates are re-implemented by hand and chosen by
 * recognising their template strings; anything else gets plain ChatML and a warning.
 *
 * Covered: system turn, multi-turn, enable_thinking, add_generation_prompt, reasoning in
 * earlier assistant turns (<think> blocks kept only after the last user query), tool
 * definitions, tool calls (Qwen3: JSON in <tool_call>; Qwen3.5: <function=...><parameter=...>)
 * and tool responses. JSON is re-serialised as Python's json.dumps(ensure_ascii=False) does
 * (", " and ": " separators, key order kept, floats in shortest round-trip form).
 */
#ifndef QWENRT_TOKENIZER_CHAT_TEMPLATE_H
#define QWENRT_TOKENIZER_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "qwenrt.h"

enum chat_format {
    CHAT_FORMAT_CHATML, /* <|im_start|>role\ncontent<|im_end|>\n, no tools or reasoning */
    CHAT_FORMAT_QWEN3,  /* Qwen3's template (tokenizer_config.json of Qwen3-0.6B) */
    CHAT_FORMAT_QWEN35, /* Qwen3.5's template (XML-style tool calls, <think>\n prompt) */
};

struct chat_tool_call {
    const char *name;      /* function name */
    const char *arguments; /* JSON text: an object ({"city": "Paris"}) or a JSON string */
};

struct chat_message {
    const char *role;              /* "system", "user", "assistant" or "tool" */
    const char *content;           /* NULL renders as "" */
    const char *reasoning_content; /* assistant reasoning given apart; NULL when absent */
    const struct chat_tool_call *tool_calls;
    size_t n_tool_calls;
};

struct chat_params {
    const struct chat_message *messages;
    size_t n_messages;
    const char *const *tools; /* JSON text of each tool definition, rendered with tojson */
    size_t n_tools;
    bool add_generation_prompt; /* end with the assistant turn's opening */
    bool enable_thinking;       /* false adds an empty <think></think> (template default: true) */
};

/* The renderer for a model's template string (NULL = none). *warning (may be NULL) is set to a
 * static one-line message when the template is missing or not recognised, else to NULL. */
enum chat_format chat_format_detect(const char *template_str, const char **warning);
const char *chat_format_name(enum chat_format fmt);

/* Renders; *out is xmalloc'd and NUL-terminated. Errors: INVALID_ARG (a role, tool or
 * argument JSON the template rejects, e.g. Qwen3.5 without a user query). */
qwenrt_status chat_render(enum chat_format fmt, const struct chat_params *p, char **out,
                          size_t *len, struct qwenrt_error *err);

/* The same from a JSON request {"messages": [...], "tools": [...], "add_generation_prompt":
 * bool, "enable_thinking": bool} in OpenAI form (tool_calls as {"function": {"name",
 * "arguments"}} or {"name", "arguments"}; arguments an object or a JSON string). */
qwenrt_status chat_render_json(enum chat_format fmt, const char *request_json, char **out,
                               size_t *len, struct qwenrt_error *err);

#endif
