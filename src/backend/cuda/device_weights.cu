/*
 * device_weights.cu — the device copy of a model's weights, shared by the model's CUDA sessions.
 *
 * Every session of a model reads the same bytes: the arena that collect() (cuda_session.cu)
 * lays out from the model's plans. Until session 55 each session uploaded its own, so
 * `qwenrt serve --parallel 4` held four copies (6 GB for Qwen3.5-0.8B BF16). Now the first
 * session of a model on a device uploads the copy, the sessions after it take the same one,
 * and the last to be freed frees it. The model keeps the pointer and the lock that guards it
 * (struct model_device_weights in model.h): the one thing in a model that changes after load.
 * A session made without a slot (cuda_session_init: tests, cuda_bench) keeps a copy of its own.
 *
 * A copy is shared only with a session on the same device whose layout has the same bytes and
 * entries (the plans are the model's, so every session of it has the same; the check guards
 * against a caller with plans of its own). Nothing writes to the arena after the upload.
 *
 * The LM head's 8-bit copy (lm_screen.cuh, 165 / 270 MB for Qwen3-0.6B / 3.5-0.8B) is derived from the weights alone, so it
 * lives here too: the first session that screens makes it (weights_screen_copy), the others
 * share it, and it goes with the weights. Each session keeps its own screen buffers.
 */
#include "backend/cuda/cuda_session.cuh"

extern "C" {
#include "base/alloc.h"
}

struct cuda_weights {
    uint8_t *arena;             /* the device copy */
    size_t bytes;               /* its layout: arena bytes and entries (collect) */
    int32_t n_map;
    int dev;                    /* the device it is on */
    int32_t refs;               /* sessions holding it (guarded by *mu where shared) */
    pthread_mutex_t *mu;        /* the slot's lock, NULL for a session's own copy */
    struct cuda_weights **slot; /* the model's pointer to it, NULL for a session's own copy */
    struct lm_screen_copy *screen; /* the LM head's 8-bit copy, or NULL (guarded by *mu) */
    bool screen_tried;          /* weights_screen_copy ran (screen NULL: none can be made) */
    struct cuda_alloc_count *allocs; /* the count of the session that uploaded it (dev_malloc) */
};

static bool fits(const struct cuda_weights *w, const struct cuda_session *cs, int dev)
{
    return w && w->dev == dev && w->bytes == cs->arena_bytes && w->n_map == cs->n_map;
}

/* A new copy of cs->map's host memory on device dev, after checking that dev has room. */
static qwenrt_status upload_copy(const struct cuda_session *cs, int dev, struct cuda_weights **out,
                                 struct qwenrt_error *err)
{
    *out = NULL;
    qwenrt_status st = cuda_probe((int64_t)cs->arena_bytes + (64 << 20), err);
    if (st)
        return err_prefix(err, "weights of %lld MiB: ", (long long)(cs->arena_bytes >> 20));
    struct cuda_weights *w = (struct cuda_weights *)xcalloc(1, sizeof(*w));
    if (!w)
        return err_set(err, QWENRT_ERR_NOMEM, "cuda: out of memory");
    w->bytes = cs->arena_bytes, w->n_map = cs->n_map, w->dev = dev, w->refs = 1, w->allocs = cs->opt.allocs;
    cudaError_t e = dev_malloc(w->allocs, &w->arena, cs->arena_bytes ? cs->arena_bytes : 256);
    for (int32_t i = 0; e == cudaSuccess && i < cs->n_map; i++)
        e = cudaMemcpy(w->arena + cs->map[i].off, cs->map[i].host, cs->map[i].bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        dev_free(w->allocs, w->arena);
        xfree(w);
        return cuda_fail(err, e, __FILE__, __LINE__, "the weights' upload (cudaMalloc, cudaMemcpy)");
    }
    *out = w;
    return QWENRT_OK;
}

qwenrt_status weights_acquire(struct cuda_session *cs, pthread_mutex_t *mu, struct cuda_weights **slot,
                              struct qwenrt_error *err)
{
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (mu)
        pthread_mutex_lock(mu);
    struct cuda_weights *w = slot ? *slot : NULL;
    qwenrt_status st = QWENRT_OK;
    if (fits(w, cs, dev)) {
        w->refs++;
    } else if ((st = upload_copy(cs, dev, &w, err)) == QWENRT_OK && slot && !*slot) {
        w->mu = mu, w->slot = slot;
        *slot = w;
    }
    if (mu)
        pthread_mutex_unlock(mu);
    if (st)
        return st;
    cs->weights = w;
    cs->arena = w->arena;
    return QWENRT_OK;
}

void weights_release(struct cuda_weights *w)
{
    if (!w)
        return;
    if (w->mu)
        pthread_mutex_lock(w->mu);
    bool last = --w->refs == 0;
    if (last && w->slot && *w->slot == w)
        *w->slot = NULL;
    if (w->mu)
        pthread_mutex_unlock(w->mu);
    if (last) {
        lm_screen_copy_free(w->screen);
        dev_free(w->allocs, w->arena);
        xfree(w);
    }
}

const struct lm_screen_copy *weights_screen_copy(struct cuda_weights *w, const void *rows, int32_t dtype, int32_t N,
                                                 int32_t K, int64_t row_bytes, cudaStream_t s)
{
    if (w->mu)
        pthread_mutex_lock(w->mu);
    if (!w->screen_tried) {
        w->screen_tried = true;
        struct qwenrt_error why;
        if (lm_screen_copy_build(rows, dtype, N, K, row_bytes, w->allocs, s, &w->screen, &why))
            cudaGetLastError(); /* no room for the copy (a GPU nearly full): the plain head serves */
    }
    const struct lm_screen_copy *c = w->screen && lm_screen_copy_rows(w->screen) == rows ? w->screen : NULL;
    if (w->mu)
        pthread_mutex_unlock(w->mu);
    return c;
}
