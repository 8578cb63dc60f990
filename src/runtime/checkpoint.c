/*
 * checkpoint.c — session checkpoints (public API in qwenrt.h, "checkpoints"): a snapshot of
 * one sequence's full state, kept in memory or written to a file, restored into any session
 * of the same model so that a chat continues without re-processing earlier turns.
 *
 * A checkpoint is a header plus a payload, the same bytes in memory and on disk:
 *   header (struct ckpt_header, 384 bytes, little-endian): magic, version, model identity
 *     (arch, geometry, sha256 of the hyper-parameters and a sample of the weights), n_ctx of
 *     the session it came from, n_past, payload size, sha256 of the payload and of the header.
 *   payload, per layer in order: attention layers K then V rows [0, n_past) of [kv_width] f32
 *     (a session with its cache in f16 converts them both ways: f16 -> f32 -> f16 is exact);
 *     DeltaNet layers conv state [conv_rows][conv_dim] then recurrent state [ssm_len] f32;
 *     then the last position's logits [n_vocab] f32 when the session had them.
 * Loading checks, in this order, size >= header, magic, version, header hash, model identity,
 * exact file size (truncation), payload hash, each with its own message. Files are written to
 * "<path>.tmp.<pid>", flushed, fsynced and renamed, so a crash never leaves half a checkpoint.
 * The payload hash is computed when saving, not when snapshotting, so in-memory snapshots cost
 * a copy only.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "base/alloc.h"
#include "base/error.h"
#include "base/sha256.h"
#include "runtime/session.h"

#define CKPT_MAGIC "QWRTCKPT"
#define CKPT_VERSION 1u
#define CKPT_WEIGHT_SAMPLE (64 * 1024) /* bytes of the embedding that enter the identity hash */

struct ckpt_header {
    char magic[8];           /* CKPT_MAGIC, no NUL */
    uint32_t version;        /* CKPT_VERSION */
    uint32_t header_bytes;   /* sizeof(struct ckpt_header) */
    uint32_t arch;           /* enum qr_arch */
    int32_t n_layer;         /* decoder layers */
    int32_t n_embd;          /* hidden size */
    int32_t n_vocab;         /* logits per position */
    int32_t kv_width;        /* floats per position per attention layer, K or V */
    int32_t conv_rows;       /* DeltaNet conv state rows (conv_k - 1), 0 for qwen3 */
    int32_t conv_dim;        /* DeltaNet conv channels, 0 for qwen3 */
    int32_t n_ctx;           /* context of the session that was snapshotted */
    int64_t ssm_len;         /* floats of recurrent state per DeltaNet layer */
    int32_t n_past;          /* tokens the state holds */
    int32_t has_logits;      /* 1 when the payload ends with the last logits */
    uint64_t payload_bytes;  /* bytes after the header */
    char model_hash[64];     /* hex sha256 of the model identity (model_identity) */
    char payload_sha256[64]; /* hex sha256 of the payload (filled when saving) */
    char header_sha256[64];  /* hex sha256 of this header with this field zeroed */
    char reserved[120];      /* zero */
};
static_assert(sizeof(struct ckpt_header) == 384, "checkpoint header is 384 bytes on disk");

struct qwenrt_checkpoint {
    struct ckpt_header hdr;
    uint8_t *payload; /* [hdr.payload_bytes] */
};

/* sha256 over the hyper-parameters that shape the state, the DeltaNet head order, and the
 * first CKPT_WEIGHT_SAMPLE bytes of the token embedding (so f32 and bf16 copies, or two
 * checkpoints of one geometry, are told apart). */
