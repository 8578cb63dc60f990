/*
 * prompt_cache.h — session checkpoints keyed by the tokens they hold, so a request whose prompt
 * starts with a cached sequence restores it and processes only the rest (a multi-turn chat
 * processes only the new turn). Works for Qwen3.5: a checkpoint holds the KV cache *and* the
 * DeltaNet conv/recurrent state, which cannot be rewound, so only exact prefixes match
 * (no "longest common prefix then truncate", as an attention-only cache could do).
 *
 * Entries live in a list ordered by last use; inserting past the byte budget evicts the least
 * recently used. Lookup is a linear scan comparing token prefixes (entries are few: the budget
 * holds tens to hundreds of checkpoints). Used by the scheduler thread only: no locking.
 */
#ifndef QWENRT_SERVER_PROMPT_CACHE_H
#define QWENRT_SERVER_PROMPT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "qwenrt.h"

struct pcache_entry {
    int32_t *ids; /* [n] the tokens the checkpoint holds, xmalloc'd */
    int32_t n;
    struct qwenrt_checkpoint *cp; /* owned */
    size_t bytes;                 /* checkpoint + ids */
    uint64_t last_use;            /* pcache.clock at the last hit or insert */
};

struct pcache {
    struct pcache_entry *e; /* [n_entries], unordered */
    int n_entries, cap;
    size_t bytes, max_bytes; /* in use, budget (0 = cache off) */
    uint64_t clock;          /* bumped at every use */
};

void pcache_init(struct pcache *c, size_t max_bytes);
void pcache_free(struct pcache *c);

/* The longest entry whose tokens are a prefix of ids[0..n) (the whole prompt only when the
 * checkpoint has logits, which session snapshots always have); NULL when none. Marks it used. */
const struct pcache_entry *pcache_lookup(struct pcache *c, const int32_t *ids, int32_t n);

/* Snapshots the session (which holds exactly ids[0..n)) into the cache unless an entry with
 * these tokens exists or it alone exceeds the budget; evicts least recently used entries to
 * make room. Errors: NOMEM (the cache is unchanged). */
qwenrt_status pcache_insert(struct pcache *c, const struct qwenrt_session *s, const int32_t *ids,
                            int32_t n, struct qwenrt_error *err);

#endif
