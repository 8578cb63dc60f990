/*
 * error.c — error records and status names (see error.h).
 */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

qwenrt_status err_set(struct qwenrt_error *err, qwenrt_status status, const char *fmt, ...)
{
    if (!err)
        return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    err->status = status;
    return status;
}

qwenrt_status err_prefix(struct qwenrt_error *err, const char *fmt, ...)
{
    if (!err)
        return QWENRT_ERR_INTERNAL;
    char prefix[256], old[sizeof(err->message)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, err->message, sizeof(old));
    size_t pl = strlen(prefix), room = sizeof(err->message) - 1;
    if (pl > room)
        pl = room;
    memcpy(err->message, prefix, pl);
    size_t ol = strnlen(old, room - pl);
    memcpy(err->message + pl, old, ol);
    err->message[pl + ol] = '\0';
    return err->status;
}

void err_clear(struct qwenrt_error *err)
{
    if (!err)
        return;
    err->status = QWENRT_OK;
    err->message[0] = '\0';
}

const char *qwenrt_status_name(qwenrt_status status)
{
    switch (status) {
    case QWENRT_OK: return "ok";
    case QWENRT_ERR_INVALID_ARG: return "invalid argument";
    case QWENRT_ERR_IO: return "i/o error";
    case QWENRT_ERR_FORMAT: return "format error";
    case QWENRT_ERR_UNSUPPORTED: return "unsupported";
    case QWENRT_ERR_NOT_FOUND: return "not found";
    case QWENRT_ERR_SHAPE: return "shape error";
    case QWENRT_ERR_NOMEM: return "out of memory";
    case QWENRT_ERR_LIMIT: return "limit reached";
    case QWENRT_ERR_BACKEND: return "backend error";
    case QWENRT_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}
