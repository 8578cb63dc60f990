/*
 * tokenizer.c — building the vocabulary and merge tables, encoding (added tokens, NFC,
 * pre-tokeniser, BPE) and decoding (whole and streaming). Loaders: tokenizer_json.c and
 * tokenizer_gguf.c. See tokenizer.h for the behaviour and tokenizer_impl.h for the data.
 *
 * BPE applies the lowest-rank adjacent pair first (leftmost on ties) until no pair merges, as
 * `tokenizers` does. Pieces of up to BPE_SMALL bytes use arrays with cached pair ranks (a word
 * is a handful of lookups); longer pieces (CJK runs, long whitespace) use a binary heap of
 * candidate merges with lazy invalidation, O(n log n). A whole-piece cache was left out: it
 * would be mutable shared state, and the fixed cost is already small.
 */
#include "tokenizer/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/error.h"
#include "tokenizer/unicode.h"

#define BPE_SMALL 48

/* ------------------------------------------------------------------ hashing */

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static uint64_t hash_pair(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 29);
}

static uint32_t pow2_at_least(size_t n)
{
    uint32_t c = 16;
    while (c < n && c < (1u << 30))
        c <<= 1;
    return c;
}

/* ------------------------------------------------------------------ building */

qwenrt_status tok_new(struct tokenizer **out, struct qwenrt_error *err)
{
    struct tokenizer *t = xcalloc(1, sizeof(*t));
    if (!t)
        return err_set(err, QWENRT_ERR_NOMEM, "tokenizer: out of memory");
    t->pretok = PRETOK_QWEN3;
    t->eos_config = -1;
    t->special.bos = -1;
    t->special.pad = -1;
    *out = t;
    return QWENRT_OK;
}

static qwenrt_status grow_ids(struct tokenizer *t, int32_t id, struct qwenrt_error *err)
{
    if (id < t->cap_vocab)
        return QWENRT_OK;
    int32_t cap = t->cap_vocab ? t->cap_vocab : 1024;
    while (cap <= id)
        cap = cap > (1 << 29) ? id + 1 : cap * 2;
    uint8_t *f = xrealloc(t->flags, (size_t)cap, sizeof(*f));
    if (f)
        t->flags = f;
    uint32_t *o = xrealloc(t->str_off, (size_t)cap, sizeof(*o));
    if (o)
        t->str_off = o;
    uint32_t *l = xrealloc(t->str_len, (size_t)cap, sizeof(*l));
    if (l)
        t->str_len = l;
    if (!f || !o || !l)
        return err_set(err, QWENRT_ERR_NOMEM, "tokenizer: out of memory for %d tokens", cap);
    memset(t->flags + t->cap_vocab, 0, (size_t)(cap - t->cap_vocab));
    t->cap_vocab = cap;
    return QWENRT_OK;
}

qwenrt_status tok_add_token(struct tokenizer *t, int32_t id, const char *s, size_t len,
                            unsigned flags, struct qwenrt_error *err)
{
    qwenrt_status st;
    if (id < 0 || id >= TOKENIZER_MAX_VOCAB)
        return err_set(err, QWENRT_ERR_LIMIT, "tokenizer: token id %d is not below %d", id,
                       TOKENIZER_MAX_VOCAB);
    if (len >= (1u << 20))
        return err_set(err, QWENRT_ERR_FORMAT, "tokenizer: token %d is %zu bytes long", id, len);
    if ((st = grow_ids(t, id, err)) != QWENRT_OK)
        return st;
    if (t->strs_len + len + 1 > t->strs_cap) {
        size_t cap = t->strs_cap ? t->strs_cap : (1u << 20);
        while (cap < t->strs_len + len + 1)
            cap *= 2;
        if (cap > UINT32_MAX)
            return err_set(err, QWENRT_ERR_LIMIT, "tokenizer: vocabulary strings exceed 4 GiB");
        char *p = xrealloc(t->strs, cap, 1);
        if (!p)
            return err_set(err, QWENRT_ERR_NOMEM, "tokenizer: out of memory for %zu bytes", cap);
        t->strs = p;
        t->strs_cap = cap;
    }
    memcpy(t->strs + t->strs_len, s, len);
    t->strs[t->strs_len + len] = '\0';
    t->str_off[id] = (uint32_t)t->strs_len;
    t->str_len[id] = (uint32_t)len;
    t->strs_len += len + 1;
    t->flags[id] = (uint8_t)(TOKF_PRESENT | flags);
    if (id >= t->n_vocab)
        t->n_vocab = id + 1;
    return QWENRT_OK;
}