static void model_identity(const struct qwenrt_model *m, char out[SHA256_HEX_LEN])
{
    const struct model_hparams *hp = &m->hp;
    const struct qr_tensor *e = m->w.tok_embd;
    size_t sample = e->nbytes < CKPT_WEIGHT_SAMPLE ? e->nbytes : CKPT_WEIGHT_SAMPLE;
    char text[1024 + QR_MAX_LAYERS];
    int n =
        snprintf(text, sizeof(text),
                 "arch=%d vocab=%d embd=%d layer=%d ff=%d head=%d kv=%d hd=%d rot=%d theta=%.9g "
                 "eps=%.9g gated=%d conv=%d kh=%d vh=%d kd=%d vd=%d tiled=%d dtype=%d layers=",
                 hp->arch, hp->n_vocab, hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head,
                 hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_theta, hp->rms_eps,
                 hp->attn_gated, hp->ssm_conv, hp->ssm_n_k_heads, hp->ssm_n_v_heads, hp->ssm_k_dim,
                 hp->ssm_v_dim, m->v_head_tiled, e->dtype);
    for (int32_t l = 0; l < hp->n_layer && n < (int)sizeof(text) - 1; l++)
        text[n++] = hp->is_recurrent[l] ? 'R' : 'A';
    char h_text[SHA256_HEX_LEN], h_w[SHA256_HEX_LEN], both[2 * SHA256_HEX_LEN];
    sha256_hex(text, (size_t)n, h_text);
    sha256_hex(e->data, sample, h_w);
    memcpy(both, h_text, 64);
    memcpy(both + 64, h_w, 64);
    sha256_hex(both, 128, out);
}

static uint64_t payload_bytes(const struct ckpt_header *h, const struct model_hparams *hp)
{
    uint64_t floats = 0;
    for (int32_t l = 0; l < h->n_layer; l++)
        floats += hp->arch == ARCH_QWEN35 && hp->is_recurrent[l]
                      ? (uint64_t)h->conv_rows * (uint64_t)h->conv_dim + (uint64_t)h->ssm_len
                      : 2 * (uint64_t)h->n_past * (uint64_t)h->kv_width;
    if (h->has_logits)
        floats += (uint64_t)h->n_vocab;
    return floats * sizeof(float);
}

static void fill_header(struct ckpt_header *h, const struct qwenrt_session *s)
{
    const struct seq_state *st = &s->state;
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, CKPT_MAGIC, 8);
    h->version = CKPT_VERSION;
    h->header_bytes = sizeof(*h);
    h->arch = (uint32_t)s->model->hp.arch;
    h->n_layer = st->n_layer;
    h->n_embd = s->model->hp.n_embd;
    h->n_vocab = s->model->hp.n_vocab;
    h->kv_width = st->kv_width;
    h->conv_rows = st->conv_rows;
    h->conv_dim = st->conv_dim;
    h->n_ctx = st->n_ctx;
    h->ssm_len = st->ssm_len;
    h->n_past = s->n_past;
    h->has_logits = s->has_logits;
    h->payload_bytes = payload_bytes(h, &s->model->hp);
    char id[SHA256_HEX_LEN];
    model_identity(s->model, id);
    memcpy(h->model_hash, id, 64);
}

/* The state is in host memory (the CPU backend) or on the device (CUDA, copied through
 * cuda_session_state_io). */
static qwenrt_status check_host_state(const struct qwenrt_session *s, const char *what,
                                      struct qwenrt_error *err)
{
    const struct seq_state *st = &s->state;
    if (s->cuda)
        return QWENRT_OK;
    if (!st->k_cache || !st->v_cache || !st->conv_state || !st->ssm_state)
        return err_set(err, QWENRT_ERR_UNSUPPORTED,
                       "%s: the session's state is not in host memory (backend '%s'); checkpoints support the CPU backend",
                       what, s->model->backend);
    return QWENRT_OK;
}

/* copy_state for a CUDA session: the same payload layout, each part copied from or to the
 * device. */
static qwenrt_status copy_state_cuda(struct qwenrt_session *s, uint8_t *payload, bool to_payload,
                                     int32_t n_past, bool logits, struct qwenrt_error *err)
{
    const struct model_hparams *hp = &s->model->hp;
    struct seq_state *st = &s->state;
    uint8_t *p = payload;
    qwenrt_status rc = QWENRT_OK;
    for (int32_t l = 0; l < st->n_layer && !rc; l++) {
        bool rec = hp->arch == ARCH_QWEN35 && hp->is_recurrent[l];
        int64_t n0 = rec ? (int64_t)st->conv_rows * st->conv_dim : (int64_t)n_past * st->kv_width;
        int64_t n1 = rec ? st->ssm_len : (int64_t)n_past * st->kv_width;
        rc = cuda_session_state_io(s->cuda, l, rec ? CUDA_STATE_CONV : CUDA_STATE_K, n0,
                                   (float *)(void *)p, to_payload, err);
        p += (size_t)n0 * sizeof(float);
        if (!rc)
            rc = cuda_session_state_io(s->cuda, l, rec ? CUDA_STATE_SSM : CUDA_STATE_V, n1,
                                       (float *)(void *)p, to_payload, err);
        p += (size_t)n1 * sizeof(float);
    }
    if (!rc && logits) {
        size_t b = (size_t)hp->n_vocab * sizeof(float);
        if (to_payload)
            memcpy(p, s->last_logits, b);
        else
            memcpy(s->last_logits, p, b);
    }
    return rc;
}

