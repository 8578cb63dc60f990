/*
 * mapfile.c — mmap of model files and whole-file reads of small text files (see mapfile.h).
 */
#include "base/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"

qwenrt_status mapfile_open(struct mapped_file *mf, const char *path, struct qwenrt_error *err)
{
    qwenrt_status st = QWENRT_OK;
    memset(mf, 0, sizeof(*mf));
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = err_set(err, QWENRT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto out_close;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = err_set(err, QWENRT_ERR_FORMAT, "%s: not a regular file", path);
        goto out_close;
    }
    mf->size = (size_t)sb.st_size;
    if (mf->size > 0) {
        void *p = mmap(NULL, mf->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            st = err_set(err, QWENRT_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
            goto out_close;
        }
        mf->data = p;
    }
    mf->path = xstrdup(path);
    if (!mf->path) {
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
        if (mf->data)
            munmap((void *)mf->data, mf->size);
        mf->data = NULL;
    }
out_close:
    close(fd);
    return st;
}

void mapfile_close(struct mapped_file *mf)
{
    if (!mf)
        return;
    if (mf->data)
        munmap((void *)mf->data, mf->size);
    xfree(mf->path);
    memset(mf, 0, sizeof(*mf));
}

qwenrt_status file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len,
                            struct qwenrt_error *err)
{
    qwenrt_status st = QWENRT_OK;
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return err_set(err, QWENRT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = xmalloc(cap, 1);
    while (buf) {
        if (len + 1 >= cap) {
            if (cap > max_bytes) {
                st = err_set(err, QWENRT_ERR_LIMIT, "%s: larger than %zu bytes", path, max_bytes);
                goto out_free;
            }
            char *nb = xrealloc(buf, cap * 2, 1);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - 1 - len, f);
        len += n;
        if (n == 0)
            break;
    }
    if (!buf) {
        st = err_set(err, QWENRT_ERR_NOMEM, "%s: out of memory", path);
        goto out_close;
    }
    if (ferror(f)) {
        st = err_set(err, QWENRT_ERR_IO, "%s: read error", path);
        goto out_free;
    }
    buf[len] = '\0';
    *out = buf;
    if (out_len)
        *out_len = len;
    goto out_close;
out_free:
    xfree(buf);
out_close:
    fclose(f);
    return st;
}