static int32_t map_find(const struct tokenizer *t, const char *s, size_t len)
{
    if (!t->map)
        return -1;
    uint32_t i = (uint32_t)hash_bytes(s, len) & t->map_mask;
    for (;;) {
        int32_t id = t->map[i];
        if (id < 0)
            return -1;
        if (t->str_len[id] == len && !memcmp(t->strs + t->str_off[id], s, len))
            return id;
        i = (i + 1) & t->map_mask;
    }
}

/* Inserts id unless its string is already mapped (the first id of a string wins). */
static void map_insert(struct tokenizer *t, int32_t id)
{
    const char *s = t->strs + t->str_off[id];
    uint32_t len = t->str_len[id];
    uint32_t i = (uint32_t)hash_bytes(s, len) & t->map_mask;
    while (t->map[i] >= 0) {
        int32_t o = t->map[i];
        if (t->str_len[o] == len && !memcmp(t->strs + t->str_off[o], s, len))
            return;
        i = (i + 1) & t->map_mask;
    }
    t->map[i] = id;
}

qwenrt_status tok_index_vocab(struct tokenizer *t, size_t n_merges_hint, const char *src,
                              struct qwenrt_error *err)
{
    if (t->n_vocab == 0)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: the vocabulary is empty", src);
    uint32_t cap = pow2_at_least((size_t)t->n_vocab * 2);
    t->map = xmalloc(cap, sizeof(*t->map));
    uint32_t mcap = pow2_at_least(n_merges_hint + n_merges_hint / 2 + 16);
    t->merges = xmalloc(mcap, sizeof(*t->merges));
    if (!t->map || !t->merges)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory for the vocabulary index", src);
    memset(t->map, 0xff, (size_t)cap * sizeof(*t->map));
    t->map_mask = cap - 1;
    for (size_t i = 0; i < mcap; i++)
        t->merges[i].key = MERGE_EMPTY;
    t->merge_mask = mcap - 1;
    /* regular tokens first so that they win over an added token with the same string */
    for (int32_t pass = 0; pass < 2; pass++)
        for (int32_t id = 0; id < t->n_vocab; id++) {
            uint8_t f = t->flags[id];
            if ((f & TOKF_PRESENT) && !(f & TOKF_UNUSED) && !!(f & TOKF_ADDED) == pass)
                map_insert(t, id);
        }
    return QWENRT_OK;
}

static const struct merge_slot *merge_find(const struct tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t i = hash_pair(key) & t->merge_mask;
    for (;;) {
        const struct merge_slot *s = &t->merges[i];
        if (s->key == key)
            return s;
        if (s->key == MERGE_EMPTY)
            return NULL;
        i = (i + 1) & t->merge_mask;
    }
}

static qwenrt_status merges_grow(struct tokenizer *t, struct qwenrt_error *err)
{
    uint64_t ncap = (t->merge_mask + 1) * 2;
    struct merge_slot *m = xmalloc(ncap, sizeof(*m));
    if (!m)
        return err_set(err, QWENRT_ERR_NOMEM, "tokenizer: out of memory for merges");
    for (uint64_t i = 0; i < ncap; i++)
        m[i].key = MERGE_EMPTY;
    for (uint64_t i = 0; i <= t->merge_mask; i++) {
        struct merge_slot s = t->merges[i];
        if (s.key == MERGE_EMPTY)
            continue;
        uint64_t j = hash_pair(s.key) & (ncap - 1);
        while (m[j].key != MERGE_EMPTY)
            j = (j + 1) & (ncap - 1);
        m[j] = s;
    }
    xfree(t->merges);
    t->merges = m;
    t->merge_mask = ncap - 1;
    return QWENRT_OK;
}

