/* A host clock that is off, for the tests: preloaded into a process (LD_PRELOAD), it adds
 * CLOCK_SHIFT_S seconds to every CLOCK_REALTIME reading made through clock_gettime(), which is
 * how Python reads the wall clock (time.time(), datetime.now()). Nothing else changes: the
 * monotonic clock, sleeps and the timed waits of librdkafka's threads (which read the real
 * time through gettimeofday()) stay true, as they do on a host whose clock is merely set wrong.
 * libfaketime shifts those too, and librdkafka's client creation then hangs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static long long shift_ns(void)
{
    static long long shift;
    static int read;
    if (!read) {
        const char *s = getenv("CLOCK_SHIFT_S");
        shift = s ? atoll(s) * 1000000000LL : 0;
        read = 1;
    }
    return shift;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns();
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return r;
}
