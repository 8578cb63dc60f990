/*
 * mapfile.h — read-only memory mapping of a whole file (model weights are views into it).
 */
#ifndef QWENRT_BASE_MAPFILE_H
#define QWENRT_BASE_MAPFILE_H

#include <stddef.h>
#include <stdint.h>

#include "qwenrt.h"

struct mapped_file {
    char *path;          /* owned copy of the path, for messages */
    const uint8_t *data; /* mapping of the whole file, NULL when empty */
    size_t size;         /* bytes */
};

/* Maps path read-only. Errors: IO (cannot open/stat/map), FORMAT (not a regular file). */
qwenrt_status mapfile_open(struct mapped_file *mf, const char *path, struct qwenrt_error *err);
void mapfile_close(struct mapped_file *mf);

/* Reads a whole (small) file into a NUL-terminated heap buffer. */
qwenrt_status file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len,
                            struct qwenrt_error *err);

#endif