qwenrt_status tok_add_merge(struct tokenizer *t, const char *a, size_t alen, const char *b,
                            size_t blen, const char *src, struct qwenrt_error *err)
{
    char stackbuf[256];
    int32_t ia = map_find(t, a, alen), ib = map_find(t, b, blen);
    int32_t rank = t->n_merges;
    if (ia < 0 || ib < 0)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: merge %d: '%.*s' is not in the vocabulary", src,
                       rank, (int)(ia < 0 ? alen : blen), ia < 0 ? a : b);
    size_t n = alen + blen;
    char *cat = n <= sizeof(stackbuf) ? stackbuf : xmalloc(n, 1);
    if (!cat)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", src);
    memcpy(cat, a, alen);
    memcpy(cat + alen, b, blen);
    int32_t im = map_find(t, cat, n);
    if (cat != stackbuf)
        xfree(cat);
    if (im < 0)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: merge %d: '%.*s' + '%.*s' is not in the vocabulary", src, rank,
                       (int)alen, a, (int)blen, b);
    if ((uint64_t)(t->n_merges + 1) * 4 > (t->merge_mask + 1) * 3) { /* load <= 3/4 */
        qwenrt_status st = merges_grow(t, err);
        if (st != QWENRT_OK)
            return st;
    }
    uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    uint64_t i = hash_pair(key) & t->merge_mask;
    while (t->merges[i].key != MERGE_EMPTY && t->merges[i].key != key)
        i = (i + 1) & t->merge_mask;
    if (t->merges[i].key == MERGE_EMPTY) { /* a repeated merge keeps its first (lower) rank */
        t->merges[i].key = key;
        t->merges[i].rank = rank;
        t->merges[i].id = im;
    }
    t->n_merges++;
    return QWENRT_OK;
}

/* Decoded bytes of every token: the GPT-2 byte table applied to each char of the string, or
 * the string's own bytes when some char is outside the table (as the ByteLevel decoder). */
static qwenrt_status build_bytes(struct tokenizer *t, const char *src, struct qwenrt_error *err)
{
    t->bytes_off = xmalloc((size_t)t->n_vocab, sizeof(*t->bytes_off));
    t->bytes_len = xmalloc((size_t)t->n_vocab, sizeof(*t->bytes_len));
    t->bytes = xmalloc(t->strs_len + 1, 1); /* decoded bytes are never longer */
    if (!t->bytes_off || !t->bytes_len || !t->bytes)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory for token bytes", src);
    size_t k = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->bytes_off[id] = (uint32_t)k;
        t->bytes_len[id] = 0;
        if (!(t->flags[id] & TOKF_PRESENT))
            continue;
        const uint8_t *s = (const uint8_t *)t->strs + t->str_off[id];
        size_t n = t->str_len[id], i = 0, start = k;
        bool mapped = true;
        while (i < n) {
            size_t len;
            uint32_t cp;
            int b = -1;
            if (utf8_step(s + i, n - i, &len, &cp) == UTF8_OK)
                b = bytelevel_byte(cp);
            if (b < 0) {
                mapped = false;
                break;
            }
            t->bytes[k++] = (uint8_t)b;
            i += len;
        }
        if (!mapped) {
            memcpy(t->bytes + start, s, n);
            k = start + n;
        }
        t->bytes_len[id] = (uint32_t)(k - start);
    }
    return QWENRT_OK;
}

static int cmp_added(const void *pa, const void *pb, void *ctx);

/* Sorts added tokens by first byte, then longest first (qsort_r is glibc; avoided: a simple
 * insertion sort over ~30 entries). */
static void sort_added(struct tokenizer *t)
{
    for (size_t i = 1; i < t->n_added; i++) {
        int32_t x = t->added[i];
        size_t j = i;
        while (j > 0 && cmp_added(&t->added[j - 1], &x, t) > 0) {
            t->added[j] = t->added[j - 1];
            j--;
        }
        t->added[j] = x;
    }
}

