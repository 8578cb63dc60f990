/*
 * meminfo.c — available and total memory for the limits checks (see meminfo.h).
 * Called by session init (state size) and model load (mapped weights); not on hot paths.
 */
#include "base/meminfo.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"

static _Thread_local uint64_t override_bytes; /* test hook, per thread; 0 = none */

void mem_override(uint64_t bytes) { override_bytes = bytes; }

uint64_t mem_available_bytes(void)
{
    if (override_bytes)
        return override_bytes;
    uint64_t kib = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[128];
        unsigned long long v;
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
                kib = v;
                break;
            }
        fclose(f);
    }
    if (kib)
        return kib * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

uint64_t mem_total_bytes(void)
{
    if (override_bytes)
        return override_bytes;
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

qwenrt_status mem_check_available(uint64_t need, const char *what, const char *hint,
                                  struct qwenrt_error *err)
{
    uint64_t avail = mem_available_bytes();
    if (!avail || need <= avail)
        return QWENRT_OK;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    return err_set(err, QWENRT_ERR_LIMIT, "%s needs %.2f GiB, only %.2f GiB of memory is available%s",
                   what, (double)need / gib, (double)avail / gib, hint ? hint : "");
}
