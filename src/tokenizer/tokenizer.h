/*
 * tokenizer.h — Qwen's byte-level BPE tokenizer: loading (Hugging Face tokenizer.json or GGUF
 * metadata), encoding text to ids, decoding ids to text, and streaming decode.
 *
 * Encoding follows Hugging Face `tokenizers` for Qwen3 and Qwen3.5: added tokens (special or
 * not) are matched whole in the raw text first (leftmost, longest); the text between them is
 * NFC-normalised, split by the pre-tokeniser regex (pretokenize.h) and each piece, as bytes,
 * merged by BPE merge rank. Nothing is added (no BOS). Input that is not valid UTF-8 is first
 * repaired as Python's bytes.decode('utf-8', errors='replace') would (each invalid maximal
 * subpart becomes U+FFFD), so any bytes encode. Decoding concatenates the bytes of the tokens
 * and repairs invalid UTF-8 the same way (as `tokenizers` does with from_utf8_lossy).
 *
 * A tokenizer is read-only after load and may be shared between threads.
 */
#ifndef QWENRT_TOKENIZER_TOKENIZER_H
#define QWENRT_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qwenrt.h"
#include "tokenizer/pretokenize.h"

struct gguf_file;
struct gguf_writer;
struct tokenizer;

#define TOKENIZER_MAX_EOS 4           /* distinct end-of-generation ids kept */
#define TOKENIZER_MAX_VOCAB (1 << 24) /* ids are below this (Qwen3.5 has ~248k) */

/* Ids the runtime needs; -1 where the vocabulary has no such token. */
struct tokenizer_special {
    int32_t bos;                    /* -1 for Qwen (no BOS is added) */
    int32_t eos[TOKENIZER_MAX_EOS]; /* ids that end generation: the configured eos first,
                                       then <|im_end|> and <|endoftext|> when present */
    int32_t n_eos;
    int32_t pad;       /* padding token, <|endoftext|> for Qwen */
    int32_t im_start;  /* <|im_start|> */
    int32_t im_end;    /* <|im_end|> */
    int32_t think;     /* <think> */
    int32_t think_end; /* </think> */
};

/*
 * Loads a Hugging Face tokenizer.json. When a tokenizer_config.json sits next to it, its
 * eos_token and chat_template are read too (not an error when absent). Errors: IO, FORMAT (not
 * JSON, missing model.vocab / model.merges, a merge of unknown tokens), UNSUPPORTED (not BPE,
 * an unknown pre-tokeniser regex or normaliser), NOMEM.
 */
qwenrt_status tokenizer_load_json(struct tokenizer **out, const char *path,
                                  struct qwenrt_error *err);

/* Loads from GGUF metadata (tokenizer.ggml.model "gpt2", .pre "qwen2" or "qwen35", .tokens,
 * .token_type, .merges, bos/eos/padding ids, tokenizer.chat_template). The gguf_file may be
 * closed afterwards. Errors: NOT_FOUND (missing keys), FORMAT, UNSUPPORTED, NOMEM. */
qwenrt_status tokenizer_load_gguf(struct tokenizer **out, const struct gguf_file *gf,
                                  struct qwenrt_error *err);

/* Writes the tokenizer.ggml.* keys (and tokenizer.chat_template when known) for `tok`, in the
 * form tokenizer_load_gguf reads and llama.cpp writes. The token list is padded with
 * "[PAD<id>]" (type unused) up to pad_to entries, as llama.cpp's converter does for models whose
 * embedding has more rows than the vocabulary (Qwen3: 151,936 rows, 151,669 tokens); llama.cpp
 * refuses a file whose token count differs from the embedding rows. */
qwenrt_status tokenizer_write_gguf_kv(const struct tokenizer *tok, struct gguf_writer *w,
                                      int32_t pad_to, struct qwenrt_error *err);

void tokenizer_free(struct tokenizer *tok);

/* Finds the tokenizer.json of a Hugging Face model directory: *path is an xmalloc'd
 * "dir/tokenizer.json". Errors: NOT_FOUND with the path tried. */
qwenrt_status tokenizer_find_json(const char *model_dir, char **path, struct qwenrt_error *err);

/* Encodes text[0..len) (any bytes; added and special tokens in the text are recognised).
 * *ids is xmalloc'd (NULL when *n == 0); free with xfree. */
qwenrt_status tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len,
                               int32_t **ids, size_t *n, struct qwenrt_error *err);

/* Decodes ids to valid UTF-8 (special tokens included, as skip_special_tokens=False).
 * *text is xmalloc'd and NUL-terminated. Errors: INVALID_ARG for an id out of range. */
qwenrt_status tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n,
                               char **text, size_t *len, struct qwenrt_error *err);

/* Vocabulary size: largest id + 1. */
int32_t tokenizer_n_vocab(const struct tokenizer *tok);
/* The token string as stored in the vocabulary (byte-level form, e.g. "Ġthe"), or NULL for an
 * id out of range or a hole. *len receives its length when not NULL. */
const char *tokenizer_token_str(const struct tokenizer *tok, int32_t id, size_t *len);
/* The raw bytes a token decodes to (not NUL-terminated), or NULL. */
const uint8_t *tokenizer_token_bytes(const struct tokenizer *tok, int32_t id, size_t *len);
/* Id of a vocabulary string (byte-level form, or an added token's content), or -1. */
int32_t tokenizer_token_id(const struct tokenizer *tok, const char *str, size_t len);
/* true for added tokens with "special": true (control tokens). */
bool tokenizer_is_special(const struct tokenizer *tok, int32_t id);
const struct tokenizer_special *tokenizer_special_ids(const struct tokenizer *tok);
bool tokenizer_is_eos(const struct tokenizer *tok, int32_t id);
enum pretok_kind tokenizer_pretok_kind(const struct tokenizer *tok);
/* The model's chat template string (tokenizer_config.json or GGUF), or NULL when unknown. */
const char *tokenizer_chat_template(const struct tokenizer *tok);

/* ------------------------------------------------------------ streaming decode
 * Feeds ids one at a time and returns only complete UTF-8 characters: bytes of a character
 * split across tokens are held back until the character is complete. Bytes that can never
 * form a character come out as U+FFFD. Usage: init, push for each id (the text it returns is
 * valid until the next call), flush at the end, free. */
struct tokenizer_stream {
    const struct tokenizer *tok; /* borrowed */
    bool skip_special;           /* drop special (control) tokens from the output */
    uint8_t pending[4];          /* held-back start of an incomplete character */
    size_t n_pending;
    char *buf; /* output of the last push/flush, xmalloc'd */
    size_t cap;
};

void tokenizer_stream_init(struct tokenizer_stream *st, const struct tokenizer *tok,
                           bool skip_special);
qwenrt_status tokenizer_stream_push(struct tokenizer_stream *st, int32_t id, const char **text,
                                    size_t *len, struct qwenrt_error *err);
/* Emits what is held back (as U+FFFD: it never completed) and resets the stream. */
qwenrt_status tokenizer_stream_flush(struct tokenizer_stream *st, const char **text, size_t *len,
                                     struct qwenrt_error *err);
void tokenizer_stream_free(struct tokenizer_stream *st);

#endif