static int cmp_added(const void *pa, const void *pb, void *ctx)
{
    const struct tokenizer *t = ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    uint8_t fa = (uint8_t)t->strs[t->str_off[a]], fb = (uint8_t)t->strs[t->str_off[b]];
    if (fa != fb)
        return fa < fb ? -1 : 1;
    if (t->str_len[a] != t->str_len[b])
        return t->str_len[a] > t->str_len[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

static qwenrt_status index_added(struct tokenizer *t, const char *src, struct qwenrt_error *err)
{
    size_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((t->flags[id] & TOKF_ADDED) && t->str_len[id] > 0)
            n++;
    t->added = xmalloc(n ? n : 1, sizeof(*t->added));
    if (!t->added)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", src);
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((t->flags[id] & TOKF_ADDED) && t->str_len[id] > 0)
            t->added[t->n_added++] = id;
    sort_added(t);
    size_t k = 0;
    for (unsigned b = 0; b <= 256; b++) {
        while (k < n && b < 256 && (uint8_t)t->strs[t->str_off[t->added[k]]] < b)
            k++;
        t->added_first[b] = (uint32_t)(b == 256 ? n : k);
    }
    return QWENRT_OK;
}

void tok_find_special(struct tokenizer *t)
{
    struct tokenizer_special *s = &t->special;
    s->im_start = map_find(t, "<|im_start|>", 12);
    s->im_end = map_find(t, "<|im_end|>", 10);
    s->think = map_find(t, "<think>", 7);
    s->think_end = map_find(t, "</think>", 8);
    int32_t eot = map_find(t, "<|endoftext|>", 13);
    if (s->pad < 0)
        s->pad = eot;
    int32_t cand[3] = {t->eos_config, s->im_end, eot};
    s->n_eos = 0;
    for (int i = 0; i < 3; i++) {
        bool dup = cand[i] < 0;
        for (int j = 0; j < s->n_eos && !dup; j++)
            dup = s->eos[j] == cand[i];
        if (!dup)
            s->eos[s->n_eos++] = cand[i];
    }
}

qwenrt_status tok_finish(struct tokenizer *t, const char *src, struct qwenrt_error *err)
{
    qwenrt_status st;
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        size_t n = utf8_put(bytelevel_char((uint8_t)b), u);
        t->byte_id[b] = map_find(t, (const char *)u, n);
        if (t->byte_id[b] < 0 || (t->flags[t->byte_id[b]] & TOKF_ADDED))
            return err_set(err, QWENRT_ERR_FORMAT,
                           "%s: byte 0x%02x has no token '%.*s' (not a byte-level BPE vocabulary)",
                           src, b, (int)n, (const char *)u);
    }
    if ((st = build_bytes(t, src, err)) != QWENRT_OK)
        return st;
    if ((st = index_added(t, src, err)) != QWENRT_OK)
        return st;
    tok_find_special(t);
    return QWENRT_OK;
}

void tokenizer_free(struct tokenizer *t)
{
    if (!t)
        return;
    xfree(t->flags);
    xfree(t->str_off);
    xfree(t->str_len);
    xfree(t->strs);
    xfree(t->bytes_off);
    xfree(t->bytes_len);
    xfree(t->bytes);
    xfree(t->map);
    xfree(t->merges);
    xfree(t->added);
    xfree(t->chat_template);
    xfree(t);
}

qwenrt_status tokenizer_find_json(const char *model_dir, char **path, struct qwenrt_error *err)
{
    size_t n = strlen(model_dir);
    char *p = xmalloc(n + 32, 1);
    if (!p)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", model_dir);
    while (n > 1 && model_dir[n - 1] == '/')
        n--;
    memcpy(p, model_dir, n);
    strcpy(p + n, "/tokenizer.json");
    struct stat sb;
    if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        err_set(err, QWENRT_ERR_NOT_FOUND, "%s: no tokenizer.json in the model directory", p);
        xfree(p);
        return QWENRT_ERR_NOT_FOUND;
    }
    *path = p;
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ lookups */

int32_t tokenizer_n_vocab(const struct tokenizer *t)
{
    return t->n_vocab;
}

static bool id_ok(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKF_PRESENT);
}

const char *tokenizer_token_str(const struct tokenizer *t, int32_t id, size_t *len)
{
    if (!id_ok(t, id))
        return NULL;
    if (len)
        *len = t->str_len[id];
    return t->strs + t->str_off[id];
}

const uint8_t *tokenizer_token_bytes(const struct tokenizer *t, int32_t id, size_t *len)
{
    if (!id_ok(t, id))
        return NULL;
    if (len)
        *len = t->bytes_len[id];
    return t->bytes + t->bytes_off[id];
}

int32_t tokenizer_token_id(const struct tokenizer *t, const char *str, size_t len)
{
    return map_find(t, str, len);
}

bool tokenizer_is_special(const struct tokenizer *t, int32_t id)
{
    return id_ok(t, id) && (t->flags[id] & TOKF_SPECIAL);
}

const struct tokenizer_special *tokenizer_special_ids(const struct tokenizer *t)
{
    return &t->special;
}

