/*
 * tokens.h — the server's /tokenize and /detokenize endpoints (llama.cpp server's form), as
 * pure functions from a request body to a response body, so they are testable without a
 * socket:
 *
 *   POST /tokenize   {"content": "text", "with_pieces": false, "add_special": false}
 *                    -> {"tokens": [ids]}, or with pieces [{"id": n, "piece": "text"}] (a
 *                    piece that is not valid UTF-8 on its own, part of a character, comes as
 *                    its byte values, as llama.cpp does)
 *   POST /detokenize {"tokens": [ids]} -> {"content": "text"} (special tokens included;
 *                    invalid UTF-8 replaced by U+FFFD)
 *
 * add_special is accepted and has no effect: Qwen tokenizers add no BOS. Errors are 400s in
 * OpenAI's shape naming the field (an id outside the vocabulary, a wrong type, more than
 * TOKENS_MAX ids).
 */
#ifndef QWENRT_SERVER_TOKENS_H
#define QWENRT_SERVER_TOKENS_H

#include <stddef.h>

#include "server/openai.h"
#include "tokenizer/tokenizer.h"

#define TOKENS_MAX (1 << 20) /* ids one request may send or receive */

/* On success *json is the response body (xmalloc'd); false fills e. */
bool tokens_tokenize(const struct tokenizer *tok, const char *body, size_t len, char **json,
                     struct oai_error *e);
bool tokens_detokenize(const struct tokenizer *tok, const char *body, size_t len, char **json,
                       struct oai_error *e);

#endif
