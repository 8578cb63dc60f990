/*
 * fuzz_util.h — helpers shared by the libFuzzer targets in tests/fuzz/ (header-only).
 *
 * The readers under test take a path (they memory-map or read whole files), so each input is
 * written to one scratch file per process under $TMPDIR (default /tmp) and the reader opens
 * that. Harness state lives in statics: a fuzz target is a test program, not library code.
 * fuzz_check() aborts on a broken invariant so libFuzzer records the input as a crash.
 */
#ifndef QWENRT_TESTS_FUZZ_UTIL_H
#define QWENRT_TESTS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define fuzz_check(cond)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);       \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

/* Keeps a value alive so that reads of it are not optimised away. */
static volatile uint64_t fuzz_sink;

/* A private scratch directory, made once per process. */
static inline const char *fuzz_dir(void)
{
    static char dir[256];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof(dir), "%s/qwenrt-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
    }
    return dir;
}

/* Writes data to <fuzz_dir>/name (replacing it) and returns the path (static storage). */
static inline const char *fuzz_write(const char *name, const uint8_t *data, size_t size)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror("fuzz: write scratch file");
        abort();
    }
    return path;
}

/* A NUL-terminated heap copy of the input (free with free()). */
static inline char *fuzz_strdup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

#endif
