/*
 * meminfo.h — how much memory this machine can give, so that a model or a session that cannot
 * fit is refused with numbers (QWENRT_ERR_LIMIT) before anything is allocated, instead of being
 * killed by the kernel's OOM killer later (Linux overcommits: a huge calloc "succeeds").
 *
 * Available memory is MemAvailable from /proc/meminfo (free memory plus the page cache and
 * slab the kernel can reclaim), else free pages from sysconf; total is physical RAM.
 * The override is test instrumentation (per thread, like alloc_fault_after), not library state.
 */
#ifndef QWENRT_BASE_MEMINFO_H
#define QWENRT_BASE_MEMINFO_H

#include <stdint.h>

#include "qwenrt.h"

/* Bytes a new allocation can use without swapping; 0 when it cannot be found out. */
uint64_t mem_available_bytes(void);
/* Bytes of physical memory; 0 when unknown. */
uint64_t mem_total_bytes(void);

/* QWENRT_OK when `need` bytes fit in available memory (or it is unknown); otherwise LIMIT with
 * "<what> needs X GiB, only Y GiB of memory is available<hint>". */
qwenrt_status mem_check_available(uint64_t need, const char *what, const char *hint,
                                  struct qwenrt_error *err);

/* Test hook: pretend `bytes` are available and installed (0 = ask the system). Per thread. */
void mem_override(uint64_t bytes);

#endif
