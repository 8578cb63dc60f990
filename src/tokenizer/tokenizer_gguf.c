/*
 * tokenizer_gguf.c — the tokenizer from GGUF metadata (as llama.cpp's converter writes it for
 * Qwen), and the reverse: writing those keys from a loaded tokenizer.
 *
 * Keys: tokenizer.ggml.model "gpt2"; tokenizer.ggml.pre "qwen2" (the Qwen2/Qwen3 regex) or
 * "qwen35"; tokenizer.ggml.tokens (strings, byte-level form for BPE tokens, raw content for
 * added ones); tokenizer.ggml.token_type (1 normal, 3 control = special added token,
 * 4 user-defined = added token, 5 unused = [PADn] filler up to the embedding rows);
 * tokenizer.ggml.merges ("a b" strings, rank order); bos/eos/padding_token_id;
 * tokenizer.ggml.add_bos_token; tokenizer.chat_template.
 */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer_impl.h"

enum {
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER_DEFINED = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6
};

static const char SRC[] = "gguf tokenizer";

static qwenrt_status check_kind(const struct gguf_file *gf, struct tokenizer *t,
                                struct qwenrt_error *err)
{
    const char *model = gguf_get_string(gf, "tokenizer.ggml.model");
    const char *pre = gguf_get_string(gf, "tokenizer.ggml.pre");
    if (!model)
        return err_set(err, QWENRT_ERR_NOT_FOUND, "%s: key 'tokenizer.ggml.model' is missing", SRC);
    if (strcmp(model, "gpt2"))
        return err_set(err, QWENRT_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.model is '%s', expected 'gpt2' (byte-level BPE)", SRC,
                       model);
    if (!pre)
        return err_set(err, QWENRT_ERR_NOT_FOUND, "%s: key 'tokenizer.ggml.pre' is missing", SRC);
    if (!strcmp(pre, "qwen2"))
        t->pretok = PRETOK_QWEN3;
    else if (!strcmp(pre, "qwen35"))
        t->pretok = PRETOK_QWEN35;
    else
        return err_set(err, QWENRT_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.pre is '%s', expected 'qwen2' or 'qwen35'", SRC, pre);
    t->nfc = true;
    return QWENRT_OK;
}

static qwenrt_status add_tokens(const struct gguf_file *gf, struct tokenizer *t,
                                struct qwenrt_error *err)
{
    const struct gguf_value *tokens = gguf_get_array(gf, "tokenizer.ggml.tokens");
    const struct gguf_value *types = gguf_get_array(gf, "tokenizer.ggml.token_type");
    if (!tokens || tokens->v.arr.elem_type != GGUF_TYPE_STRING)
        return err_set(err, QWENRT_ERR_NOT_FOUND,
                       "%s: key 'tokenizer.ggml.tokens' (array of strings) is missing", SRC);
    uint64_t n = tokens->v.arr.count;
    if (n == 0 || n > TOKENIZER_MAX_VOCAB)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", SRC,
                       (unsigned long long)n);
    if (types && types->v.arr.count != n)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: tokenizer.ggml.token_type has %llu entries, tokens %llu", SRC,
                       (unsigned long long)types->v.arr.count, (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_string *s = &tokens->v.arr.items[i].v.str;
        int64_t ty = types ? types->v.arr.items[i].v.i64 : TT_NORMAL;
        unsigned f = ty == TT_CONTROL        ? TOKF_ADDED | TOKF_SPECIAL
                     : ty == TT_USER_DEFINED ? TOKF_ADDED
                     : ty == TT_UNUSED       ? TOKF_UNUSED
                                             : 0;
        qwenrt_status st = tok_add_token(t, (int32_t)i, s->str, s->len, f, err);
        if (st != QWENRT_OK)
            return st;
    }
    return QWENRT_OK;
}

static qwenrt_status add_merges(const struct gguf_file *gf, struct tokenizer *t,
                                struct qwenrt_error *err)
{
    const struct gguf_value *merges = gguf_get_array(gf, "tokenizer.ggml.merges");
    if (!merges || merges->v.arr.elem_type != GGUF_TYPE_STRING)
        return err_set(err, QWENRT_ERR_NOT_FOUND,
                       "%s: key 'tokenizer.ggml.merges' (array of strings) is missing", SRC);
    for (uint64_t i = 0; i < merges->v.arr.count; i++) {
        const struct gguf_string *s = &merges->v.arr.items[i].v.str;
        const char *sp = memchr(s->str, ' ', s->len);
        if (!sp)
            return err_set(err, QWENRT_ERR_FORMAT,
                           "%s: tokenizer.ggml.merges[%llu] '%s' has no space", SRC,
                           (unsigned long long)i, s->str);
        size_t alen = (size_t)(sp - s->str);
        qwenrt_status st =
            tok_add_merge(t, s->str, alen, sp + 1, s->len - alen - 1, "tokenizer.ggml.merges", err);
        if (st != QWENRT_OK)
            return st;
    }
    return QWENRT_OK;
}

static int32_t get_id(const struct gguf_file *gf, const char *key, const struct tokenizer *t)
{
    int64_t v;
    if (!gguf_get_int(gf, key, &v) || v < 0 || v >= t->n_vocab)
        return -1;
    return (int32_t)v;
}

