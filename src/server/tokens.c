/*
 * tokens.c — /tokenize and /detokenize request and response bodies (tokens.h).
 */
#include "server/tokens.h"

#include <jansson.h>
#include <string.h>

#include "base/alloc.h"

static bool bad(struct oai_error *e, const char *param, const char *msg)
{
    return oai_fail(e, 400, "invalid_request_error", NULL, param, "%s", msg);
}

/* {"id": id, "piece": text or [bytes]} */
static json_t *piece_json(const struct tokenizer *tok, int32_t id)
{
    size_t n = 0;
    const uint8_t *b = tokenizer_token_bytes(tok, id, &n);
    json_t *piece = b ? json_stringn((const char *)b, n) : NULL;
    if (b && !piece) { /* not valid UTF-8 alone: the bytes */
        piece = json_array();
        for (size_t i = 0; piece && i < n; i++)
            if (json_array_append_new(piece, json_integer(b[i]))) {
                json_decref(piece);
                piece = NULL;
            }
    }
    if (!b)
        piece = json_string("");
    return piece ? json_pack("{s:i,s:o}", "id", (int)id, "piece", piece) : NULL;
}

bool tokens_tokenize(const struct tokenizer *tok, const char *body, size_t len, char **json,
                     struct oai_error *e)
{
    *json = NULL;
    json_t *root = oai_load_object(body, len, e);
    if (!root)
        return false;
    json_t *content = json_object_get(root, "content"), *wp = json_object_get(root, "with_pieces");
    json_t *as = json_object_get(root, "add_special");
    bool ok = false;
    if (!json_is_string(content))
        bad(e, "content", "'content' must be a string");
    else if ((wp && !json_is_boolean(wp)) || (as && !json_is_boolean(as)))
        bad(e, wp && !json_is_boolean(wp) ? "with_pieces" : "add_special", "must be true or false");
    else
        ok = true;
    int32_t *ids = NULL;
    size_t n = 0;
    struct qwenrt_error err = {0};
    if (ok && tokenizer_encode(tok, json_string_value(content), json_string_length(content), &ids, &n, &err)) {
        ok = oai_fail(e, 400, "invalid_request_error", NULL, "content", "%s", err.message);
    } else if (ok && n > TOKENS_MAX) {
        ok = bad(e, "content", "the text has more tokens than this server returns");
    }
    json_t *arr = ok ? json_array() : NULL;
    for (size_t i = 0; arr && i < n; i++) {
        json_t *t = json_is_true(wp) ? piece_json(tok, ids[i]) : json_integer(ids[i]);
        if (!t || json_array_append_new(arr, t)) {
            json_decref(arr);
            arr = NULL;
        }
    }
    xfree(ids);
    json_decref(root);
    if (!ok)
        return false;
    if (!arr || !(*json = oai_dump(json_pack("{s:o}", "tokens", arr))))
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

bool tokens_detokenize(const struct tokenizer *tok, const char *body, size_t len, char **json,
                       struct oai_error *e)
{
    *json = NULL;
    json_t *root = oai_load_object(body, len, e), *v, *x;
    if (!root)
        return false;
    v = json_object_get(root, "tokens");
    size_t n = json_is_array(v) ? json_array_size(v) : 0, i;
    int32_t nv = tokenizer_n_vocab(tok);
    int32_t *ids = n ? xcalloc(n, sizeof(int32_t)) : NULL;
    bool ok = true;
    if (!json_is_array(v))
        ok = bad(e, "tokens", "'tokens' must be an array of token ids");
    else if (n > TOKENS_MAX)
        ok = bad(e, "tokens", "more tokens than this server takes");
    else if (n && !ids)
        ok = oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_array_foreach(v, i, x)
    {
        if (!ok)
            break;
        json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
        if (id < 0 || id >= nv)
            ok = oai_fail(e, 400, "invalid_request_error", NULL, "tokens",
                          "'tokens[%zu]' is not a token id (0 to %d)", i, nv - 1);
        else
            ids[i] = (int32_t)id;
    }
    json_decref(root);
    char *text = NULL;
    size_t tlen = 0;
    struct qwenrt_error err = {0};
    if (ok && tokenizer_decode(tok, ids, n, &text, &tlen, &err))
        ok = oai_fail(e, 400, "invalid_request_error", NULL, "tokens", "%s", err.message);
    xfree(ids);
    if (ok) {
        json_t *s = json_stringn(text ? text : "", text ? tlen : 0);
        if (!s || !(*json = oai_dump(json_pack("{s:o}", "content", s))))
            ok = oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    xfree(text);
    return ok;
}
