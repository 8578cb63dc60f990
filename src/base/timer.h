/*
 * timer.h — monotonic wall-clock time in seconds, for benchmarks and progress output.
 */
#ifndef QWENRT_BASE_TIMER_H
#define QWENRT_BASE_TIMER_H

#include <time.h>

static inline double time_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
