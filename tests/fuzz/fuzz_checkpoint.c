/*
 * fuzz_checkpoint.c — libFuzzer target for checkpoint files (qwenrt_checkpoint_load, then
 * qwenrt_session_restore and one decode step when a file is accepted), with the tiny Qwen3.5
 * fixture (tests/data/qwen35-tiny-f32: DeltaNet and attention layers).
 *
 * A checkpoint header carries sha256 sums of itself and of the payload, so random bytes stop
 * at the checksum. Inputs that do not start with "QW" (the magic's start) are therefore
 * "structured": two bytes set the payload length (0x00 0x80: the template's), the rest are
 * XORed into the header fields (version .. payload_bytes, offsets 8..72 of the 384-byte header)
 * of a real checkpoint made at start-up, and the harness recomputes both checksums, as an
 * attacker could. Inputs starting with "QW" are taken as raw files.
 * The header offsets used here are checked against the real checkpoint at start-up.
 */
#include "fuzz_util.h"

#include "base/sha256.h"
#include "qwenrt.h"

#define MODEL_DIR "tests/data/qwen35-tiny-f32"
#define HDR_BYTES 384
#define OFF_FIELDS 8          /* version: first field after the magic */
#define OFF_FIELDS_END 72     /* end of payload_bytes */
#define OFF_PAYLOAD_SHA 136   /* payload_sha256[64] */
#define OFF_HEADER_SHA 200    /* header_sha256[64] */

static struct qwenrt_model *model;
static uint8_t *tpl; /* a valid checkpoint file */
static size_t tpl_len;

static void fix_header_hash(uint8_t *h)
{
    char hex[SHA256_HEX_LEN];
    memset(h + OFF_HEADER_SHA, 0, 64);
    sha256_hex(h, HDR_BYTES, hex);
    memcpy(h + OFF_HEADER_SHA, hex, 64);
}

static void make_template(void)
{
    struct qwenrt_error err = {0};
    struct qwenrt_model_params mp = qwenrt_model_default_params();
    mp.n_threads = 1;
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = 16;
    struct qwenrt_session *s = NULL;
    struct qwenrt_checkpoint *cp = NULL;
    static const int32_t ids[3] = {5, 17, 300};
    if (qwenrt_model_load(MODEL_DIR, &mp, &model, &err) ||
        qwenrt_session_init(model, &sp, &s, &err) ||
        qwenrt_session_prefill(s, ids, 3, NULL, &err) ||
        qwenrt_session_snapshot(s, &cp, &err) ||
        qwenrt_checkpoint_save(cp, fuzz_write("tpl.ckpt", NULL, 0), &err)) {
        fprintf(stderr, "fuzz_checkpoint: %s (run from the repository root)\n", err.message);
        abort();
    }
    qwenrt_checkpoint_free(cp);
    qwenrt_session_free(s);
    char path[512];
    snprintf(path, sizeof(path), "%s/tpl.ckpt", fuzz_dir());
    FILE *f = fopen(path, "rb");
    fuzz_check(f && fseek(f, 0, SEEK_END) == 0);
    tpl_len = (size_t)ftell(f);
    rewind(f);
    tpl = malloc(tpl_len);
    fuzz_check(tpl && fread(tpl, 1, tpl_len, f) == tpl_len);
    fclose(f);
    /* the offsets above describe this qwenrt's header */
    uint8_t h[HDR_BYTES];
    memcpy(h, tpl, HDR_BYTES);
    fix_header_hash(h);
    fuzz_check(memcmp(h, tpl, HDR_BYTES) == 0);
    uint64_t pb;
    memcpy(&pb, tpl + 64, 8);
    fuzz_check(pb == tpl_len - HDR_BYTES);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    make_template();
    return 0;
}

/* A header mutated by the input, the template payload cut or zero-extended, valid sums. */
static uint8_t *structured(const uint8_t *data, size_t size, size_t *out_len)
{
    size_t n_field = OFF_FIELDS_END - OFF_FIELDS;
    size_t plen = tpl_len - HDR_BYTES;
    if (size >= 2) {
        /* length: the template's, or a cut / extension of up to 32 KiB when the bits say so */
        int delta = ((int)data[0] | (int)data[1] << 8) - 32768;
        plen = (size_t)((long)plen + delta < 0 ? 0 : (long)plen + delta);
        data += 2, size -= 2;
    }
    uint8_t *buf = calloc(1, HDR_BYTES + plen);
    fuzz_check(buf);
    memcpy(buf, tpl, HDR_BYTES);
    size_t copy = plen < tpl_len - HDR_BYTES ? plen : tpl_len - HDR_BYTES;
    memcpy(buf + HDR_BYTES, tpl + HDR_BYTES, copy);
    for (size_t i = 0; i < n_field && i < size; i++)
        buf[OFF_FIELDS + i] ^= data[i];
    char hex[SHA256_HEX_LEN];
    sha256_hex(buf + HDR_BYTES, plen, hex);
    memcpy(buf + OFF_PAYLOAD_SHA, hex, 64);
    fix_header_hash(buf);
    *out_len = HDR_BYTES + plen;
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path;
    if (size < 2 || data[0] != 'Q' || data[1] != 'W') {
        size_t len;
        uint8_t *buf = structured(data, size, &len);
        path = fuzz_write("in.ckpt", buf, len);
        free(buf);
    } else {
        path = fuzz_write("in.ckpt", data, size);
    }
    struct qwenrt_error err = {0};
    struct qwenrt_checkpoint *cp = NULL;
    if (qwenrt_checkpoint_load(model, path, &cp, &err) != QWENRT_OK) {
        if (getenv("FUZZ_VERBOSE"))
            fprintf(stderr, "load: %s\n", err.message);
        fuzz_check(cp == NULL);
        return 0;
    }
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = 1 + (size > 1 ? data[size - 1] % 24 : 8);
    sp.n_threads = 1;
    struct qwenrt_session *s = NULL;
    if (qwenrt_session_init(model, &sp, &s, &err) == QWENRT_OK) {
        qwenrt_status st = qwenrt_session_restore(s, cp, &err);
        if (getenv("FUZZ_VERBOSE"))
            fprintf(stderr, "restore: %s\n", st ? err.message : "ok");
        if (st == QWENRT_OK) {
            fuzz_check(qwenrt_session_n_past(s) == qwenrt_checkpoint_n_past(cp));
            (void)qwenrt_session_decode(s, 7, &err);
        }
        qwenrt_session_free(s);
    }
    qwenrt_checkpoint_free(cp);
    return 0;
}
