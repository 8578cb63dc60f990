/*
 * prompt_cache.c — token-prefix keyed checkpoints with an LRU byte budget (prompt_cache.h).
 */
#include "server/prompt_cache.h"

#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

void pcache_init(struct pcache *c, size_t max_bytes)
{
    memset(c, 0, sizeof(*c));
    c->max_bytes = max_bytes;
}

static void drop(struct pcache *c, int i)
{
    c->bytes -= c->e[i].bytes;
    qwenrt_checkpoint_free(c->e[i].cp);
    xfree(c->e[i].ids);
    c->e[i] = c->e[--c->n_entries];
}

void pcache_free(struct pcache *c)
{
    if (!c)
        return;
    while (c->n_entries)
        drop(c, c->n_entries - 1);
    xfree(c->e);
    c->e = NULL;
    c->cap = 0;
}

const struct pcache_entry *pcache_lookup(struct pcache *c, const int32_t *ids, int32_t n)
{
    struct pcache_entry *best = NULL;
    for (int i = 0; i < c->n_entries; i++) {
        struct pcache_entry *e = &c->e[i];
        if (e->n > n || (best && e->n <= best->n))
            continue;
        if (!memcmp(e->ids, ids, (size_t)e->n * sizeof(*ids)))
            best = e;
    }
    if (best)
        best->last_use = ++c->clock;
    return best;
}

static void evict_lru(struct pcache *c)
{
    int lru = 0;
    for (int i = 1; i < c->n_entries; i++)
        if (c->e[i].last_use < c->e[lru].last_use)
            lru = i;
    drop(c, lru);
}

qwenrt_status pcache_insert(struct pcache *c, const struct qwenrt_session *s, const int32_t *ids,
                            int32_t n, struct qwenrt_error *err)
{
    if (n <= 0 || !c->max_bytes)
        return QWENRT_OK;
    for (int i = 0; i < c->n_entries; i++)
        if (c->e[i].n == n && !memcmp(c->e[i].ids, ids, (size_t)n * sizeof(*ids))) {
            c->e[i].last_use = ++c->clock;
            return QWENRT_OK;
        }
    struct pcache_entry e = {0};
    qwenrt_status st = qwenrt_session_snapshot(s, &e.cp, err);
    if (st)
        return st;
    e.n = n;
    e.bytes = (size_t)qwenrt_checkpoint_bytes(e.cp) + (size_t)n * sizeof(*ids);
    if (e.bytes > c->max_bytes) {
        qwenrt_checkpoint_free(e.cp);
        return QWENRT_OK;
    }
    if (!(e.ids = xmalloc((size_t)n, sizeof(*ids))))
        goto out_nomem;
    memcpy(e.ids, ids, (size_t)n * sizeof(*ids));
    if (c->n_entries == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        struct pcache_entry *ne = xrealloc(c->e, (size_t)cap, sizeof(*ne));
        if (!ne)
            goto out_nomem;
        c->e = ne;
        c->cap = cap;
    }
    while (c->n_entries && c->bytes + e.bytes > c->max_bytes)
        evict_lru(c);
    e.last_use = ++c->clock;
    c->e[c->n_entries++] = e;
    c->bytes += e.bytes;
    return QWENRT_OK;
out_nomem:
    qwenrt_checkpoint_free(e.cp);
    xfree(e.ids);
    return err_set(err, QWENRT_ERR_NOMEM, "prompt cache: out of memory for %d tokens", n);
}
