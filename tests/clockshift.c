/* A host clock that is off, for the tests: preloaded into a process (LD_PRELOAD), it adds
 * CLOCK_SHIFT_S seconds to every CLOCK_REALTIME reading made through clock_gettime(), which is
 * how Python reads the wall clock (time.time(), datetime.now()). Nothing else changes: the
 * monotonic clock, sleeps and the timed waits of librdkafka's threads (which read the real
 * time through gettimeofday()) stay true, as they do on a host whose clock is merely set wrong.
 * libfaketime shifts those too, and librdkafka's client creation then hangs.
 * With CLOCK_SHIFT_FILE set instead, the shift is the number of seconds in that file, read
 * again every 100 ms: a test steps the clock of a running process by writing the file. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long long shift_from_file(const char *path, clockid_t mono,
                                 int (*real)(clockid_t, struct timespec *))
{
    /* CLOCK_SHIFT_FILE: the shift is the number in that file, looked at again every 100 ms
     * (of the true monotonic clock), so a test can step the clock of a running process. */
    static long long shift, next_look;
    struct timespec now;
    real(mono, &now);
    long long now_ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    if (now_ns >= next_look) {
        char buf[32] = {0};
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            ssize_t n = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (n > 0)
                shift = atoll(buf) * 1000000000LL;
        }
        next_look = now_ns + 100000000LL;
    }
    return shift;
}

static long long shift_ns(int (*real)(clockid_t, struct timespec *))
{
    static long long shift;
    static int read_env;
    static const char *file;
    if (!read_env) {
        const char *s = getenv("CLOCK_SHIFT_S");
        shift = s ? atoll(s) * 1000000000LL : 0;
        file = getenv("CLOCK_SHIFT_FILE");
        read_env = 1;
    }
    return file ? shift_from_file(file, CLOCK_MONOTONIC, real) : shift;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns(real);
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return r;
}