bool tokenizer_is_eos(const struct tokenizer *t, int32_t id)
{
    for (int i = 0; i < t->special.n_eos; i++)
        if (t->special.eos[i] == id)
            return true;
    return false;
}

enum pretok_kind tokenizer_pretok_kind(const struct tokenizer *t)
{
    return t->pretok;
}

const char *tokenizer_chat_template(const struct tokenizer *t)
{
    return t->chat_template;
}

/* ------------------------------------------------------------------ encoding */

struct ivec {
    int32_t *v;
    size_t n, cap;
};

static qwenrt_status ivec_reserve(struct ivec *a, size_t extra, struct qwenrt_error *err)
{
    if (a->n + extra <= a->cap)
        return QWENRT_OK;
    size_t cap = a->cap ? a->cap : 256;
    while (cap < a->n + extra)
        cap *= 2;
    int32_t *v = xrealloc(a->v, cap, sizeof(*v));
    if (!v)
        return err_set(err, QWENRT_ERR_NOMEM, "tokenizer: out of memory for %zu ids", cap);
    a->v = v;
    a->cap = cap;
    return QWENRT_OK;
}

/* Scratch for long pieces, reused across pieces of one encode call. */
struct heap_entry {
    int32_t rank;
    int32_t pos;  /* index of the left symbol */
    int32_t left; /* ids the pair had when pushed, to detect stale entries */
    int32_t right;
};

struct bpe_scratch {
    int32_t *id, *prev, *next; /* [cap] symbols */
    struct heap_entry *heap;   /* [cap] */
    size_t cap;
};

static int32_t pair_rank(const struct tokenizer *t, int32_t a, int32_t b, int32_t *merged)
{
    const struct merge_slot *m = merge_find(t, a, b);
    if (!m)
        return INT32_MAX;
    *merged = m->id;
    return m->rank;
}

/* Pieces of up to BPE_SMALL bytes: ids[] with the rank of each adjacent pair cached. */
static size_t bpe_small(const struct tokenizer *t, const uint8_t *s, size_t n, int32_t *ids)
{
    int32_t rank[BPE_SMALL], merged[BPE_SMALL];
    for (size_t i = 0; i < n; i++)
        ids[i] = t->byte_id[s[i]];
    for (size_t i = 0; i + 1 < n; i++)
        rank[i] = pair_rank(t, ids[i], ids[i + 1], &merged[i]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best])
                best = i;
        if (rank[best] == INT32_MAX)
            break;
        ids[best] = merged[best];
        n--;
        for (size_t i = best + 1; i < n; i++) /* close the gap (short arrays: no memmove) */
            ids[i] = ids[i + 1];
        for (size_t i = best + 1; i + 1 < n; i++) {
            rank[i] = rank[i + 1];
            merged[i] = merged[i + 1];
        }
        if (best > 0)
            rank[best - 1] = pair_rank(t, ids[best - 1], ids[best], &merged[best - 1]);
        if (best + 1 < n)
            rank[best] = pair_rank(t, ids[best], ids[best + 1], &merged[best]);
    }
    return n;
}