qwenrt_status tokenizer_load_gguf(struct tokenizer **out, const struct gguf_file *gf,
                                  struct qwenrt_error *err)
{
    struct tokenizer *t = NULL;
    qwenrt_status st;
    *out = NULL;
    if ((st = tok_new(&t, err)) != QWENRT_OK)
        return st;
    const struct gguf_value *merges = gguf_get_array(gf, "tokenizer.ggml.merges");
    if ((st = check_kind(gf, t, err)) || (st = add_tokens(gf, t, err)) ||
        (st = tok_index_vocab(t, merges ? (size_t)merges->v.arr.count : 0, SRC, err)) ||
        (st = add_merges(gf, t, err)))
        goto out_free;
    t->eos_config = get_id(gf, "tokenizer.ggml.eos_token_id", t);
    t->special.pad = get_id(gf, "tokenizer.ggml.padding_token_id", t);
    bool add_bos = false;
    if (gguf_get_bool(gf, "tokenizer.ggml.add_bos_token", &add_bos) && add_bos)
        t->special.bos = get_id(gf, "tokenizer.ggml.bos_token_id", t);
    const char *tpl = gguf_get_string(gf, "tokenizer.chat_template");
    if (tpl && !(t->chat_template = xstrdup(tpl))) {
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", SRC);
        goto out_free;
    }
    st = tok_finish(t, SRC, err);
out_free:
    if (st != QWENRT_OK)
        tokenizer_free(t);
    else
        *out = t;
    return st;
}

/* Merges in rank order, as "a b" strings (xmalloc'd array of xmalloc'd strings). */
static qwenrt_status collect_merges(const struct tokenizer *t, char ***out, uint64_t *n_out,
                                    struct qwenrt_error *err)
{
    size_t n = (size_t)t->n_merges;
    const struct merge_slot **by_rank = xcalloc(n ? n : 1, sizeof(*by_rank));
    char **strs = xcalloc(n ? n : 1, sizeof(*strs));
    uint64_t k = 0;
    qwenrt_status st = QWENRT_OK;
    if (!by_rank || !strs) {
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory for merges", SRC);
        goto out;
    }
    for (uint64_t i = 0; i <= t->merge_mask; i++)
        if (t->merges[i].key != MERGE_EMPTY)
            by_rank[t->merges[i].rank] = &t->merges[i];
    for (size_t r = 0; r < n; r++) {
        if (!by_rank[r])
            continue; /* a repeated merge: only its first rank counts */
        int32_t a = (int32_t)(by_rank[r]->key >> 32), b = (int32_t)(uint32_t)by_rank[r]->key;
        size_t la = t->str_len[a], lb = t->str_len[b];
        char *s = xmalloc(la + lb + 2, 1);
        if (!s) {
            st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory for merges", SRC);
            goto out;
        }
        memcpy(s, t->strs + t->str_off[a], la);
        s[la] = ' ';
        memcpy(s + la + 1, t->strs + t->str_off[b], lb);
        s[la + lb + 1] = '\0';
        strs[k++] = s;
    }
out:
    xfree(by_rank);
    if (st != QWENRT_OK) {
        for (uint64_t i = 0; strs && i < k; i++)
            xfree(strs[i]);
        xfree(strs);
        return st;
    }
    *out = strs;
    *n_out = k;
    return QWENRT_OK;
}

qwenrt_status tokenizer_write_gguf_kv(const struct tokenizer *t, struct gguf_writer *w,
                                      int32_t pad_to, struct qwenrt_error *err)
{
    size_t n = (size_t)(pad_to > t->n_vocab ? pad_to : t->n_vocab);
    const char **tokens = xmalloc(n, sizeof(*tokens));
    int32_t *types = xmalloc(n, sizeof(*types));
    char *pads = xmalloc(n, 32); /* "[PAD<id>]" for holes */
    char **merges = NULL;
    uint64_t n_merges = 0;
    qwenrt_status st;
    if (!tokens || !types || !pads) {
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", SRC);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t f = i < (size_t)t->n_vocab ? t->flags[i] : 0;
        if (!(f & TOKF_PRESENT)) {
            snprintf(pads + i * 32, 32, "[PAD%zu]", i);
            tokens[i] = pads + i * 32;
            types[i] = TT_UNUSED;
            continue;
        }
        tokens[i] = t->strs + t->str_off[i];
        types[i] = (f & TOKF_SPECIAL)  ? TT_CONTROL
                   : (f & TOKF_ADDED)  ? TT_USER_DEFINED
                   : (f & TOKF_UNUSED) ? TT_UNUSED
                                       : TT_NORMAL;
    }
    if ((st = collect_merges(t, &merges, &n_merges, err)) != QWENRT_OK)
        goto out;
    int32_t eos = t->eos_config >= 0 ? t->eos_config : t->special.im_end;
    const char *pre = t->pretok == PRETOK_QWEN35 ? "qwen35" : "qwen2";
    if ((st = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2")) ||
        (st = gguf_writer_set_str(w, "tokenizer.ggml.pre", pre)) ||
        (st = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, n)) ||
        (st = gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, n)) ||
        (st = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges,
                                      n_merges)) ||
        (eos >= 0 && (st = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos))) ||
        (t->special.pad >= 0 && (st = gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id",
                                                          (uint32_t)t->special.pad))) ||
        (t->special.bos >= 0 &&
         (st = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)t->special.bos))) ||
        (st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", t->special.bos >= 0)) ||
        (t->chat_template &&
         (st = gguf_writer_set_str(w, "tokenizer.chat_template", t->chat_template))))
        st = err_set(err, st, "%s: could not set the tokenizer keys in the GGUF writer", SRC);
out:
    for (uint64_t i = 0; merges && i < n_merges; i++)
        xfree(merges[i]);
    xfree(merges);
    xfree(tokens);
    xfree(types);
    xfree(pads);
    return st;
}