/* Copies the state into (to_payload) or out of the payload, layer by layer. */
static void copy_state(struct qwenrt_session *s, uint8_t *payload, bool to_payload, int32_t n_past,
                       bool logits)
{
    struct seq_state *st = &s->state;
    uint8_t *p = payload;
#define COPY(ptr, n)                                                                               \
    do {                                                                                           \
        size_t b_ = (size_t)(n) * sizeof(float);                                                   \
        if (to_payload)                                                                            \
            memcpy(p, (ptr), b_);                                                                  \
        else                                                                                       \
            memcpy((ptr), p, b_);                                                                  \
        p += b_;                                                                                   \
    } while (0)
    for (int32_t l = 0; l < st->n_layer; l++) {
        if (st->ssm_state[l]) {
            COPY(st->conv_state[l], (size_t)st->conv_rows * st->conv_dim);
            COPY(st->ssm_state[l], (size_t)st->ssm_len);
        } else if (st->kv_f16) { /* the payload holds f32 either way */
            for (int v = 0; v < 2; v++) {
                uint16_t *c = v ? st->v_cache16[l] : st->k_cache16[l];
                float *f = (float *)(void *)p;
                for (size_t i = 0; i < (size_t)n_past * st->kv_width; i++) {
                    if (to_payload)
                        f[i] = f16_to_f32(c[i]);
                    else
                        c[i] = f32_to_f16(f[i]);
                }
                p += (size_t)n_past * st->kv_width * sizeof(float);
            }
        } else {
            COPY(st->k_cache[l], (size_t)n_past * st->kv_width);
            COPY(st->v_cache[l], (size_t)n_past * st->kv_width);
        }
    }
    if (logits)
        COPY(s->last_logits, (size_t)s->model->hp.n_vocab);
#undef COPY
}

qwenrt_status qwenrt_session_snapshot(const struct qwenrt_session *session,
                                      struct qwenrt_checkpoint **out, struct qwenrt_error *err)
{
    if (!out)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "session_snapshot: no output pointer");
    *out = NULL;
    if (!session)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "session_snapshot: no session");
    qwenrt_status st = check_host_state(session, "session_snapshot", err);
    if (st)
        return st;
    struct qwenrt_checkpoint *cp = xcalloc(1, sizeof(*cp));
    if (!cp)
        return err_set(err, QWENRT_ERR_NOMEM, "session_snapshot: out of memory");
    fill_header(&cp->hdr, session);
    cp->payload = xmalloc((size_t)cp->hdr.payload_bytes + 1, 1);
    if (!cp->payload) {
        unsigned long long bytes = (unsigned long long)cp->hdr.payload_bytes;
        xfree(cp);
        return err_set(err, QWENRT_ERR_NOMEM,
                       "session_snapshot: out of memory for %llu bytes of state", bytes);
    }
    /* copy_state only reads the session when to_payload is true; the logits of a CUDA session
     * may still be on the device */
    if (session->cuda && (st = session_fetch_logits((struct qwenrt_session *)session, err))) {
        xfree(cp->payload);
        xfree(cp);
        return st;
    }
    if (session->cuda) {
        qwenrt_status rc = copy_state_cuda((struct qwenrt_session *)session, cp->payload, true,
                                           session->n_past, session->has_logits, err);
        if (rc) {
            xfree(cp->payload);
            xfree(cp);
            return rc;
        }
    } else {
        copy_state((struct qwenrt_session *)session, cp->payload, true, session->n_past,
                   session->has_logits);
    }
    *out = cp;
    return QWENRT_OK;
}

