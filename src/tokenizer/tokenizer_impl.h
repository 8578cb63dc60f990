/*
 * tokenizer_impl.h — the tokenizer's data, shared by tokenizer.c (build, encode, decode) and the
 * two loaders (tokenizer_json.c, tokenizer_gguf.c). Not for use outside src/tokenizer.
 *
 * Loaders fill a tokenizer in three steps: tok_add_token for every token (any id order), then
 * tok_index_vocab, then tok_add_merge for every merge in rank order, then tok_finish.
 * Vocabulary strings live in one arena (strs), their decoded bytes in another (bytes); merges
 * live in an open-addressing hash keyed by (left id << 32 | right id).
 */
#ifndef QWENRT_TOKENIZER_IMPL_H
#define QWENRT_TOKENIZER_IMPL_H

#include "tokenizer/tokenizer.h"

enum {
    TOKF_PRESENT = 1, /* the id has a token (not a hole in the id range) */
    TOKF_ADDED = 2,   /* an added token: matched whole in the text before BPE */
    TOKF_SPECIAL = 4, /* added with "special": true (a control token) */
    TOKF_UNUSED = 8,  /* GGUF padding entry ([PADn], type UNUSED): never produced by encode */
};

struct merge_slot {
    uint64_t key; /* left id << 32 | right id; MERGE_EMPTY when free */
    int32_t rank; /* position in the merges list: lower merges first */
    int32_t id;   /* the merged token */
};
#define MERGE_EMPTY UINT64_MAX

struct tokenizer {
    int32_t n_vocab;   /* ids 0..n_vocab-1 */
    int32_t cap_vocab; /* allocated entries of the per-id arrays */
    uint8_t *flags;    /* [n_vocab] TOKF_* */
    uint32_t *str_off; /* [n_vocab] offset of the token string in strs */
    uint32_t *str_len; /* [n_vocab] its length in bytes */
    char *strs;        /* arena of token strings (each NUL-terminated) */
    size_t strs_len, strs_cap;
    uint32_t *bytes_off; /* [n_vocab] offset of the decoded bytes in bytes */
    uint32_t *bytes_len; /* [n_vocab] */
    uint8_t *bytes;      /* arena of decoded token bytes */

    int32_t *map; /* [map_mask+1] string -> id hash (open addressing), -1 = free */
    uint32_t map_mask;

    struct merge_slot *merges; /* [merge_mask+1] */
    uint64_t merge_mask;
    int32_t n_merges;

    int32_t byte_id[256]; /* id of the single-byte token for each byte */

    int32_t *added; /* [n_added] ids of added tokens by first byte, longest first */
    size_t n_added;
    uint32_t added_first[257]; /* added[added_first[b] .. added_first[b+1]) start with byte b */

    enum pretok_kind pretok;
    bool nfc; /* the normaliser is NFC (else none) */
    struct tokenizer_special special;
    int32_t eos_config;  /* eos from the file's own config, -1 if none */
    char *chat_template; /* xmalloc'd, or NULL */
};

qwenrt_status tok_new(struct tokenizer **out, struct qwenrt_error *err);
/* Adds (or, for an id seen before, replaces) a token. flags: TOKF_* besides PRESENT. */
qwenrt_status tok_add_token(struct tokenizer *t, int32_t id, const char *s, size_t len,
                            unsigned flags, struct qwenrt_error *err);
/* Builds the string -> id map over every token added so far. */
qwenrt_status tok_index_vocab(struct tokenizer *t, size_t n_merges_hint, const char *src,
                              struct qwenrt_error *err);
/* Adds the next merge (rank = merges added before it) of two vocabulary strings. */
qwenrt_status tok_add_merge(struct tokenizer *t, const char *a, size_t alen, const char *b,
                            size_t blen, const char *src, struct qwenrt_error *err);
/* Byte table, decoded bytes, added-token index, special ids. src names the file for errors. */
qwenrt_status tok_finish(struct tokenizer *t, const char *src, struct qwenrt_error *err);
/* (Re)computes the special ids from the vocabulary and eos_config (tok_finish calls it). */
void tok_find_special(struct tokenizer *t);

#endif