static bool heap_less(const struct heap_entry *a, const struct heap_entry *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct heap_entry *h, size_t *n, struct heap_entry e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct heap_entry heap_pop(struct heap_entry *h, size_t *n)
{
    struct heap_entry top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c]))
            c++;
        if (!heap_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static void push_pair(const struct tokenizer *t, struct bpe_scratch *sc, size_t *nh, int32_t pos)
{
    int32_t nx = sc->next[pos], m;
    if (nx < 0)
        return;
    int32_t r = pair_rank(t, sc->id[pos], sc->id[nx], &m);
    if (r != INT32_MAX)
        heap_push(sc->heap, nh, (struct heap_entry){r, pos, sc->id[pos], sc->id[nx]});
}

/* Long pieces: symbols in a linked list, candidate merges in a heap with lazy invalidation
 * (n-1 initial pairs plus at most two per merge, so fewer than 3n entries). */
static qwenrt_status bpe_long(const struct tokenizer *t, struct bpe_scratch *sc, const uint8_t *s,
                              size_t n, struct ivec *out, struct qwenrt_error *err)
{
    if (n > sc->cap) {
        size_t cap = n * 2;
        xfree(sc->id);
        xfree(sc->prev);
        xfree(sc->next);
        xfree(sc->heap);
        sc->id = xmalloc(cap, sizeof(*sc->id));
        sc->prev = xmalloc(cap, sizeof(*sc->prev));
        sc->next = xmalloc(cap, sizeof(*sc->next));
        sc->heap = xmalloc(cap * 3 / 2, sizeof(*sc->heap)); /* n-1 pairs + 2 per merge < 3n */
        sc->cap = (sc->id && sc->prev && sc->next && sc->heap) ? cap : 0;
        if (!sc->cap)
            return err_set(err, QWENRT_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte piece",
                           n);
    }
    for (size_t i = 0; i < n; i++) {
        sc->id[i] = t->byte_id[s[i]];
        sc->prev[i] = (int32_t)i - 1;
        sc->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++)
        push_pair(t, sc, &nh, (int32_t)i);
    while (nh > 0) {
        struct heap_entry e = heap_pop(sc->heap, &nh);
        int32_t p = e.pos, q = sc->next[p], m;
        if (sc->id[p] != e.left || q < 0 || sc->id[q] != e.right)
            continue; /* stale: one side merged since */
        pair_rank(t, e.left, e.right, &m);
        sc->id[p] = m;
        sc->id[q] = -1;
        sc->next[p] = sc->next[q];
        if (sc->next[q] >= 0)
            sc->prev[sc->next[q]] = p;
        if (sc->prev[p] >= 0)
            push_pair(t, sc, &nh, sc->prev[p]);
        push_pair(t, sc, &nh, p);
    }
    qwenrt_status st = ivec_reserve(out, n, err);
    if (st != QWENRT_OK)
        return st;
    for (int32_t i = 0; i >= 0; i = sc->next[i])
        out->v[out->n++] = sc->id[i];
    return QWENRT_OK;
}

static qwenrt_status bpe_piece(const struct tokenizer *t, struct bpe_scratch *sc, const uint8_t *s,
                               size_t n, struct ivec *out, struct qwenrt_error *err)
{
    if (n > BPE_SMALL)
        return bpe_long(t, sc, s, n, out, err);
    qwenrt_status st = ivec_reserve(out, n, err);
    if (st != QWENRT_OK)
        return st;
    out->n += bpe_small(t, s, n, out->v + out->n);
    return QWENRT_OK;
}

/* Text between added tokens: NFC, pre-tokenise, BPE each piece. */
static qwenrt_status encode_segment(const struct tokenizer *t, struct bpe_scratch *sc,
                                    const char *s, size_t n, struct ivec *out,
                                    struct qwenrt_error *err)
{
    char *norm = NULL;
    size_t *ends = NULL, np = 0, nn = n;
    qwenrt_status st = QWENRT_OK;
    if (n == 0)
        return QWENRT_OK;
    if (t->nfc && (st = unicode_nfc(s, n, &norm, &nn, err)) != QWENRT_OK)
        return st;
    const char *text = norm ? norm : s;
    if ((st = pretok_split(t->pretok, text, nn, &ends, &np, err)) != QWENRT_OK)
        goto out_free;
    size_t start = 0;
    for (size_t i = 0; i < np && st == QWENRT_OK; i++) {
        st = bpe_piece(t, sc, (const uint8_t *)text + start, ends[i] - start, out, err);
        start = ends[i];
    }
out_free:
    xfree(ends);
    xfree(norm);
    return st;
}

/* Longest added token starting at s[0..n), or -1. */
static int32_t match_added(const struct tokenizer *t, const char *s, size_t n)
{
    uint8_t b = (uint8_t)s[0];
    for (uint32_t k = t->added_first[b]; k < t->added_first[b + 1]; k++) {
        int32_t id = t->added[k];
        uint32_t len = t->str_len[id];
        if (len <= n && !memcmp(s, t->strs + t->str_off[id], len))
            return id; /* sorted longest first */
    }
    return -1;
}

qwenrt_status tokenizer_encode(const struct tokenizer *t, const char *text, size_t len,
                               int32_t **ids, size_t *n, struct qwenrt_error *err)
{
    struct ivec out = {0};
    struct bpe_scratch sc = {0};
    char *clean = NULL;
    qwenrt_status st = QWENRT_OK;
    *ids = NULL;
    *n = 0;
    if (!utf8_is_valid((const uint8_t *)text, len)) {
        if ((st = utf8_sanitize((const uint8_t *)text, len, false, &clean, &len, NULL, err)))
            return st;
        text = clean;
    }
    size_t seg = 0;
    for (size_t i = 0; i < len && st == QWENRT_OK;) {
        uint8_t b = (uint8_t)text[i];
        int32_t id =
            t->added_first[b] < t->added_first[b + 1] ? match_added(t, text + i, len - i) : -1;
        if (id < 0) {
            i++;
            continue;
        }
        st = encode_segment(t, &sc, text + seg, i - seg, &out, err);
        if (st == QWENRT_OK && (st = ivec_reserve(&out, 1, err)) == QWENRT_OK)
            out.v[out.n++] = id;
        i += t->str_len[id];
        seg = i;
    }
    if (st == QWENRT_OK)
        st = encode_segment(t, &sc, text + seg, len - seg, &out, err);
    xfree(sc.id);
    xfree(sc.prev);
    xfree(sc.next);
    xfree(sc.heap);
    xfree(clean);
    if (st != QWENRT_OK) {
        xfree(out.v);
        return st;
    }
    *ids = out.v;
    *n = out.n;
    return QWENRT_OK;
}

/* ------------------------------------------------------------------ decoding */

qwenrt_status tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, char **text,
                               size_t *len, struct qwenrt_error *err)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!id_ok(t, ids[i]))
            return err_set(err, QWENRT_ERR_INVALID_ARG,
                           "decode: id %d at position %zu is not in the vocabulary (size %d)",
                           ids[i], i, t->n_vocab);
        total += t->bytes_len[ids[i]];
    }
    uint8_t *raw = xmalloc(total + 1, 1);
    if (!raw)
        return err_set(err, QWENRT_ERR_NOMEM, "decode: out of memory for %zu bytes", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(raw + k, t->bytes + t->bytes_off[ids[i]], t->bytes_len[ids[i]]);
        k += t->bytes_len[ids[i]];
    }
    raw[k] = '\0';
    qwenrt_status st = QWENRT_OK;
    if (utf8_is_valid(raw, k)) {
        *text = (char *)raw;
        *len = k;
    } else {
        st = utf8_sanitize(raw, k, false, text, len, NULL, err);
        xfree(raw);
    }
    return st;
}