/* Same model (identity hash) and room for the checkpoint's tokens in this session. */
static qwenrt_status check_fits(const struct ckpt_header *h, const struct qwenrt_model *m,
                                int32_t n_ctx, const char *what, struct qwenrt_error *err)
{
    char id[SHA256_HEX_LEN];
    model_identity(m, id);
    if (h->arch != (uint32_t)m->hp.arch || h->n_layer != m->hp.n_layer ||
        h->n_vocab != m->hp.n_vocab || h->n_embd != m->hp.n_embd ||
        memcmp(h->model_hash, id, 64) != 0)
        return err_set(
            err, QWENRT_ERR_INVALID_ARG,
            "%s: checkpoint is for another model (arch %s, %d layers, n_embd %d, n_vocab %d, "
            "identity %.12s), this model is %s, %d layers, n_embd %d, n_vocab %d, identity %.12s",
            what, h->arch <= ARCH_QWEN35 ? arch_name((enum qr_arch)h->arch) : "unknown", h->n_layer,
            h->n_embd, h->n_vocab, h->model_hash, arch_name(m->hp.arch), m->hp.n_layer,
            m->hp.n_embd, m->hp.n_vocab, id);
    if (n_ctx >= 0 && h->n_past > n_ctx)
        return err_set(err, QWENRT_ERR_LIMIT,
                       "%s: checkpoint holds %d tokens, the session's context holds only %d", what,
                       h->n_past, n_ctx);
    return QWENRT_OK;
}

qwenrt_status qwenrt_session_restore(struct qwenrt_session *session,
                                     const struct qwenrt_checkpoint *cp, struct qwenrt_error *err)
{
    if (!session || !cp)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "session_restore: no %s",
                       session ? "checkpoint" : "session");
    const struct ckpt_header *h = &cp->hdr;
    qwenrt_status st = check_host_state(session, "session_restore", err);
    if (!st)
        st = check_fits(h, session->model, session->state.n_ctx, "session_restore", err);
    if (st)
        return st;
    if (h->kv_width != session->state.kv_width || h->conv_rows != session->state.conv_rows ||
        h->conv_dim != session->state.conv_dim || h->ssm_len != session->state.ssm_len ||
        h->payload_bytes != payload_bytes(h, &session->model->hp))
        return err_set(err, QWENRT_ERR_INTERNAL,
                       "session_restore: checkpoint geometry disagrees with the session");
    if (session->cuda) { /* a failed device copy leaves the session reset, not half-restored */
        st = copy_state_cuda(session, cp->payload, false, h->n_past, h->has_logits, err);
        if (st) {
            qwenrt_session_reset(session);
            return st;
        }
    } else {
        copy_state(session, cp->payload, false, h->n_past, h->has_logits);
    }
    session->n_past = h->n_past;
    session->has_logits = h->has_logits != 0;
    session->logits_on_device = false;
    return QWENRT_OK;
}

int32_t qwenrt_checkpoint_n_past(const struct qwenrt_checkpoint *cp)
{
    return cp ? cp->hdr.n_past : 0;
}

uint64_t qwenrt_checkpoint_bytes(const struct qwenrt_checkpoint *cp)
{
    return cp ? sizeof(cp->hdr) + cp->hdr.payload_bytes : 0;
}

void qwenrt_checkpoint_free(struct qwenrt_checkpoint *cp)
{
    if (!cp)
        return;
    xfree(cp->payload);
    xfree(cp);
}

static void header_hash(const struct ckpt_header *h, char out[SHA256_HEX_LEN])
{
    struct ckpt_header c = *h;
    memset(c.header_sha256, 0, sizeof(c.header_sha256));
    sha256_hex(&c, sizeof(c), out);
}

qwenrt_status qwenrt_checkpoint_save(const struct qwenrt_checkpoint *cp, const char *path,
                                     struct qwenrt_error *err)
{
    if (!cp || !path)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "checkpoint_save: no %s",
                       cp ? "path" : "checkpoint");
    struct ckpt_header h = cp->hdr;
    char hex[SHA256_HEX_LEN];
    sha256_hex(cp->payload, (size_t)h.payload_bytes, hex);
    memcpy(h.payload_sha256, hex, 64);
    header_hash(&h, hex);
    memcpy(h.header_sha256, hex, 64);
    size_t n = strlen(path) + 32;
    char *tmp = xmalloc(n, 1);
    if (!tmp)
        return err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    qwenrt_status st = QWENRT_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = err_set(err, QWENRT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out_free_tmp;
    }
    bool ok = fwrite(&h, sizeof(h), 1, f) == 1 &&
              (h.payload_bytes == 0 || fwrite(cp->payload, (size_t)h.payload_bytes, 1, f) == 1) &&
              fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (!ok || rename(tmp, path) != 0) {
        if (ok)
            saved = errno;
        st = err_set(err, QWENRT_ERR_IO, "%s: cannot write the checkpoint: %s", path,
                     strerror(saved));
        remove(tmp);
    }
