/*
 * sha256.h — SHA-256 of memory and files (OpenSSL libcrypto), as lower-case hex.
 */
#ifndef QWENRT_BASE_SHA256_H
#define QWENRT_BASE_SHA256_H

#include <stddef.h>

#include "qwenrt.h"

#define SHA256_HEX_LEN 65 /* 64 hex digits + NUL */

void sha256_hex(const void *data, size_t len, char out[SHA256_HEX_LEN]);
qwenrt_status sha256_file_hex(const char *path, char out[SHA256_HEX_LEN], struct qwenrt_error *err);

#endif
