/*
 * alloc.c — allocation wrappers with overflow checks and a per-thread fault-injection countdown
 * used by tests (see alloc.h). The countdown is thread-local test instrumentation; with the
 * default of -1 it never fires.
 */
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

static _Thread_local int64_t fault_countdown = -1;

void alloc_fault_after(int64_t countdown) { fault_countdown = countdown; }

static bool fault_fires(void)
{
    if (fault_countdown < 0)
        return false;
    if (fault_countdown == 0)
        return true;
    fault_countdown--;
    return false;
}

bool size_mul_overflows(size_t a, size_t b, size_t *out)
{
    if (b && a > SIZE_MAX / b)
        return true;
    *out = a * b;
    return false;
}

void *xmalloc(size_t count, size_t size)
{
    size_t n;
    if (size_mul_overflows(count, size, &n) || fault_fires())
        return NULL;
    return malloc(n ? n : 1);
}

void *xcalloc(size_t count, size_t size)
{
    size_t n;
    if (size_mul_overflows(count, size, &n) || fault_fires())
        return NULL;
    return calloc(n ? n : 1, 1);
}

void *xrealloc(void *p, size_t count, size_t size)
{
    size_t n;
    if (size_mul_overflows(count, size, &n) || fault_fires())
        return NULL;
    return realloc(p, n ? n : 1);
}

void *xalloc_aligned(size_t count, size_t size)
{
    size_t n;
    if (size_mul_overflows(count, size, &n) || n > SIZE_MAX - 64 || fault_fires())
        return NULL;
    n = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p)
        memset(p, 0, n);
    return p;
}

char *xstrndup(const char *s, size_t n)
{
    char *d = xmalloc(n + 1, 1);
    if (!d)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *xstrdup(const char *s) { return xstrndup(s, strlen(s)); }

void xfree(void *p) { free(p); }