void tokenizer_stream_init(struct tokenizer_stream *st, const struct tokenizer *tok,
                           bool skip_special)
{
    memset(st, 0, sizeof(*st));
    st->tok = tok;
    st->skip_special = skip_special;
}

qwenrt_status tokenizer_stream_push(struct tokenizer_stream *st, int32_t id, const char **text,
                                    size_t *len, struct qwenrt_error *err)
{
    const struct tokenizer *t = st->tok;
    *text = "";
    *len = 0;
    if (!id_ok(t, id))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "decode: id %d is not in the vocabulary", id);
    if (st->skip_special && (t->flags[id] & TOKF_SPECIAL))
        return QWENRT_OK;
    size_t n = st->n_pending + t->bytes_len[id];
    uint8_t *raw = xmalloc(n, 1);
    if (!raw)
        return err_set(err, QWENRT_ERR_NOMEM, "decode: out of memory");
    memcpy(raw, st->pending, st->n_pending);
    memcpy(raw + st->n_pending, t->bytes + t->bytes_off[id], t->bytes_len[id]);
    char *out;
    size_t out_len, tail;
    qwenrt_status s = utf8_sanitize(raw, n, true, &out, &out_len, &tail, err);
    if (s == QWENRT_OK) {
        memcpy(st->pending, raw + n - tail, tail);
        st->n_pending = tail;
        xfree(st->buf);
        st->buf = out;
        *text = out;
        *len = out_len;
    }
    xfree(raw);
    return s;
}

qwenrt_status tokenizer_stream_flush(struct tokenizer_stream *st, const char **text, size_t *len,
                                     struct qwenrt_error *err)
{
    char *out;
    size_t out_len;
    *text = "";
    *len = 0;
    qwenrt_status s = utf8_sanitize(st->pending, st->n_pending, false, &out, &out_len, NULL, err);
    if (s != QWENRT_OK)
        return s;
    st->n_pending = 0;
    xfree(st->buf);
    st->buf = out;
    *text = out;
    *len = out_len;
    return QWENRT_OK;
}

void tokenizer_stream_free(struct tokenizer_stream *st)
{
    if (!st)
        return;
    xfree(st->buf);
    st->buf = NULL;
    st->n_pending = 0;
}
