/*
 * alloc.h — the library's allocation wrappers.
 *
 * Every allocation goes through these so that count x size overflow is checked in one place
 * and a test can make the Nth allocation fail (struct qr_alloc_fault, per thread; it is test
 * instrumentation, not library state). xcalloc zeroes; xalloc_aligned returns 64-byte aligned
 * memory freed with xfree like the rest.
 */
#ifndef QWENRT_BASE_ALLOC_H
#define QWENRT_BASE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

void *xmalloc(size_t count, size_t size);   /* NULL on overflow or failure */
void *xcalloc(size_t count, size_t size);   /* zeroed; NULL on overflow or failure */
void *xrealloc(void *p, size_t count, size_t size);
void *xalloc_aligned(size_t count, size_t size); /* 64-byte aligned, zeroed */
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
void xfree(void *p);

/* true when a*b overflows size_t; otherwise *out = a*b. */
bool size_mul_overflows(size_t a, size_t b, size_t *out);

/* Test hook: fail the allocation after `countdown` more succeed (-1 = never). Per thread. */
void alloc_fault_after(int64_t countdown);

#endif
