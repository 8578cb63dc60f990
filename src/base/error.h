/*
 * error.h — filling struct qwenrt_error from inside the library.
 *
 * err_set formats a one-line message into the caller's error record (which may be NULL) and
 * returns the status, so a failure path reads `return err_set(err, QWENRT_ERR_FORMAT, ...)`.
 * Messages name the file, tensor or key and give expected against actual.
 */
#ifndef QWENRT_BASE_ERROR_H
#define QWENRT_BASE_ERROR_H

#include "qwenrt.h"

#if defined(__GNUC__)
#define QR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define QR_PRINTF(a, b)
#endif

qwenrt_status err_set(struct qwenrt_error *err, qwenrt_status status, const char *fmt, ...)
    QR_PRINTF(3, 4);

/* Prefixes an existing message with context ("loading x.gguf: " + old message). */
qwenrt_status err_prefix(struct qwenrt_error *err, const char *fmt, ...) QR_PRINTF(2, 3);

/* Clears an error record (status OK, empty message). */
void err_clear(struct qwenrt_error *err);

#endif
