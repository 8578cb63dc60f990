/*
 * sha256.c — SHA-256 via OpenSSL's EVP interface (see sha256.h).
 */
#include "base/sha256.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

static void to_hex(const unsigned char *md, char out[SHA256_HEX_LEN])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = digits[md[i] >> 4];
        out[2 * i + 1] = digits[md[i] & 15];
    }
    out[64] = '\0';
}

void sha256_hex(const void *data, size_t len, char out[SHA256_HEX_LEN])
{
    unsigned char md[32];
    unsigned int n = 0;
    EVP_Digest(data, len, md, &n, EVP_sha256(), NULL);
    to_hex(md, out);
}

qwenrt_status sha256_file_hex(const char *path, char out[SHA256_HEX_LEN], struct qwenrt_error *err)
{
    qwenrt_status st = QWENRT_OK;
    FILE *f = fopen(path, "rb");
    if (!f)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx) {
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: cannot create a digest context", path);
        goto out_close;
    }
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        EVP_DigestUpdate(ctx, buf, n);
    if (ferror(f)) {
        st = err_set(err, QWENRT_ERR_IO, "%s: read error", path);
        goto out_free;
    }
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, md, &len);
    to_hex(md, out);
out_free:
    EVP_MD_CTX_free(ctx);
out_close:
    fclose(f);
    return st;
}