out_free_tmp:
    xfree(tmp);
    return st;
}

/* Reads the whole file; *len its size. */
static qwenrt_status read_file(const char *path, uint8_t **data, size_t *len,
                               struct qwenrt_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    qwenrt_status st = QWENRT_OK;
    long size = -1;
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st =
            err_set(err, QWENRT_ERR_IO, "%s: cannot find the file size: %s", path, strerror(errno));
        goto out_close;
    }
    *data = xmalloc((size_t)size + 1, 1);
    if (!*data) {
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory for %ld bytes", path, size);
        goto out_close;
    }
    if (size > 0 && fread(*data, (size_t)size, 1, f) != 1) {
        st = err_set(err, QWENRT_ERR_IO, "%s: read failed", path);
        xfree(*data);
        *data = NULL;
        goto out_close;
    }
    *len = (size_t)size;
out_close:
    fclose(f);
    return st;
}

static qwenrt_status check_header(const uint8_t *data, size_t len, const struct qwenrt_model *m,
                                  const char *path, struct qwenrt_error *err)
{
    struct ckpt_header h;
    if (len < sizeof(h))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: truncated checkpoint: %zu bytes, the header alone is %zu", path, len,
                       sizeof(h));
    memcpy(&h, data, sizeof(h));
    if (memcmp(h.magic, CKPT_MAGIC, 8) != 0)
        return err_set(err, QWENRT_ERR_FORMAT, "%s: not a qwenrt checkpoint (magic is not '%s')",
                       path, CKPT_MAGIC);
    if (h.version != CKPT_VERSION || h.header_bytes != sizeof(h))
        return err_set(
            err, QWENRT_ERR_UNSUPPORTED,
            "%s: checkpoint version %u (header %u bytes), this qwenrt reads version %u (%zu bytes)",
            path, h.version, h.header_bytes, CKPT_VERSION, sizeof(h));
    char hex[SHA256_HEX_LEN];
    header_hash(&h, hex);
    if (memcmp(hex, h.header_sha256, 64) != 0)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: checkpoint header is corrupted (its checksum does not match)", path);
    qwenrt_status st = check_fits(&h, m, -1, path, err);
    if (st)
        return st;
    if (h.n_past < 0 || h.kv_width != m->hp.n_head_kv * m->hp.head_dim ||
        h.payload_bytes != payload_bytes(&h, &m->hp))
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: checkpoint header is inconsistent (n_past %d, payload %llu bytes)",
                       path, h.n_past, (unsigned long long)h.payload_bytes);
    if (len - sizeof(h) != h.payload_bytes)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: %s checkpoint: %zu bytes of state, the header promises %llu", path,
                       len - sizeof(h) < h.payload_bytes ? "truncated" : "oversized",
                       len - sizeof(h), (unsigned long long)h.payload_bytes);
    sha256_hex(data + sizeof(h), (size_t)h.payload_bytes, hex);
    if (memcmp(hex, h.payload_sha256, 64) != 0)
        return err_set(err, QWENRT_ERR_FORMAT,
                       "%s: checkpoint state is corrupted (sha256 %.12s, header says %.12s)", path,
                       hex, h.payload_sha256);
    return QWENRT_OK;
}

qwenrt_status qwenrt_checkpoint_load(const struct qwenrt_model *model, const char *path,
                                     struct qwenrt_checkpoint **out, struct qwenrt_error *err)
{
    if (!out)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "checkpoint_load: no output pointer");
    *out = NULL;
    if (!model || !path)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "checkpoint_load: no %s",
                       model ? "path" : "model");
    uint8_t *data = NULL;
    size_t len = 0;
    qwenrt_status st = read_file(path, &data, &len, err);
    if (st)
        return st;
    st = check_header(data, len, model, path, err);
    if (st)
        goto out_free_data;
    struct qwenrt_checkpoint *cp = xcalloc(1, sizeof(*cp));
    if (!cp) {
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
        goto out_free_data;
    }
    memcpy(&cp->hdr, data, sizeof(cp->hdr));
    memmove(data, data + sizeof(cp->hdr), (size_t)cp->hdr.payload_bytes); /* the file buffer */
    cp->payload = data;                                                   /* becomes the payload */
    data = NULL;
    *out = cp;
out_free_data:
    xfree(data);
    return st;
}
